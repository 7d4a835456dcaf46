"""Gateway work per request as instructions counted by valgrind's callgrind: this tree against an
earlier one, side by side, with no noise from the machine.

`bench.overhead` measures CPU time, which on a shared 2-core machine moves ±25% between runs of
the same tree; a 10% regression hides in that. Callgrind counts the instructions the gateway
process executes (Python, uvloop, httptools, the C libraries alike), so two trees serving the
same requests compare exactly, on a loaded machine as on a quiet one. It is slow (about 50x), so
it counts a few hundred requests, after a warm-up that is not counted.

    python -m bench.instructions --before /tmp/before [--after DIR] [--requests 300] [--concurrency 1 16]
                                 [--paths plain stream] [--top 25]

Each gateway is `tidegate serve` (memory store, one worker, access log on) under
`valgrind --tool=callgrind --instr-atstart=no` against nginx (bench/nginx_upstream.py);
instrumentation is switched on for the counted requests only (`callgrind_control -i on`). Prints
instructions per request per (path, concurrency, tree) and the ratio; with `--top`, the
functions whose inclusive count per request differs most between the trees (callgrind_annotate).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import aiohttp
import orjson

from bench.loadgen import free_port, wait_for
from bench.nginx_upstream import start_nginx

CONF = """
listen: {{host: 127.0.0.1, port: {port}}}
auth: {{allow_anonymous: true}}
models:
  plain:
    dedicated: [{{name: nginx-plain, gpu_hour_usd: 0, base_url: "http://127.0.0.1:{up}/plain/v1", model: bench, max_concurrency: 100000}}]
  stream:
    dedicated: [{{name: nginx-stream, gpu_hour_usd: 0, base_url: "http://127.0.0.1:{up}/stream/v1", model: bench, max_concurrency: 100000}}]
"""
WARM_UP = 100


async def send(url: str, path: str, count: int, concurrency: int) -> int:
    """`count` requests from `concurrency` clients; the number that did not answer 200."""
    body = orjson.dumps(
        {"model": path, "stream": path == "stream", "messages": [{"role": "user", "content": "hi"}]}
    )
    left, failed = count, 0

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal left, failed
        while left > 0:
            left -= 1
            async with session.post(url, data=body, headers={"content-type": "application/json"}) as r:
                await r.read()
                failed += r.status != 200

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    return failed


def counted(tree: Path, tmp: Path, up: int, path: str, requests: int, concurrency: int) -> tuple[float, Path]:
    """Instructions per request of one gateway from `tree`, and its callgrind output file."""
    port = free_port()
    name = f"{tree.name}-{path}-{concurrency}"
    config = tmp / f"{name}.yaml"
    config.write_text(CONF.format(port=port, up=up))
    out = tmp / f"{name}.callgrind"
    module = "tidegate" if (tree / "tidegate" / "__main__.py").exists() else "router.cli"
    command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    command += [sys.executable, "-m", module, "--log-level", "info", "serve", "--config", str(config)]
    gateway = subprocess.Popen(
        command, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(f"http://127.0.0.1:{port}/healthz", timeout=600)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        asyncio.run(send(url, path, WARM_UP, concurrency))
        subprocess.run(["callgrind_control", "-i", "on", str(gateway.pid)], check=True, capture_output=True)
        failed = asyncio.run(send(url, path, requests, concurrency))
        subprocess.run(["callgrind_control", "-i", "off", str(gateway.pid)], check=True, capture_output=True)
        if failed:
            raise SystemExit(f"{name}: {failed} of {requests} requests did not answer 200")
    finally:
        gateway.terminate()
        gateway.wait(timeout=120)
    return _total(out) / requests, out


def _total(out: Path) -> float:
    lines = out.read_text(errors="replace").splitlines()
    totals = [float(line.split()[1]) for line in lines if line.startswith("totals:")]
    if not totals or not totals[-1]:
        raise SystemExit(f"{out}: no instructions counted (no totals line, or zero)")
    return totals[-1]


def differences(before: Path, after: Path, requests: int, top: int) -> None:
    """The functions whose inclusive instructions per request moved most."""

    def inclusive(out: Path) -> dict[str, float]:
        text = subprocess.run(
            ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(out)],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        found: dict[str, float] = {}
        for line in text.splitlines():
            parts = line.split(None, 1)
            if len(parts) == 2 and parts[0].replace(",", "").isdigit():
                function = parts[1].split(")", 1)[-1].strip().split(" [")[0]  # after "(12.3%)"
                found[function] = int(parts[0].replace(",", "")) / requests
        return found

    old, new = inclusive(before), inclusive(after)
    moved = sorted(set(old) | set(new), key=lambda f: -abs(new.get(f, 0) - old.get(f, 0)))[:top]
    print(f"{'before':>10} {'after':>10} {'change':>10}  function (inclusive instructions per request)")
    for function in moved:
        a, b = old.get(function, 0), new.get(function, 0)
        print(f"{a:>10.0f} {b:>10.0f} {b - a:>+10.0f}  {function[:110]}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--before", type=Path, required=True, metavar="DIR", help="an earlier source tree")
    parser.add_argument(
        "--after",
        type=Path,
        default=Path.cwd(),
        metavar="DIR",
        help="the tree to compare (default: this one)",
    )
    parser.add_argument("--requests", type=int, default=300, help="counted requests per gateway")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--paths", nargs="+", choices=("plain", "stream"), default=["plain", "stream"])
    parser.add_argument("--top", type=int, default=0, help="list the functions that moved most")
    args = parser.parse_args()
    for tool in ("valgrind", "callgrind_control", "callgrind_annotate"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found: apt-get install -y valgrind")
    trees = (args.before.resolve(), args.after.resolve())
    with tempfile.TemporaryDirectory() as name:
        tmp, up = Path(name), free_port()
        nginx = start_nginx(tmp, up, cpu=1)
        try:
            wait_for(f"http://127.0.0.1:{up}/missing-is-fine")
            print(
                f"{'path':<7}{'conc':>5} {'before':>12} {'this tree':>12} {'ratio':>7}  instructions/request"
            )
            for path in args.paths:
                for conc in args.concurrency:
                    (old, old_out), (new, new_out) = (
                        counted(t, tmp, up, path, args.requests, conc) for t in trees
                    )
                    print(f"{path:<7}{conc:>5} {old:>12,.0f} {new:>12,.0f} {new / old:>6.3f}x", flush=True)
                    if args.top:
                        differences(old_out, new_out, args.requests, args.top)
        finally:
            nginx.terminate()
            nginx.wait(timeout=30)


if __name__ == "__main__":
    main()
