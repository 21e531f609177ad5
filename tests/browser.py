"""A report page opened in a real browser: Debian's Chromium driven by Playwright's pip package, which never
downloads a browser of its own here (`executable_path`; never `playwright install`). `make test` installs the
package `chromium` where it is missing and the user may (Makefile: `browser`).

`python -m tests.browser PAGE.html SHOT.png` takes the README's screenshot with the same browser the test uses.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOW = (
    "no Chromium for the report's browser test: `make test` installs Debian's package where it may (as root or "
    "with sudo); else run `sudo apt-get install chromium` (Debian), or set TRAINWISE_CHROMIUM=/path/to/chromium"
)


def chromium() -> str | None:
    """The browser's binary: TRAINWISE_CHROMIUM, else `chromium` (Debian) or `chromium-browser` on PATH."""
    if given := os.environ.get("TRAINWISE_CHROMIUM"):
        return given
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class Opened:
    """A page loaded in the browser, and what it did while loading: every request and every console error."""

    page: Any  # playwright.sync_api.Page
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@contextlib.contextmanager
def opened(path: Path, width: int = 1280) -> Iterator[Opened]:
    """`path` loaded in headless Chromium (no sandbox: the suite may run as root), its network cut off: a request
    to anything but the file itself is recorded and aborted, so a page that fetches cannot pass by luck."""
    from playwright.sync_api import sync_playwright  # heavy: the browser's driver

    binary = chromium()
    if binary is None:
        raise RuntimeError(HOW)
    url = path.resolve().as_uri()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=binary, args=["--no-sandbox"], headless=True)
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            seen = Opened(page)
            page.on("console", lambda m: seen.errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: seen.errors.append(str(e)))

            def route(r: Any) -> None:
                seen.requests.append(r.request.url)
                if r.request.url == url:
                    r.continue_()
                else:
                    r.abort()

            page.route("**/*", route)
            page.goto(url, wait_until="load")
            yield seen
        finally:
            browser.close()


def screenshot(path: Path, shot: Path, width: int = 1100) -> None:
    """The whole page as a PNG of 256 colours (a page of text and flat colours: a third of the bytes)."""
    from PIL import Image

    with opened(path, width) as seen:
        png = seen.page.screenshot(full_page=True)
    Image.open(io.BytesIO(png)).convert("RGB").quantize(256).save(shot, optimize=True)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m tests.browser PAGE.html SHOT.png")
    screenshot(Path(sys.argv[1]), Path(sys.argv[2]))
    print(sys.argv[2])
