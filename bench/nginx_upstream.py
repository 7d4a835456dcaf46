"""The benchmarks' upstream: nginx (Debian's `nginx-light`) answering a fixed chat completion
at /plain/v1 and a fixed 20-chunk SSE stream at /stream/v1, so the gateway is the bottleneck."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import orjson

CHAT = orjson.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "bench",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hello " * 16}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 16, "total_tokens": 28},
    }
).decode()


def sse_body() -> str:
    events = []
    for i in range(20):
        delta = {"role": "assistant", "content": ""} if i == 0 else {"content": f"tok{i} "}
        chunk = {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "bench",
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
        }
        events.append("data: " + orjson.dumps(chunk).decode() + "\\n\\n")
    return "".join(events) + "data: [DONE]\\n\\n"


NGINX_CONF = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir};
  proxy_temp_path {dir};
  fastcgi_temp_path {dir};
  uwsgi_temp_path {dir};
  scgi_temp_path {dir};
  keepalive_requests 1000000;
  server {{
    listen 127.0.0.1:{port};
    location /plain/v1/chat/completions {{ default_type application/json; return 200 '{chat}'; }}
    location /stream/v1/chat/completions {{ default_type text/event-stream; return 200 '{sse}'; }}
  }}
}}
"""


def start_nginx(directory: Path, port: int, cpu: int) -> subprocess.Popen[bytes]:
    """nginx on 127.0.0.1:`port`, pinned to `cpu`, its files in `directory`."""
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists():
        raise SystemExit("nginx not found: apt-get install -y nginx-light")
    conf = directory / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=directory, port=port, chat=CHAT, sse=sse_body()))
    return subprocess.Popen(["taskset", "-c", str(cpu), nginx, "-c", str(conf)])
