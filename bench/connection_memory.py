"""What one open client connection costs a `tidegate serve` process, measured from outside:
the figure behind `CONNECTION_BYTES` in `limits.worst_case_bytes()` (docs/security.md).

One gateway process (the memory store, no upstream is called) gets N connections of each
kind, one kind after the other, and its resident memory (VmRSS, /proc) is read before and
after each batch:
  partial head     a request line and one header of HEAD_KIB KiB, never finished (held until
                   `header_timeout_s`): the head buffer plus the connection's own state
  idle keep-alive  a whole `GET /healthz`, answered, the connection kept open

    python -m bench.connection_memory [--connections 1000] [--head-kib 8 60]

Prints KiB per connection for each kind, and the per-connection overhead past the head's own
bytes, beside the `CONNECTION_BYTES` the worst case counts.
"""

from __future__ import annotations

import argparse
import re
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from router.config.sections import CONNECTION_BYTES

CONFIG = """\
auth: {allow_anonymous: true}
limits: {max_connections: %d, header_timeout_s: 120, max_share_per_caller: 1.0, max_header_bytes: %d}
models:
  m:
    serverless: [{name: sl, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: 'http://127.0.0.1:9/v1', model: s}]
"""


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))


def settle(pid: int, timeout_s: float = 5.0) -> int:
    """RSS once two reads 0.2 s apart agree (the process has taken what it was sent)."""
    deadline, last = time.monotonic() + timeout_s, rss_kib(pid)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = rss_kib(pid)
        if abs(now - last) < 64:
            return now
        last = now
    return last


def batch(pid: int, port: int, count: int, payload: bytes, label: str) -> float:
    """KiB per connection for `count` connections that each sent `payload`."""
    before = settle(pid)
    held = []
    for i in range(count):
        conn = socket.create_connection(("127.0.0.1", port), timeout=10)
        conn.sendall(payload)
        held.append(conn)
        if (i + 1) % 250 == 0:
            print(f"  {label}: {i + 1}/{count} open", file=sys.stderr, flush=True)
    after = settle(pid)
    for conn in held:
        conn.close()
    return (after - before) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--head-kib", type=int, nargs="+", default=[8, 60])
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 2 * args.connections + 256)), hard))
    max_head = (max(args.head_kib) + 4) * 1024
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as config:
        config.write(CONFIG % (args.connections + 16, max_head))
    gateway = subprocess.Popen(
        [sys.executable, "-m", "tidegate", "serve", "--config", config.name, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert gateway.stdout is not None
        port = 0
        for line in gateway.stdout:
            found = re.search(r"http://[\d.]+:(\d+)/v1", line)
            if found:
                port = int(found.group(1))
                break
        if not port:
            sys.exit("the gateway did not start")
        warm = socket.create_connection(("127.0.0.1", port))
        warm.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        warm.recv(4096)
        warm.close()
        print(f"{args.connections} connections per kind; CONNECTION_BYTES counts {CONNECTION_BYTES // 1024} KiB")
        for kib in args.head_kib:
            head = b"GET /healthz HTTP/1.1\r\nx-pad: " + b"a" * (kib * 1024)
            each = batch(gateway.pid, port, args.connections, head, f"partial head {kib} KiB")
            print(f"partial head of {kib} KiB: {each:.1f} KiB each, {each - kib:.1f} KiB past the head's bytes")
        each = batch(gateway.pid, port, args.connections, b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n", "idle")
        print(f"idle keep-alive: {each:.1f} KiB each")
    finally:
        gateway.terminate()
        gateway.wait(30)
        Path(config.name).unlink()


if __name__ == "__main__":
    main()
