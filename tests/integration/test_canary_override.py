"""A live canary percent outlives a restart (it is in Redis) and wins over the file: `serve`
says so when it starts, `canary status` and `canary set` show it, and `canary reset` returns
every replica to the file's `canary_percent`."""

from __future__ import annotations

from pathlib import Path

from tests.servers import CliProcess, run_cli, wait_until

ADMIN = ("--admin-key", "adm")
OVERRIDE = "the live canary percent 35% overrides canary_percent 10 in the config file"


def write_config(path: Path, redis_url: str) -> Path:
    path.write_text(
        f"state: {{redis_url: '{redis_url}'}}\n"
        "auth: {allow_anonymous: true, admin_key: adm}\n"
        "models:\n  m:\n    canary_percent: 10\n    canary: {steps: [50, 100]}\n"
        "    dedicated: [{name: d, gpu_hour_usd: 0, base_url: 'http://127.0.0.1:1/v1', model: x, max_concurrency: 2}]\n"
        "    serverless: [{name: s, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: 'http://127.0.0.1:2/v1', model: y}]\n"
    )
    return path


def test_a_live_canary_outlives_a_restart_is_said_and_reset_returns_to_the_file(tmp_path, redis_url):
    config = write_config(tmp_path / "c.yaml", redis_url)
    with CliProcess("serve", "--config", str(config), "--port", "0") as first:
        assert OVERRIDE not in "".join(first.output)
        set_live = run_cli("canary", "set", "m", "35", "--url", first.root, *ADMIN)
    assert set_live.returncode == 0, set_live.stderr
    assert "canary 35% (configured 10%)" in set_live.stdout
    assert "`tidegate canary reset m` returns to the file's" in set_live.stdout
    with CliProcess("serve", "--config", str(config), "--port", "0") as second:
        wait_until(lambda: OVERRIDE in "".join(second.output), timeout=10)
        status = run_cli("canary", "status", "m", "--url", second.root, *ADMIN)
        stats = run_cli("stats", "--url", second.root, *ADMIN)
        reset = run_cli("canary", "reset", "m", "--url", second.root, *ADMIN)
        after = run_cli("canary", "status", "m", "--url", second.root, *ADMIN)
    assert status.returncode == 0, status.stderr
    assert "live canary 35% overrides the file's canary_percent 10%" in status.stdout
    assert "canary 35% (live; the file says 10%" in stats.stdout
    assert reset.returncode == 0, reset.stderr
    assert "m: canary 10% (the file's canary_percent; no live percent)" in reset.stdout
    assert "overrides" not in after.stdout and "at 10%" in after.stdout
    with CliProcess("serve", "--config", str(config), "--port", "0") as third:
        final = run_cli("canary", "status", "m", "--url", third.root, *ADMIN)
    assert OVERRIDE not in "".join(third.output)
    assert "overrides" not in final.stdout
