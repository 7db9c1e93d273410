"""The README's lab command really serves labs/ (the test command is exercised by running this suite)."""

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_lab_command_prints_a_working_url_and_serves_the_labs_folder():
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}  # a machine without a screen
    proc = subprocess.Popen([sys.executable, str(ROOT / "dev.py"), "lab", f"--port={port}", "--ip=127.0.0.1"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    pattern = re.compile(rf"http://127\.0\.0\.1:{port}/lab\?token=(\w+)")
    try:
        deadline, token = time.time() + 120, None
        while time.time() < deadline and token is None:
            assert proc.poll() is None, "".join(lines)
            found = [m.group(1) for m in map(pattern.search, list(lines)) if m]
            token = found[0] if found else None
            time.sleep(0.3)
        assert token, "the lab command printed no URL with a token within 120 s:\n" + "".join(lines)
        listing = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents?token={token}", timeout=10))
        names = {item["name"] for item in listing["content"]}
        assert "kv-cache.ipynb" in names
        assert {p.name for p in (ROOT / "labs").glob("*.ipynb")} <= names
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
