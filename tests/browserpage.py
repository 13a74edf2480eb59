"""A page of a real headless Chromium (playwright) for the browser tests, with every console
error, page error and HTTP error response the dashboard causes collected for the test to assert
empty."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-quic", "--no-first-run", "--disable-component-update", "--disable-sync"]


@contextlib.contextmanager
def chromium_page(chromium_path: str, errors: list[str], viewport: dict | None = None) -> Iterator:
    """Yield a playwright Page of Chromium at `chromium_path`; console errors, uncaught page
    errors and responses with HTTP status >= 400 are appended to `errors` as text. The browser
    is closed on exit. Keep ORM calls outside the block (playwright runs its own event loop)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(**({"viewport": viewport} if viewport else {}))
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("response", lambda r: errors.append(f"HTTP {r.status} {r.url}") if r.status >= 400 else None)
            yield page
        finally:
            browser.close()
