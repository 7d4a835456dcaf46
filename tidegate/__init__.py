"""The tools around the gateway, apart from it: the `tidegate` command line (cli/), the offline
tools (offline/: the planner, replay, synth, probe, the parity runner) and the upstream
simulator (sim/). They import the gateway (`router`) where they drive or measure it; the gateway
never imports them (pyproject.toml's import contracts)."""
