"""Every page sends a Content-Security-Policy (issue 31: none did), and the pages work under it:
scripts only from the site itself plus the report page's one inline script, which carries the
request's nonce; in headless Chromium the sweep page draws its Plotly figures and the report
page runs its inline script with no CSP violation (console and `securitypolicyviolation`
events both read)."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User

from runs.models import Run
from tests.browserpage import chromium_page
from tests.usersgrid import make_users_grid

HEADER = "Content-Security-Policy"


def _directives(header: str) -> dict[str, list[str]]:
    out = {}
    for part in header.split(";"):
        words = part.split()
        if words:
            out[words[0]] = words[1:]
    return out


@pytest.fixture
def grid():
    sweep = make_users_grid()
    run = Run.objects.filter(sweep=sweep).order_by("pk").first()
    return sweep.pk, run.pk, sweep.host.name


def _pages(sweep: int, run: int, host: str) -> list[str]:
    return ["/", "/home.json", "/sweeps/", "/compare/", "/trend/", f"/sweeps/{sweep}/", f"/sweeps/{sweep}/data.json",
            f"/sweeps/{sweep}/what-to-run/", f"/sweeps/{sweep}/runs/", f"/sweeps/{sweep}/progress.json",
            f"/sweeps/{sweep}/export.csv", f"/sweeps/{sweep}/report/", f"/runs/{run}/", f"/runs/{run}/progress.json",
            f"/hosts/{host}/", "/glossary/", "/sweeps/999999/", "/admin/login/"]


@pytest.mark.django_db
def test_every_page_sends_the_policy(client, grid):
    sweep, run, host = grid
    for url in _pages(sweep, run, host):
        resp = client.get(url)
        assert resp.status_code in (200, 404), (url, resp.status_code)
        assert HEADER in resp, url
        d = _directives(resp[HEADER])
        assert d["default-src"] == ["'self'"] and d["object-src"] == ["'none'"], (url, resp[HEADER])
        assert "'unsafe-inline'" not in d["script-src"] and "'unsafe-eval'" not in d["script-src"], url
        assert d["frame-ancestors"] == ["'none'"] and d["base-uri"] == ["'none'"], url
    resp = client.post("/api/ingest/", data=b"", content_type="application/gzip")  # 401, still with the header
    assert resp.status_code == 401 and HEADER in resp
    User.objects.create_superuser("root", "root@example.com", "pw")
    client.login(username="root", password="pw")
    for url in ("/admin/", "/admin/runs/run/", f"/admin/runs/run/{run}/change/", "/admin/runs/hosttoken/"):
        resp = client.get(url)
        assert resp.status_code == 200 and HEADER in resp, url


@pytest.mark.django_db
def test_inline_scripts_carry_the_requests_nonce(client, grid):
    """Every <script> without src on every HTML page has the nonce of that response's header
    (json_script data blocks, type application/json, are not run and need none)."""
    sweep, run, host = grid
    for url in _pages(sweep, run, host):
        resp = client.get(url)
        if not resp["Content-Type"].startswith("text/html"):
            continue
        html = resp.content.decode()
        inline = [tag for tag in re.findall(r"<script\b[^>]*>", html)
                  if "src=" not in tag and "application/json" not in tag]
        if not inline:
            continue
        nonces = re.findall(r"'nonce-([^']+)'", resp[HEADER])
        assert len(nonces) == 1, (url, resp[HEADER])
        assert all(f'nonce="{nonces[0]}"' in tag for tag in inline), (url, inline)
    report = client.get(f"/sweeps/{sweep}/report/")
    assert "'nonce-" in report[HEADER]  # the report page has its inline script
    first, second = client.get(f"/sweeps/{sweep}/report/"), client.get(f"/sweeps/{sweep}/report/")
    assert first[HEADER] != second[HEADER]  # a fresh nonce per response


VIOLATIONS = """() => { window.__csp = []; document.addEventListener('securitypolicyviolation',
    e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI)); }"""


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_the_sweep_page_draws_its_plotly_figures_under_the_policy(live_server, chromium_path):
    sweep = make_users_grid().pk  # no ORM inside playwright's event loop
    errors: list[str] = []
    csp_errors: list[str] = []
    with chromium_page(chromium_path, errors, viewport={"width": 1400, "height": 1000}) as page:
        page.on("console", lambda msg: csp_errors.append(msg.text) if "Content Security Policy" in msg.text else None)
        page.add_init_script(f"({VIOLATIONS})()")
        resp = page.goto(f"{live_server.url}/sweeps/{sweep}/")
        assert HEADER.lower() in resp.headers
        page.wait_for_selector("#sweep-figures[data-state=ready]", timeout=30_000)
        page.wait_for_selector("#what-to-run-slot[data-state=ready]", timeout=30_000)
        assert page.locator("#sweep-figures .js-plotly-plot").count() == 4
        assert page.evaluate("() => document.getElementById('fig-speedup').data.length") > 0
        page.hover("#fig-speedup .nsewdrag")  # hover labels: plotly writes styles at run time
        sweep_violations = page.evaluate("() => window.__csp")
        sweep_errors = list(errors)  # the report page (a standalone document) has no favicon link: its 404 is not ours
        page.goto(f"{live_server.url}/sweeps/{sweep}/report/")  # its inline script, with the nonce
        page.wait_for_selector("div.fig[id^='report-fig-'].js-plotly-plot", timeout=30_000)
        drawn = page.locator("div.fig[id^='report-fig-'].js-plotly-plot").count()
        report_violations = page.evaluate("() => window.__csp")
    print(f"\nsweep page: {sweep_violations or 'no'} CSP violations; report page: {drawn} figures drawn, "
          f"{report_violations or 'no'} violations")
    assert sweep_violations == [] and report_violations == [] and csp_errors == [], \
        (sweep_violations, report_violations, csp_errors)
    assert drawn > 0
    assert sweep_errors == []
