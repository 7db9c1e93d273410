"""One JupyterLab server and one Chromium per test worker, for every browser test it runs.

The server is the learner's own command, `dantinox lab`, on a temporary working copy of labs/ (so what is
tested is what a learner opens, and the committed notebooks are never rewritten). It runs on a free local
port with a random token and keeps its settings, workspaces and answer store in a temporary directory:
autosave is off, the news prompt is off, and every cell is kept in the page (no windowing), so what the test
reads is what a learner would scroll to.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from chromium import INSTALL_HINT, find_chromium  # noqa: E402

SETTINGS = {  # JupyterLab user settings for the test server only
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
}


class Server:
    """A running JupyterLab: its base URL, token, and the REST calls the tests need."""

    def __init__(self, port: int, token: str, process: subprocess.Popen, log: Path, folder: Path):
        self.url, self.token, self.process, self.log = f"http://127.0.0.1:{port}", token, process, log
        self.folder = folder  # the learner's working copy of labs/ that the server opens

    def api(self, method: str, path: str):
        request = urllib.request.Request(f"{self.url}{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def shut_down_kernels(self) -> None:
        """Each lab's kernel holds a compiled model; end it before the next lab starts its own."""
        for kernel in self.api("GET", "/api/kernels"):
            self.api("DELETE", f"/api/kernels/{kernel['id']}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path = find_chromium()
    if path is None:
        pytest.fail(INSTALL_HINT, pytrace=False)
    return path


@pytest.fixture(scope="session")
def jupyter(tmp_path_factory) -> Server:
    home = tmp_path_factory.mktemp("jupyter")
    for name, values in SETTINGS.items():
        target = home / "settings" / f"{name}.jupyterlab-settings"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(values))
    env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
           "DANTINOX_ANSWERS_DB": str(home / "answers.sqlite")}
    env.pop("DISPLAY", None)  # no browser window of its own
    port, token = _free_port(), secrets.token_hex(16)
    args = [sys.executable, "-m", "dantinox_labs.cli", "lab", "--dir", str(home / "labs"), f"--port={port}",
            "--ip=127.0.0.1", f"--IdentityProvider.token={token}"]
    log = home / "server.log"
    with open(log, "w") as out:
        process = subprocess.Popen(args, cwd=home, env=env, stdout=out, stderr=subprocess.STDOUT)
    server = Server(port, token, process, log, home / "labs")
    deadline = time.monotonic() + 90
    while True:
        try:
            server.api("GET", "/api/status")
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                pytest.fail(f"dantinox lab did not start; its log:\n{log.read_text()[-3000:]}", pytrace=False)
            time.sleep(0.5)
    yield server
    process.terminate()
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()


@pytest.fixture(scope="session")
def browser(chromium_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=chromium_path, args=["--no-sandbox"])
        yield chromium
        chromium.close()
