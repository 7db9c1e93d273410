"""Building and loading dantinox's C++ kernels (dantinox/backend/kernels/*.cc), XLA FFI custom calls for the CPU.

Each source is compiled on first use with the machine's compiler (`$CXX`, else g++) against the headers
jaxlib ships, into the user cache directory (`cache_dir`), one file per source, jaxlib, compiler, flags and
CPU, so a second process loads it in milliseconds. dantinox/backend/pool_kernel.py (attention over cached slots) and
dantinox/backend/dense_kernel.py (bfloat16 weights times a few rows) are built this way.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

import jax

CACHE_ENV = "DANTINOX_KERNEL_CACHE"
FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-ffast-math", "-std=c++17", "-shared", "-fPIC")


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def cache_dir() -> Path:
    """`$DANTINOX_KERNEL_CACHE`, else dantinox-labs/kernels in the user cache directory."""
    import platformdirs

    return Path(os.environ.get(CACHE_ENV) or Path(platformdirs.user_cache_dir("dantinox-labs")) / "kernels")


def _headers() -> dict[str, bytes]:
    """The headers the kernels share (dantinox/kernels/*.h): name -> text."""
    folder = resources.files("dantinox.backend").joinpath("kernels")
    return {f.name: f.read_bytes() for f in folder.iterdir() if f.name.endswith(".h")}


def library_path(name: str, source: bytes, compiler: str, headers: dict[str, bytes]) -> Path:
    """Where the library built from `name` is kept: one file per source and headers, jaxlib, compiler, flags
    and CPU."""
    shared = b"\0".join(text for _, text in sorted(headers.items()))
    key = hashlib.sha256(b"\0".join([source, shared, jax.lib.__version__.encode(), compiler.encode(),
                                     " ".join(FLAGS).encode(), _cpu_flags().encode()])).hexdigest()[:16]
    return cache_dir() / f"{Path(name).stem}-{key}.so"


def build(name: str) -> Path:
    """Compile dantinox/backend/kernels/`name` if it is not in the cache yet; the path of the shared library."""
    source = resources.files("dantinox.backend").joinpath("kernels", name).read_bytes()
    compiler = os.environ.get("CXX") or "g++"
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C++ compiler found ({compiler!r}; set CXX)")
    headers = _headers()
    out = library_path(name, source, compiler, headers)
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        src, lib = Path(tmp) / name, Path(tmp) / out.name
        src.write_bytes(source)
        for header, text in headers.items():  # beside the source, where its #include "..." finds them
            (Path(tmp) / header).write_bytes(text)
        done = subprocess.run([compiler, *FLAGS, "-isystem", jax.ffi.include_dir(), str(src), "-o", str(lib)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise RuntimeError(f"{compiler} could not build {name}: {last}")
        os.replace(lib, out)  # atomic: two processes building at once both end with a whole file
    return out


def load(name: str, targets: dict[str, str], off_switch: str) -> None:
    """Build `name` and register its handlers (custom-call target -> exported symbol) for the CPU.

    Raises RuntimeError (or OSError) with the reason in one line: `off_switch`=0 in the environment, a backend
    other than the CPU, no compiler, a failed build.
    """
    if os.environ.get(off_switch, "1") == "0":
        raise RuntimeError(f"turned off by {off_switch}=0")
    if jax.default_backend() != "cpu":
        raise RuntimeError(f"the kernel is for the CPU; the backend is {jax.default_backend()!r}")
    lib = ctypes.CDLL(str(build(name)))
    for target, symbol in targets.items():
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")


def loaded(state: dict, name: str, targets: dict[str, str], off_switch: str, module: str, otherwise: str) -> bool:
    """Load `name` once per process into `state` (ok, and why not in one line); whether it is usable.

    `module` and `otherwise` make the line: "dantinox.<module>: not used (<reason>); <otherwise>".
    """
    if "ok" not in state:
        try:
            load(name, targets, off_switch)
            state.update(ok=True, why="")
        except (OSError, RuntimeError, AttributeError) as e:
            state.update(ok=False, why=f"dantinox.{module}: not used ({e}); {otherwise}")
    return bool(state["ok"])
