"""A wheel of the project, installed outside the checkout, carries what every lab reads at run time.

The wheel is built from a copy of the sources and installed with --no-deps into a fresh venv that sees the
project venv's packages through a .pth file (a full dependency install would take minutes); the checks run
from a folder outside the checkout, so nothing can come from the repository's runs/, labs/ or benchmarks/.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ["pyproject.toml", "README.md", "dantinox", "content", "widgets", "classroom", "dantinox_labs", "runs",
           "labs", "benchmarks/data"]

CHECK = r"""
import json, sys
from pathlib import Path

import content, dantinox, dantinox_labs, widgets
from classroom.jupyterhub_config import LEARNER_JUPYTER_CONFIG
from dantinox_labs import shipped
from widgets.concept_map import lab_notebook
from widgets.decode_models import find_run
from widgets.memory_savers_lab import load_measurements
from dantinox.backend import dense_kernel, pool_kernel

entries = content.load_all()
runs = {p.parent.name: sorted((f.name, f.stat().st_size) for f in p.parent.iterdir())
        for p in sorted(shipped.RUNS.glob("*/config.json"))}
found, _ = find_run(dantinox.ModelConfig.preset("tiny"))
hidden = LEARNER_JUPYTER_CONFIG  # what learners' servers are started with
cfg, _ = dantinox.load_run(found)  # weights read and checked against the config
print(json.dumps({
    "files": [m.__file__ for m in (content, dantinox, dantinox_labs, widgets)],
    "folders": [str(shipped.RUNS), str(shipped.LABS), str(shipped.DATA)],
    "labs": sorted(p.name for p in shipped.LABS.glob("*.ipynb")),
    "lab_links": sorted(lab_notebook(e) for e in entries.values() if e.lab_id),
    "runs": runs,
    "tiny": [found.name, cfg.n_layers],
    "measurements": len(load_measurements()["rows"]),
    "heldout": len(shipped.heldout_text()),
    "entries": len(entries),
    "learner_jupyter": sorted(p.relative_to(hidden).as_posix() for p in hidden.rglob("*.json")),
    "pool_kernel": [pool_kernel.available(), pool_kernel.why_not()],  # its C++ source is package data
    "dense_kernel": [dense_kernel.available(), dense_kernel.why_not()],
}))
"""


def _copy_sources(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints", "*.pyc")
    for name in SOURCES:
        src = ROOT / name
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree(src, dest / name, ignore=ignore) if src.is_dir() else shutil.copy2(src, dest / name))


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The python of a venv holding the wheel (no checkout on its path) and the project venv's dependencies."""
    work = tmp_path_factory.mktemp("wheel")
    _copy_sources(work / "src")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(work / "dist"), str(work / "src")],
                   check=True, capture_output=True, cwd=work)
    wheel = next((work / "dist").glob("dantinox_labs-*.whl"))
    venv.EnvBuilder(with_pip=False).create(work / "venv")
    python = work / "venv" / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    subprocess.run([*pip, "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)], check=True,
                   capture_output=True, cwd=work)
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         capture_output=True, text=True, check=True).stdout.strip()
    (Path(own) / "project-dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return python


@pytest.fixture(scope="module")
def built_kernels(tmp_path_factory) -> Path:
    """A kernel folder ($DANTINOX_KERNEL_CACHE) holding links to the libraries this checkout's set-up built. A
    library is named by the hash of its source (read from the installed wheel), jaxlib, compiler, flags and CPU,
    so the wheel finds one only if it ships the same C++ sources; otherwise it builds its own (slower, as right)."""
    from dantinox.backend import native

    folder = tmp_path_factory.mktemp("kernels")
    for place in native.cache_dirs():
        for lib in place.glob("*.so") if place.is_dir() else ():
            if not (folder / lib.name).exists():
                (folder / lib.name).symlink_to(lib)
    return folder


def _env(kernels: Path) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "DANTINOX_KERNEL_CACHE": str(kernels)}


def _run(python: Path, code: str, cwd: Path, kernels: Path) -> subprocess.CompletedProcess:
    env = _env(kernels)
    script = cwd / "check.py"
    script.write_text(code)
    return subprocess.run([str(python), str(script)], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_an_installed_wheel_carries_every_run_lab_and_measurement(installed, built_kernels, tmp_path):
    res = _run(installed, CHECK, tmp_path, built_kernels)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.splitlines()[-1])
    venv_dir = installed.parent.parent
    for path in got["files"] + got["folders"]:
        assert Path(path).is_relative_to(venv_dir) and not Path(path).is_relative_to(ROOT), path
    assert got["labs"] == sorted(p.name for p in (ROOT / "labs").glob("*.ipynb"))
    assert None not in got["lab_links"] and set(got["lab_links"]) <= set(got["labs"])
    assert got["runs"] == {p.parent.name: [[f.name, f.stat().st_size] for f in sorted(p.parent.iterdir())]
                           for p in sorted((ROOT / "runs").glob("*/config.json"))}
    assert got["tiny"] == ["tiny", json.loads((ROOT / "runs/tiny/config.json").read_text())["n_layers"]]
    assert got["measurements"] == len(json.loads((ROOT / "benchmarks/data/memory_savers.json").read_text())["rows"])
    assert got["heldout"] == len((ROOT / "benchmarks/data/heldout.txt").read_text(encoding="utf-8"))
    assert got["entries"] == len(list((ROOT / "content" / "entries").glob("*.yaml")))
    assert got["learner_jupyter"] == ["jupyter_server_config.json", "labconfig/page_config.json"]  # hides nbgrader
    from dantinox.backend import dense_kernel, pool_kernel

    for name, kernel in (("pool_kernel", pool_kernel), ("dense_kernel", dense_kernel)):
        assert got[name] == [True, ""] or not kernel.available(), got[name]  # the wheel ships the C++ sources


def test_the_installed_command_prepares_the_labs_and_checks_content(installed, built_kernels, tmp_path):
    dantinox = installed.with_name("dantinox.exe" if os.name == "nt" else "dantinox")
    env = _env(built_kernels)
    done = subprocess.run([str(dantinox), "lab", "--dir", str(tmp_path / "labs"), "--prepare-only"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "labs").glob("*.ipynb")) == sorted(
        p.name for p in (ROOT / "labs").glob("*.ipynb"))
    done = subprocess.run([str(dantinox), "content", "check"], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("OK: "), done.stdout + done.stderr
    done = subprocess.run([str(dantinox), "kv", "--list"], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=120)  # the catalogue is package data of dantinox
    assert done.returncode == 0 and len(done.stdout.splitlines()) >= 20, done.stdout + done.stderr
