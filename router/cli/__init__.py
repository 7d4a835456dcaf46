"""The `tidegate` command (main.py) and what only it uses: serving.py (uvicorn, workers),
stats.py (the routes report as tables), admin_client.py (the admin API from the shell)."""
