"""Building and loading dantinox's C++ kernels (dantinox/backend/kernels/*.cc),
XLA FFI custom calls for the CPU.

Each source is compiled with the machine's compiler (`$CXX`, else g++) against the headers jaxlib ships, one
file per source, headers, jaxlib, compiler, flags and CPU, by `python3 dev.py setup` (and `lab`, `test`) or,
failing that, when dantinox is first imported: never inside a trace. A built library is looked for in
`cache_dirs()`: the environment's own folder first, which the set-up fills and which a class server's accounts
share read-only, then the user's cache folder, where an account that cannot write the first builds its own.
dantinox/backend/pool_kernel.py (attention over cached slots, cache stores) and dense_kernel.py (bfloat16
weights times a few rows) are built this way, each through a `Kernel`: loaded once, whether it can run, and
why not in one line.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path

import jax

CACHE_ENV = "DANTINOX_KERNEL_CACHE"
# Not GCC's fast-math: it lets the compiler assume no infinity or NaN, and the kernels mask with -inf. What it
# gave that is safe stays: no errno from math functions, no trapping, fused multiply-adds (pool_attend.cc
# declares glibc's vector expf itself, simd.h sums a vector's lanes in an order of its own).
FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-fno-math-errno", "-fno-trapping-math",
         "-ffp-contract=fast", "-std=c++17", "-shared", "-fPIC")


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def cache_dirs() -> list[Path]:
    """Where built kernels are looked for, in order: `$DANTINOX_KERNEL_CACHE` alone where it is set; else the
    environment's share/dantinox-labs/kernels (the set-up builds there), then dantinox-labs/kernels in the
    user cache directory."""
    if os.environ.get(CACHE_ENV):
        return [Path(os.environ[CACHE_ENV])]
    import platformdirs

    return [Path(sys.prefix) / "share" / "dantinox-labs" / "kernels",
            Path(platformdirs.user_cache_dir("dantinox-labs")) / "kernels"]


def _writable(folder: Path) -> bool:
    """Create `folder` (and its missing parents) readable by every account (0755);
    whether we can write in it."""
    missing, part = [], folder
    while not part.exists():
        missing.append(part)
        part = part.parent
    try:
        for part in reversed(missing):
            part.mkdir()
            part.chmod(0o755)  # whatever the umask: other accounts read what is built here
    except OSError:
        return False
    return os.access(folder, os.W_OK | os.X_OK)


def _headers() -> dict[str, bytes]:
    """The headers the kernels share (dantinox/kernels/*.h): name -> text."""
    folder = resources.files("dantinox.backend").joinpath("kernels")
    return {f.name: f.read_bytes() for f in folder.iterdir() if f.name.endswith(".h")}


def library_name(name: str, source: bytes, compiler: str, headers: dict[str, bytes]) -> str:
    """The file name of the library built from `name`: one per source and headers, jaxlib, compiler,
    flags and CPU."""
    shared = b"\0".join(text for _, text in sorted(headers.items()))
    key = hashlib.sha256(b"\0".join([source, shared, jax.lib.__version__.encode(), compiler.encode(),
                                     " ".join(FLAGS).encode(), _cpu_flags().encode()])).hexdigest()[:16]
    return f"{Path(name).stem}-{key}.so"


def build(name: str) -> Path:
    """The shared library of dantinox/backend/kernels/`name`: found in `cache_dirs()`, else compiled into the
    first of them this account can write; the path."""
    source = resources.files("dantinox.backend").joinpath("kernels", name).read_bytes()
    compiler = os.environ.get("CXX") or "g++"
    headers = _headers()
    file = library_name(name, source, compiler, headers)
    # the first folder that holds it (read-only is enough) or that this account can write, where it is built
    folder = next((f for f in cache_dirs() if (f / file).exists() or _writable(f)), None)
    if folder is None:
        raise RuntimeError(f"no folder to build {name} into: {', '.join(map(str, cache_dirs()))} cannot be "
                           "written")
    out = folder / file
    if out.exists():
        return out
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C++ compiler found ({compiler!r}; set CXX)")
    print(f"dantinox: building the CPU kernel {name} once, into {folder} ...", file=sys.stderr, flush=True)
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
        lib.chmod(0o644)  # other accounts of a class server load it too
        os.replace(lib, out)  # atomic: two processes building at once both end with a whole file
    return out


class Kernel:
    """One kernel library, dantinox/backend/kernels/`source`, and its handlers (custom-call target -> exported
    symbol), loaded once per process. `off_switch`=0 in the environment turns it off;
    `module` (the Python module that calls it) and `otherwise` (what runs instead) make why_not()'s line.
    `state` holds ok, why and, once asked, the JAX platform."""

    def __init__(self, module: str, source: str, targets: dict[str, str], off_switch: str, otherwise: str):
        self.module, self.source, self.targets = module, source, targets
        self.off_switch, self.otherwise = off_switch, otherwise
        self.state: dict[str, object] = {}

    def build(self) -> Path:
        """Compile the library if it is not built yet (`build`); its path."""
        return build(self.source)

    def load(self) -> str:
        """Build (where it is not built yet) and register the handlers for the CPU, once per process: at
        import, outside any trace. Why the kernel cannot be used, in one line ('' when it loaded):
        `off_switch`=0, no compiler, a failed build."""
        if "ok" not in self.state:
            try:
                if os.environ.get(self.off_switch, "1") == "0":
                    raise RuntimeError(f"turned off by {self.off_switch}=0")
                lib = ctypes.CDLL(str(self.build()))
                for target, symbol in self.targets.items():
                    jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)),
                                                platform="cpu")
                self.state.update(ok=True, why="")
            except (OSError, RuntimeError, AttributeError) as e:
                self.state.update(ok=False, why=self._not_used(str(e)))
        return str(self.state["why"])

    def available(self) -> bool:
        """Whether the kernel can run: loaded (`load`), and JAX's backend the CPU (asked here, not at import,
        so that importing dantinox starts no JAX backend)."""
        self.load()
        if self.state["ok"] and "platform" not in self.state:
            self.state["platform"] = jax.default_backend()
            if self.state["platform"] != "cpu":
                self.state["why"] = self._not_used(f"the kernel is for the CPU; the backend is "
                                                   f"{self.state['platform']!r}")
        return bool(self.state["ok"]) and self.state.get("platform") == "cpu"

    def why_not(self) -> str:
        """One line on why the kernel is not used ('' when it is)."""
        self.available()
        return str(self.state["why"])

    def _not_used(self, reason: str) -> str:
        return f"{self.module}: not used ({reason}); {self.otherwise}"
