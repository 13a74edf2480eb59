"""Issue 12: the run page's GPU figure drawn by plotly.js in a real headless Chromium (read back
from the plot), and the per-GPU table beside it; the browser logs no error."""

from __future__ import annotations

import pytest

from tests.browserpage import chromium_page
from tests.test_telemetry_django import U0, fixture
from tests.test_telemetry_pages import stored

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def throttled_run():
    from tests.factories import make_sweep

    return stored(make_sweep(), fixture("throttle"), [(0, U0)]).pk  # no ORM inside playwright's loop


def test_run_page_draws_the_gpu_figure(live_server, throttled_run, chromium_path):
    errors: list[str] = []
    with chromium_page(chromium_path, errors, viewport={"width": 1400, "height": 1000}) as page:
        page.goto(f"{live_server.url}/runs/{throttled_run}/")
        page.wait_for_selector("#fig-gpu-plot .main-svg", timeout=30_000)
        drawn = page.evaluate("""() => document.getElementById('fig-gpu-plot').data.map(
            t => ({q: t.meta.quantity, n: t.x.length}))""")
        assert sorted(t["q"] for t in drawn) == ["power_w", "sm_mhz", "throttled", "util_pct"]
        assert {t["n"] for t in drawn if t["q"] != "throttled"} == {146}
        shapes = page.evaluate("() => document.getElementById('fig-gpu-plot').layout.shapes.length")
        assert shapes == 1
        assert "0x44 (sw_power_cap, hw_thermal_slowdown)" in page.locator("#gpu-table").inner_text()
    assert errors == []
