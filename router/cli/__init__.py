"""The gateway's commands (serve and check-config in gateway.py, keys, canary, stats, report)
and what only they use: serving.py (uvicorn, workers), admin_client.py (the admin API from the
shell), watch.py. The `tidegate` command that lists them is tidegate/cli/main.py."""
