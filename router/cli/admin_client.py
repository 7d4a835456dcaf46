"""The CLI's side of the admin API: one call, its errors turned into one readable message."""

from __future__ import annotations

from typing import Any

import httpx


class AdminCallFailed(Exception):
    """The admin API could not be reached or refused the call; the message says why."""


def call_admin(
    method: str, base_url: str, path: str, admin_key: str, body: Any = None, *, timeout: float = 10.0
) -> dict[str, Any]:
    url = base_url.rstrip("/").removesuffix("/v1") + path
    try:
        response = httpx.request(
            method, url, json=body, headers={"authorization": f"Bearer {admin_key}"}, timeout=timeout
        )
    except httpx.HTTPError as exc:
        raise AdminCallFailed(f"cannot reach {base_url}: {exc}") from exc
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if response.status_code != 200 or not isinstance(answer, dict):
        error = answer.get("error") if isinstance(answer, dict) else None
        message = error.get("message") if isinstance(error, dict) else response.text[:200]
        raise AdminCallFailed(f"{response.status_code}: {message}")
    return answer
