"""Every time or rate field of the config says what a time-lapse does with it: scaled (divided,
or multiplied for a rate) by `tidegate replay --scale-config`, or left alone with a reason
(tidegate/offline/timelapse.py). A new field in neither list fails here, so a replay cannot
silently run one constant at trace speed and the rest at wall speed."""

from __future__ import annotations

import re
import typing

import pytest
from pydantic import BaseModel

from router.config import GatewayConfig, parse_config
from tidegate.offline.timelapse import UNSCALED, scale_config, scaled_fields

_TIME_OR_RATE = re.compile(r"(_s|_ms|rpm|tpm|per_s|_hours?|_days?)$")


def config_fields() -> set[str]:
    found: set[str] = set()
    seen: set[type] = set()

    def walk(cls: type[BaseModel]) -> None:
        if cls in seen:
            return
        seen.add(cls)
        for name, field in cls.model_fields.items():
            found.add(f"{cls.__name__}.{name}")
            for inner in (field.annotation, *typing.get_args(field.annotation)):
                for kind in (inner, *typing.get_args(inner)):
                    if isinstance(kind, type) and issubclass(kind, BaseModel):
                        walk(kind)

    walk(GatewayConfig)
    return found


def test_every_time_or_rate_field_is_declared_scaled_or_unscaled():
    timed = {name for name in config_fields() if _TIME_OR_RATE.search(name.split(".")[1])}
    assert len(timed) > 40  # the walk reached the nested sections
    undeclared = timed - scaled_fields() - set(UNSCALED)
    assert undeclared == set(), "declare each in tidegate/offline/timelapse.py: scaled, or UNSCALED with why"


def test_no_field_is_declared_twice_or_names_nothing():
    fields = config_fields()
    assert scaled_fields() & set(UNSCALED) == set()
    assert (scaled_fields() | set(UNSCALED)) - fields == set()
    assert all(reason for reason in UNSCALED.values())


CONFIG = """
auth:
  keys:
    - {name: app, key: "${APP_KEY}", rpm: 60, tpm: 6000}
models:
  m:
    routing: {batch: {max_wait_s: 300}}
    shadow: {percent: 5, endpoint: s, timeout_s: 60}
    dedicated: [{name: d, gpu_hour_usd: 0, base_url: "http://127.0.0.1:1/v1", model: x, max_concurrency: 2}]
    serverless: [{name: s, usd_per_mtok_in: 0, usd_per_mtok_out: 0, base_url: "http://127.0.0.1:2/v1", model: y}]
"""


@pytest.mark.parametrize("speed", [2, 4])
def test_the_newly_declared_fields_scale(speed):
    env = {"APP_KEY": "k"}
    config = parse_config(scale_config(CONFIG, speed, env), env)
    model = config.models["m"]
    assert model.routing.batch.max_wait_s == pytest.approx(300 / speed)
    assert model.shadow is not None and model.shadow.timeout_s == pytest.approx(60 / speed)
    (key,) = config.auth.keys
    assert (key.rpm, key.tpm) == (60 * speed, 6000 * speed)  # rates: K times as many per wall minute
    assert config.tasks.ttl_s == 3600  # declared unscaled: left alone
