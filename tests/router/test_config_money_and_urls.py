"""check-config catches wrong money and wrong URLs: every route's price is required (an
explicit 0 allowed), and an upstream's base_url must be the API root the request paths are
appended to. Each refusal names its key path."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.config import ConfigError, parse_config
from tidegate.cli.main import main

DEDICATED = "{name: d, base_url: 'http://127.0.0.1:1/v1', model: x, max_concurrency: 4, gpu_hour_usd: 4.41}"
SERVERLESS = (
    "{name: s, base_url: 'http://127.0.0.1:2/v1', model: y, usd_per_mtok_in: 0.5, usd_per_mtok_out: 2}"
)


def config_text(dedicated: str = DEDICATED, serverless: str = SERVERLESS) -> str:
    return (
        "auth: {allow_anonymous: true}\nmodels:\n  m:\n"
        f"    dedicated:\n      - {dedicated}\n    serverless:\n      - {serverless}\n"
    )


def problems_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, {})
    return list(caught.value.problems)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (
            config_text(dedicated=DEDICATED.replace(", gpu_hour_usd: 4.41", "")),
            "models.m.dedicated[0].gpu_hour_usd",
        ),
        (
            config_text(serverless=SERVERLESS.replace("usd_per_mtok_in: 0.5, ", "")),
            "models.m.serverless[0].usd_per_mtok_in",
        ),
        (
            config_text(serverless=SERVERLESS.replace(", usd_per_mtok_out: 2", "")),
            "models.m.serverless[0].usd_per_mtok_out",
        ),
    ],
)
def test_an_unpriced_route_is_refused_naming_the_missing_price(text, key):
    (problem,) = problems_of(text)
    assert problem.startswith(f"{key}: a route's price is required")
    assert "write 0" in problem


def test_every_missing_price_is_listed_at_once():
    text = config_text(
        dedicated=DEDICATED.replace(", gpu_hour_usd: 4.41", ""),
        serverless="{name: s, base_url: 'http://127.0.0.1:2/v1', model: y}",
    )
    keys = sorted(p.split(":")[0] for p in problems_of(text))
    assert keys == [
        "models.m.dedicated[0].gpu_hour_usd",
        "models.m.serverless[0].usd_per_mtok_in",
        "models.m.serverless[0].usd_per_mtok_out",
    ]


def test_an_explicit_zero_price_is_a_price():
    text = config_text(
        dedicated=DEDICATED.replace("gpu_hour_usd: 4.41", "gpu_hour_usd: 0"),
        serverless=SERVERLESS.replace(
            "usd_per_mtok_in: 0.5, usd_per_mtok_out: 2", "usd_per_mtok_in: 0, usd_per_mtok_out: 0"
        ),
    )
    model = parse_config(text, {}).models["m"]
    assert model.dedicated[0].gpu_hour_usd == 0
    assert (model.serverless[0].usd_per_mtok_in, model.serverless[0].usd_per_mtok_out) == (0, 0)


@pytest.mark.parametrize(
    ("url", "refused_because"),
    [
        ("http://127.0.0.1:2", "no API path"),
        ("http://127.0.0.1:2/", "no API path"),
        ("https://api.example.com/v1/chat/completions", "ends with /chat/completions"),
        ("https://api.example.com/v1/completions/", "ends with /completions"),
        ("https://api.example.com/v1/embeddings", "ends with /embeddings"),
        ("https://api.example.com/v1?key=abc", "no query or fragment"),
        ("https://api.example.com/v1#top", "no query or fragment"),
        ("http:///v1", "no host"),
    ],
)
@pytest.mark.parametrize("side", ["dedicated", "serverless"])
def test_a_base_url_that_is_not_an_api_root_is_refused_naming_its_key(side, url, refused_because):
    route = DEDICATED if side == "dedicated" else SERVERLESS
    old = "http://127.0.0.1:1/v1" if side == "dedicated" else "http://127.0.0.1:2/v1"
    problems = problems_of(config_text(**{side: route.replace(old, url)}))
    assert len(problems) == 1
    assert problems[0].startswith(f"models.m.{side}[0].base_url: ")
    assert refused_because in problems[0]


@pytest.mark.parametrize(
    "url",
    [
        "https://api.example.com/v1",
        "https://api.example.com/v1/",
        "http://vllm:8000/v1",
        "https://example.com/inference/v1",
    ],
)
def test_an_api_root_is_accepted(url):
    config = parse_config(config_text(serverless=SERVERLESS.replace("http://127.0.0.1:2/v1", url)), {})
    assert config.models["m"].serverless[0].base_url == url


def check_config(tmp_path: Path, text: str) -> int:
    """`tidegate check-config` on `text`, as a file: its exit status (the output is captured)."""
    path = tmp_path / "tidegate.yaml"
    path.write_text(text)
    return main(["check-config", str(path)])


def test_check_config_prints_each_routes_price_and_a_zero_as_free(tmp_path: Path, capsys):
    free = config_text(dedicated=DEDICATED.replace("gpu_hour_usd: 4.41", "gpu_hour_usd: 0"))
    assert check_config(tmp_path, free) == 0
    out = capsys.readouterr().out
    assert "d (dedicated, $0/GPU-hour: reports bill it nothing)" in out
    assert "s (serverless, $0.5 in, $2 out per Mtok)" in out


def test_check_config_refuses_an_unpriced_route_with_exit_1(tmp_path: Path, capsys):
    assert check_config(tmp_path, config_text(dedicated=DEDICATED.replace(", gpu_hour_usd: 4.41", ""))) == 1
    err = capsys.readouterr().err
    assert "models.m.dedicated[0].gpu_hour_usd: a route's price is required" in err
