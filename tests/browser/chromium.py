"""Find a Chromium for the browser tests; `python tests/browser/chromium.py` prints its path or says what to install.

Order: $DANTINOX_CHROMIUM, then Playwright's own Chromium (`playwright install chromium`), then a system
`chromium` on PATH (Debian's package). dev.py calls this before the tests, so a missing browser stops the
test command with one line instead of failing every browser test.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

INSTALL_HINT = ("browser tests: no Chromium found; install one with `apt-get install chromium` (Debian/Ubuntu, "
                "as root) or `.venv/bin/playwright install chromium`, or set DANTINOX_CHROMIUM=/path/to/chromium")


def find_chromium() -> str | None:
    """The path of a Chromium executable, or None when there is none."""
    given = os.environ.get("DANTINOX_CHROMIUM")
    if given:
        return given if Path(given).is_file() else None
    try:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            own = p.chromium.executable_path
        if own and Path(own).is_file():
            return own
    except Exception:  # noqa: BLE001 - no playwright or no downloaded browser: fall back to the system one
        pass
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


if __name__ == "__main__":
    path = find_chromium()
    if path is None:
        sys.exit(INSTALL_HINT)
    print(path)
