"""The demo's local services: the private Redis on a unix socket, reuse by pid file, stop."""

import sys

import pytest

from runs import localstack


def test_private_redis_starts_once_and_stops(tmp_path):
    url = f"redis+socket://{tmp_path / 'redis' / 'redis.sock'}"
    assert not localstack.ping(url)
    assert localstack.ensure_redis(url, tmp_path) == url
    assert localstack.ping(url)
    assert localstack.ensure_redis(url, tmp_path) == url  # reused, not restarted
    pid, started = localstack.ensure_process("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path)
    assert started
    assert localstack.ensure_process("sleeper", [sys.executable, "-c", "pass"], tmp_path) == (pid, False)
    assert set(localstack.stop_all(tmp_path)) == {"sleeper", "redis"}
    import time

    for _ in range(50):
        if not localstack.ping(url):
            break
        time.sleep(0.1)
    assert not localstack.ping(url)


def test_unreachable_external_redis_is_a_clear_error(tmp_path):
    with pytest.raises(localstack.LocalStackError, match="redis://127.0.0.1:1/0.*does not answer"):
        localstack.ensure_redis("redis://127.0.0.1:1/0", tmp_path)
