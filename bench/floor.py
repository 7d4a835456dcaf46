"""The floor for bench.overhead: a bare passthrough on tidegate's own stack (uvicorn with
httptools and uvloop, Starlette, httpx over aiohttp) with no routing, state, telemetry or
logging. It reads `model` from the body (as any router must) to pick the upstream path. What
tidegate costs above it is tidegate's own doing.

    python -m bench.floor UPSTREAM_ROOT PORT      (e.g. http://127.0.0.1:9000 8123)
"""

from __future__ import annotations

import sys

import httpx
import orjson
import uvicorn
from httpx_aiohttp import AiohttpTransport
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route


def floor_app(upstream: str) -> Starlette:
    client = httpx.AsyncClient(transport=AiohttpTransport(), base_url=upstream, timeout=60)

    async def chat(request: Request) -> Response:
        body = await request.body()
        path = f"/{orjson.loads(body)['model']}/v1/chat/completions"
        sent = client.build_request("POST", path, content=body, headers={"content-type": "application/json"})
        answer = await client.send(sent, stream=True)
        kind = answer.headers.get("content-type", "application/json")
        if kind.startswith("text/event-stream"):
            return StreamingResponse(
                answer.aiter_raw(), media_type=kind, background=BackgroundTask(answer.aclose)
            )
        payload = await answer.aread()
        return Response(payload, status_code=answer.status_code, media_type=kind)

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


if __name__ == "__main__":
    app = floor_app(sys.argv[1])
    uvicorn.run(
        app, host="127.0.0.1", port=int(sys.argv[2]), loop="uvloop", http="httptools", log_level="warning"
    )
