"""Production settings: `check --deploy` clean, HTTPS settings from the environment (loud on bad
values), and the real gunicorn + whitenoise server, over plain HTTP as the demo runs it and
behind a TLS proxy as README "Deploy" describes."""

from __future__ import annotations

import importlib.util
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from benchsite.env import ConfigError
from runs import localstack

ROOT = Path(__file__).resolve().parents[1]
PRODUCTION = {
    "DJANGO_SECRET_KEY": secrets.token_urlsafe(60),
    "DJANGO_ALLOWED_HOSTS": "draftboard.example.org",
    "DJANGO_SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto: https",
}
DEPLOY_VARS = ("DJANGO_DEBUG", "DJANGO_HTTPS", "DJANGO_ALLOWED_HOSTS", "DJANGO_HSTS_SECONDS",
               "DJANGO_HSTS_INCLUDE_SUBDOMAINS", "DJANGO_HSTS_PRELOAD", "DJANGO_SECURE_PROXY_SSL_HEADER",
               "DJANGO_CSRF_TRUSTED_ORIGINS", "DJANGO_SECRET_KEY")


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DEPLOY_VARS}
    return {**env, "DRAFTBOARD_VAR_DIR": str(tmp_path), **extra}


def manage(tmp_path: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=clean_env(tmp_path, **extra),
                          capture_output=True, text=True, timeout=180)


@pytest.mark.postgres(reason="production runs on PostgreSQL: check --deploy with its DATABASE_URL inherited")
def test_check_deploy_is_clean_with_production_env(tmp_path):
    proc = manage(tmp_path, "check", "--deploy", "--fail-level", "WARNING", **PRODUCTION)
    assert proc.returncode == 0, proc.stderr
    assert "System check identified no issues (1 silenced)." in proc.stdout  # security.W021, see settings


def test_check_deploy_warns_when_https_is_switched_off(tmp_path):
    proc = manage(tmp_path, "check", "--deploy", "--fail-level", "WARNING", **PRODUCTION, DJANGO_HTTPS="0")
    assert proc.returncode != 0
    for code in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert code in proc.stderr


def load_settings(monkeypatch, tmp_path, **env: str) -> dict:
    """Execute benchsite/settings.py afresh (not the configured django.conf.settings) under `env`."""
    for var in DEPLOY_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DRAFTBOARD_VAR_DIR", str(tmp_path))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    spec = importlib.util.spec_from_file_location("benchsite.settings_probe", ROOT / "benchsite" / "settings.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return vars(module)


def secure(s: dict) -> tuple:
    return (s["HTTPS"], s["SECURE_SSL_REDIRECT"], s["SESSION_COOKIE_SECURE"], s["CSRF_COOKIE_SECURE"],
            s["SECURE_HSTS_SECONDS"])


def test_https_follows_where_the_site_is_served(monkeypatch, tmp_path):
    demo = load_settings(monkeypatch, tmp_path)  # the demo: DEBUG off, loopback hosts only
    assert not demo["DEBUG"] and secure(demo) == (False, False, False, False, 0)
    prod = load_settings(monkeypatch, tmp_path, DJANGO_ALLOWED_HOSTS="draftboard.example.org")
    assert secure(prod) == (True, True, True, True, 31_536_000)
    assert prod["SECURE_HSTS_INCLUDE_SUBDOMAINS"] and not prod["SECURE_HSTS_PRELOAD"]
    assert prod["SECURE_PROXY_SSL_HEADER"] is None  # trusted only when set
    dev = load_settings(monkeypatch, tmp_path, DJANGO_ALLOWED_HOSTS="draftboard.example.org", DJANGO_DEBUG="1")
    assert secure(dev)[0] is False
    forced = load_settings(monkeypatch, tmp_path, DJANGO_HTTPS="1")
    assert secure(forced)[:4] == (True, True, True, True)
    plain = load_settings(monkeypatch, tmp_path, DJANGO_ALLOWED_HOSTS="lab-host", DJANGO_HTTPS="0")
    assert secure(plain) == (False, False, False, False, 0)
    tuned = load_settings(monkeypatch, tmp_path, DJANGO_ALLOWED_HOSTS="x.org", DJANGO_HSTS_SECONDS="3600",
                          DJANGO_HSTS_PRELOAD="1", DJANGO_SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto: https",
                          DJANGO_CSRF_TRUSTED_ORIGINS="https://x.org:8443")
    assert tuned["SECURE_HSTS_SECONDS"] == 3600 and tuned["SECURE_HSTS_PRELOAD"]
    assert tuned["SILENCED_SYSTEM_CHECKS"] == []
    assert tuned["SECURE_PROXY_SSL_HEADER"] == ("HTTP_X_FORWARDED_PROTO", "https")
    assert tuned["CSRF_TRUSTED_ORIGINS"] == ["https://x.org:8443"]


@pytest.mark.parametrize(
    "env, message",
    [
        ({"DJANGO_HTTPS": "maybe"}, r"DJANGO_HTTPS='maybe' is not a boolean"),
        ({"DJANGO_HTTPS": "1", "DJANGO_HSTS_SECONDS": "-5"}, r"DJANGO_HSTS_SECONDS=-5 must be 0 or more"),
        ({"DJANGO_HTTPS": "1", "DJANGO_HSTS_SECONDS": "a year"}, r"DJANGO_HSTS_SECONDS='a year' is not an integer"),
        ({"DJANGO_HSTS_SECONDS": "60"}, r"DJANGO_HSTS_SECONDS set, but the site is not served over HTTPS"),
        ({"DJANGO_SECURE_PROXY_SSL_HEADER": "https"}, r"DJANGO_SECURE_PROXY_SSL_HEADER='https' is not 'Header-Name"),
        ({"DJANGO_SECURE_PROXY_SSL_HEADER": "X Forwarded: https"}, r"DJANGO_SECURE_PROXY_SSL_HEADER="),
        ({"DJANGO_CSRF_TRUSTED_ORIGINS": "draftboard.example.org"}, r"DJANGO_CSRF_TRUSTED_ORIGINS: \['draftboard"),
    ],
)
def test_bad_deploy_values_fail_loudly(monkeypatch, tmp_path, env, message):
    with pytest.raises(ConfigError, match=message):
        load_settings(monkeypatch, tmp_path, **env)


# --- the real server -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(tmp_path: Path, **env: str):
    """Start the demo's web service argv (gunicorn) on a free port; return (process, base URL)."""
    port = free_port()
    log = open(tmp_path / "web.log", "wb")  # noqa: SIM115 - closed with the process below
    proc = subprocess.Popen(localstack.web_argv(f"127.0.0.1:{port}", threads=2), cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT, env=clean_env(tmp_path, **env), start_new_session=True)
    proc.log = log
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/static/draftboard/charts.js", timeout=2)
            return proc, url
        except httpx.TransportError:
            if proc.poll() is not None:
                break
            time.sleep(0.2)
    stop(proc)
    raise AssertionError(f"gunicorn did not answer: {(tmp_path / 'web.log').read_text()[-2000:]}")


def stop(proc) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=30)
    proc.log.close()


def test_demo_web_server_is_plain_http_with_static_files(tmp_path):
    proc, url = serve(tmp_path)  # the demo's environment: loopback only, DEBUG off
    try:
        with httpx.Client(base_url=url, timeout=10, follow_redirects=False) as client:
            login = client.get("/admin/login/")
            assert login.status_code == 200, login.text[:500]
            assert "strict-transport-security" not in login.headers
            cookie = login.headers["set-cookie"]
            assert cookie.startswith("csrftoken=") and "Secure" not in cookie
            js = client.get("/static/plotly/plotly.min.js")
            assert js.status_code == 200 and int(js.headers["content-length"]) > 1_000_000
            assert js.headers["content-type"].startswith("text/javascript")
            assert client.get("/static/admin/css/base.css").status_code == 200
            assert client.get("/static/draftboard/nothing-here.js").status_code == 404
    finally:
        stop(proc)


def test_server_behind_a_tls_proxy(tmp_path):
    """README "Deploy": collectstatic, gunicorn, a proxy that marks HTTPS with X-Forwarded-Proto."""
    collect = manage(tmp_path, "collectstatic", "--noinput", **PRODUCTION)
    assert collect.returncode == 0, collect.stderr
    proc, url = serve(tmp_path, **PRODUCTION)
    host = {"Host": "draftboard.example.org"}
    try:
        with httpx.Client(base_url=url, timeout=10, follow_redirects=False) as client:
            plain = client.get("/admin/login/", headers=host)
            assert plain.status_code == 301
            assert plain.headers["location"] == "https://draftboard.example.org/admin/login/"
            tls = client.get("/admin/login/", headers={**host, "X-Forwarded-Proto": "https"})
            assert tls.status_code == 200
            assert tls.headers["strict-transport-security"] == "max-age=31536000; includeSubDomains"
            assert "Secure" in tls.headers["set-cookie"]
            js = client.get("/static/plotly/plotly.min.js", headers={**host, "X-Forwarded-Proto": "https"})
            # from STATIC_ROOT, compressed by collectstatic (the finders' copy has no .gz beside it)
            assert js.status_code == 200 and js.headers["content-encoding"] == "gzip"
            assert len(js.content) > 1_000_000
    finally:
        stop(proc)


def test_wsgi_entry_freezes_the_loaded_application_out_of_gc_reach(tmp_path):
    """benchsite/wsgi.py moves what loading the site allocated to gc's permanent generation (a
    history page's collections then skip it); objects made afterwards are still collected."""
    code = ("import gc, benchsite.wsgi as w\n"
            "frozen = gc.get_freeze_count()\n"
            "tracked = len(gc.get_objects())\n"
            "class Cycle: pass\n"
            "c = Cycle(); c.me = c; del c\n"
            "print(frozen, tracked, gc.collect())\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean_env(tmp_path), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    frozen, tracked, collected = map(int, proc.stdout.split())
    assert frozen > 10 * tracked  # the loaded site is frozen, the heap gc still scans is small
    assert collected >= 1  # a cycle made after loading is collected
