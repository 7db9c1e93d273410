"""Day two: a lab run, saved and reopened in the learner's JupyterLab (`dantinox lab`) shows no broken widgets.

The server is the learner's command itself, on a temporary working copy: the shipped labs must stay
byte-for-byte as they are, and the reopened notebook must not read "Error displaying widget: model not found".
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAB = "mla.ipynb"  # widgets in three cells, a quick Run All
VIEW = "application/vnd.jupyter.widget-view+json"
ALL_RAN = """() => {
  const prompts = [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell .jp-InputPrompt')]
    .map(e => e.textContent.trim());
  return prompts.some(t => /^\\[\\d+\\]:$/.test(t)) && !prompts.some(t => t.includes('*'));
}"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def learner_lab(tmp_path_factory):
    """`dantinox lab` on a fresh working copy: (base URL, token, working folder)."""
    home = tmp_path_factory.mktemp("learner")
    for name, values in {"apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
                         "notebook-extension/tracker": {"windowingMode": "none"}}.items():  # every cell in the page
        settings = home / "settings" / "@jupyterlab" / f"{name}.jupyterlab-settings"
        settings.parent.mkdir(parents=True, exist_ok=True)
        settings.write_text(json.dumps(values))
    env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"), "DANTINOX_LABS_DIR": str(home / "labs"),
           "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"), "DANTINOX_ANSWERS_DB": str(home / "a.sqlite")}
    env.pop("DISPLAY", None)
    port, token = _free_port(), secrets.token_hex(16)
    log = open(home / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "dantinox_labs.cli", "lab", f"--port={port}", "--ip=127.0.0.1",
                             f"--IdentityProvider.token={token}"], cwd=home, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5)
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"dantinox lab did not start:\n{(home / 'server.log').read_text()[-3000:]}")
            time.sleep(0.5)
    yield url, token, home / "labs"
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def _open(browser, url: str, token: str):
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.goto(f"{url}/lab/workspaces/w{secrets.token_hex(4)}/tree/{LAB}?reset&token={token}")
    page.locator(".jp-NotebookPanel .jp-CodeCell").first.wait_for()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # a fresh JupyterLab may ask which kernel to start
        if page.locator(".jp-Dialog").count():
            page.locator(".jp-Dialog .jp-mod-accept").first.click()
            break
        page.wait_for_timeout(200)
    page.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]').wait_for()
    page.wait_for_timeout(2000)  # the widget manager restores (or fails to) once the kernel is up
    return context, page


def _menu(page, menu: str, item: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{menu}$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{re.escape(item)}$")).click()


def _shut_down_kernels(url: str, token: str) -> None:
    headers = {"Authorization": f"token {token}"}
    with urllib.request.urlopen(urllib.request.Request(f"{url}/api/kernels", headers=headers), timeout=10) as r:
        kernels = json.load(r)
    for kernel in kernels:
        request = urllib.request.Request(f"{url}/api/kernels/{kernel['id']}", method="DELETE", headers=headers)
        urllib.request.urlopen(request, timeout=30).close()


def _shows_no_broken_widget(page, visit: str) -> None:
    text = page.locator(".jp-NotebookPanel").inner_text()
    assert "Error displaying widget" not in text and "model not found" not in text, visit
    assert "children=(" not in text, f"{visit}: a widget's text repr is shown in its place"
    assert "A live widget goes here" in text, visit


def test_a_saved_lab_reopens_without_broken_widgets(learner_lab, browser):
    url, token, folder = learner_lab
    shipped = (ROOT / "labs" / LAB).read_bytes()
    context, page = _open(browser, url, token)
    try:
        _shows_no_broken_widget(page, "first visit")
        _menu(page, "Run", "Run All Cells")
        page.wait_for_function(ALL_RAN, timeout=300_000, polling=500)
        page.locator(".jp-OutputArea-output .jupyter-widgets").first.wait_for()
        before = (folder / LAB).stat().st_mtime_ns
        _menu(page, "File", "Save Notebook")
        deadline = time.monotonic() + 30
        while (folder / LAB).stat().st_mtime_ns == before and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (folder / LAB).stat().st_mtime_ns != before, "the notebook was not saved"
    finally:
        context.close()
    saved = json.loads((folder / LAB).read_text(encoding="utf-8"))
    assert all(c.get("execution_count") for c in saved["cells"] if c["cell_type"] == "code")  # this run, saved
    assert not [o for c in saved["cells"] for o in c.get("outputs", []) if VIEW in o.get("data", {})]
    for visit in ("reopened, its kernel still running", "reopened with a new kernel"):
        context, page = _open(browser, url, token)
        try:
            _shows_no_broken_widget(page, visit)
        finally:
            context.close()
        _shut_down_kernels(url, token)
    assert (ROOT / "labs" / LAB).read_bytes() == shipped
