"""`state.redis_url` means one thing on both Redis paths (router/state/redis/address.py): the
single Redis's own line and redis-py's Cluster client read it with one parser, so an option
neither implements is refused at start naming it, never honoured on one path and dropped on
the other. No connection is made: these are refused before any."""

from __future__ import annotations

import pytest

from router.app import check_state
from router.config import ConfigError, GatewayConfig
from router.state.redis.address import BadRedisUrl, parse_url, read_url
from router.state.redis.store import RedisStore
from router.state.roles import StoreUnreachableAtStart

UNIMPLEMENTED = ["health_check_interval=5", "retry_on_timeout=true", "max_connections=9", "decode_responses=1"]


@pytest.mark.parametrize("scheme", ["redis", "redis+cluster", "rediss", "rediss+cluster"])
@pytest.mark.parametrize("option", UNIMPLEMENTED)
def test_an_option_the_connection_does_not_implement_is_refused_naming_it(scheme, option):
    name = option.split("=")[0]
    with pytest.raises(StoreUnreachableAtStart, match=rf"state\.redis_url: option '{name}' is not implemented"):
        RedisStore(f"{scheme}://127.0.0.1:6379/0?{option}", ["p"])


@pytest.mark.parametrize("option", ["socket_timeout=5", "socket_connect_timeout=0.1"])
def test_a_timeout_in_the_url_points_at_the_setting_that_owns_it(option):
    with pytest.raises(BadRedisUrl, match=r"set state\.redis_timeout_s instead"):
        read_url(f"redis+cluster://127.0.0.1:6379/0?{option}")


@pytest.mark.parametrize("option", ["ssl_certfile=/c.pem", "ssl_ca_certs=/ca.pem", "ssl_cert_reqs=none"])
def test_a_tls_option_without_tls_is_refused(option):
    with pytest.raises(BadRedisUrl, match=r"needs TLS: a rediss:// URL"):
        parse_url(f"redis://127.0.0.1:6379/0?{option}")


def test_a_client_key_without_its_certificate_is_refused():
    with pytest.raises(BadRedisUrl, match=r"'ssl_keyfile' needs 'ssl_certfile'"):
        parse_url("rediss://127.0.0.1:6379/0?ssl_keyfile=/k.pem")


def test_a_client_certificate_that_cannot_be_read_is_refused_at_start(tmp_path):
    missing = tmp_path / "nowhere.pem"
    for scheme in ("rediss", "rediss+cluster"):
        with pytest.raises(StoreUnreachableAtStart, match=r"state\.redis_url: TLS: .*No such file"):
            RedisStore(f"{scheme}://127.0.0.1:6379/0?ssl_certfile={missing}", ["p"])


def test_the_options_it_implements_are_read():
    address = parse_url(
        "rediss://u:p%40ss@h:7000/3?protocol=3&ssl_cert_reqs=none&ssl_check_hostname=false"
        "&ssl_certfile=/c.pem&ssl_keyfile=/k.pem&ssl_ca_certs=/ca.pem"
    )
    assert (address.host, address.port, address.db, address.protocol) == ("h", 7000, 3, 3)
    assert (address.username, address.password) == ("u", "p@ss")
    assert (address.tls, address.verify, address.check_hostname) == (True, False, False)
    assert (address.cert_file, address.key_file, address.ca_file) == ("/c.pem", "/k.pem", "/ca.pem")


def _config(url: str) -> GatewayConfig:
    return GatewayConfig.model_validate(
        {
            "auth": {"allow_anonymous": True},
            "state": {"redis_url": url},
            "models": {"m": {"serverless": [{"name": "s", "usd_per_mtok_in": 0, "usd_per_mtok_out": 0, "base_url": "http://s/v1", "model": "y"}]}},
        }
    )


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://127.0.0.1:6379/0", "scheme 'http'"),
        ("127.0.0.1:6379", "'127.0.0.1:6379' has no scheme"),
        ("redis://127.0.0.1:6379/0?health_check_interval=3", "option 'health_check_interval'"),
        ("redis://127.0.0.1:6379/x", "db='x'"),
    ],
)
def test_check_config_refuses_the_url_start_up_would_refuse(url, says):
    with pytest.raises(ConfigError) as caught:
        check_state(_config(url))
    (problem,) = caught.value.problems
    assert problem.startswith(f"state.redis_url: {says}"), problem


def test_check_config_takes_a_good_url_and_the_memory_store():
    check_state(_config("redis://127.0.0.1:6379/0?protocol=3"))
    check_state(_config(""))


def _state(**state: object) -> GatewayConfig:
    config = _config("")
    return config.model_copy(update={"state": config.state.model_copy(update=state)})


def test_a_sentinel_url_needs_the_redis_py_client_and_says_so():
    with pytest.raises(ConfigError, match=r"state\.redis_url: a Sentinel URL needs state\.redis_client: redis-py"):
        check_state(_state(redis_url="redis+sentinel://127.0.0.1:26379/mymaster"))
    check_state(_state(redis_url="redis+sentinel://127.0.0.1:26379/mymaster", redis_client="redis-py"))


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis+sentinel://127.0.0.1:26379", "names its sentinels and a service"),
        ("redis+sentinel://127.0.0.1:x/mymaster", "expected HOST:PORT"),
        ("redis+sentinel://127.0.0.1:26379/mymaster?retry_on_timeout=true", "'retry_on_timeout' is not implemented"),
    ],
)
def test_a_sentinel_url_that_cannot_be_used_is_refused_naming_why(url, problem):
    with pytest.raises(ConfigError, match=problem):
        check_state(_state(redis_url=url, redis_client="redis-py"))


def test_a_password_file_needs_the_redis_py_client_and_a_file_that_reads(tmp_path):
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    with pytest.raises(ConfigError, match=r"state\.redis_password_file needs state\.redis_client: redis-py"):
        check_state(_state(redis_url="redis://127.0.0.1:6379/0", redis_password_file=str(secret)))
    check_state(_state(redis_url="redis://127.0.0.1:6379/0", redis_password_file=str(secret), redis_client="redis-py"))
    with pytest.raises(ConfigError, match=r"state\.redis_password_file: .*No such file"):
        check_state(
            _state(redis_url="redis://127.0.0.1:6379/0", redis_password_file=str(tmp_path / "gone"), redis_client="redis-py")
        )
    with pytest.raises(ConfigError, match=r"state\.redis_password_file: set, but no state\.redis_url"):
        check_state(_state(redis_password_file=str(secret)))
