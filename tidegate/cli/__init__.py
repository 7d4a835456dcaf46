"""The `tidegate` command (main.py) and its offline commands: plan, replay, trace, probe,
parity, sim, demo. The gateway's own commands (serve, check-config, keys, canary, stats,
report) live in router/cli/; main.py lists them all."""
