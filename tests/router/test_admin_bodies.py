"""Admin request bodies (issue 26): read only after the admin key was checked, as JSON whatever
content type the client sent (`curl -X PUT -d '{...}'` sends a form type), with a clear 400 for
what is not a JSON object. The connection-level caps are tests/integration/test_body_limits.py's."""

from __future__ import annotations

import pytest

from tests.router.asgi import MockUpstreams, answers, asgi_gateway, chat_reply, model_yaml

ADMIN = {"authorization": "Bearer adm"}


def admin_yaml() -> str:
    return model_yaml(dedicated=(), serverless=("sl1",)).replace(
        "auth: {api_keys: [key]}", "auth: {api_keys: [key], admin_key: adm}"
    )


@pytest.mark.parametrize("content_type", ["application/json", "application/x-www-form-urlencoded", None])
async def test_an_admin_body_is_json_whatever_its_content_type(content_type):
    headers = dict(ADMIN) | ({"content-type": content_type} if content_type else {})
    async with asgi_gateway(admin_yaml(), MockUpstreams({"sl1": answers(chat_reply())})) as gw:
        reply = await gw.client.put("/admin/models/m/canary", content=b'{"percent": 40}', headers=headers)
    assert reply.status_code == 200, reply.text
    assert reply.json()["canary_percent"] == 40


@pytest.mark.parametrize(("body", "says"), [(b"percent=40", "not valid JSON"), (b"[40]", "JSON object")])
async def test_an_admin_body_that_is_not_a_json_object_is_a_clear_400(body, says):
    async with asgi_gateway(admin_yaml(), MockUpstreams({"sl1": answers(chat_reply())})) as gw:
        reply = await gw.client.put("/admin/models/m/canary", content=body, headers=ADMIN)
    assert reply.status_code == 400 and says in reply.json()["error"]["message"]


async def test_an_admin_body_is_not_read_without_the_admin_key():
    async with asgi_gateway(admin_yaml(), MockUpstreams({"sl1": answers(chat_reply())})) as gw:
        reply = await gw.client.put(
            "/admin/models/m/canary", content=b"not even json", headers={"authorization": "Bearer key"}
        )
    assert reply.status_code == 401  # not a 400 about the body: the key was checked first
