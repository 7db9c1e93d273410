"""A kernel of its own for one decode step: each sequence's cached slots read where they lie.

XLA:CPU can read a paged pool in two ways, and both cost: gathering each sequence's pages copies them every
step, and scoring every query against the whole pool computes the other sequences' scores only to mask them
(dantinox/paged.py weighs the two). dantinox/kernels/pool_attend.cc, an XLA FFI custom call, walks the pool
in blocks of 16 slots, skips the blocks a sequence's mask leaves empty and keeps a running softmax over the
rest, for float32 or bfloat16 keys and values and for int8 codes with their scales folded in.

It is C++ built on first use with the machine's compiler (`$CXX`, else g++) against the headers jaxlib
ships, into the user cache directory (`cache_dir`), and registered with XLA for the CPU.
dantinox.attention.attend uses it for one new token per sequence over a shared pool (paged) or, where its
measured rule `uses_kernel` says so, over a cache row per sequence. Where it cannot be built or the backend
is not the CPU, `available()` is False, `why_not()` says why in one line, and attention keeps XLA's reads.
`DANTINOX_POOL_KERNEL=0` turns it off (benchmarks/cache_steps.py times both).
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
import jax.numpy as jnp
import numpy as np

ENV = "DANTINOX_POOL_KERNEL"
CACHE_ENV = "DANTINOX_KERNEL_CACHE"
SOURCE = "pool_attend.cc"
FLAGS = ("-O3", "-march=native", "-ffast-math", "-std=c++17", "-shared", "-fPIC")
_TARGETS = {"float32": ("dantinox_pool_attend_float", "PoolAttendFloat"),
            "bfloat16": ("dantinox_pool_attend_bf16", "PoolAttendBf16"),
            "int8": ("dantinox_pool_attend_int8", "PoolAttendInt8")}
_state: dict[str, object] = {}


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


def library_path(source: bytes, compiler: str) -> Path:
    """Where the built library is kept: one file per source, jaxlib, compiler, flags and CPU."""
    key = hashlib.sha256(b"\0".join([source, jax.lib.__version__.encode(), compiler.encode(),
                                     " ".join(FLAGS).encode(), _cpu_flags().encode()])).hexdigest()[:16]
    return cache_dir() / f"pool_attend-{key}.so"


def build() -> Path:
    """Compile the kernel if it is not in the cache yet; the path of the shared library."""
    source = resources.files("dantinox").joinpath("kernels", SOURCE).read_bytes()
    compiler = os.environ.get("CXX") or "g++"
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C++ compiler found ({compiler!r}; set CXX)")
    out = library_path(source, compiler)
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        src, lib = Path(tmp) / SOURCE, Path(tmp) / out.name
        src.write_bytes(source)
        done = subprocess.run([compiler, *FLAGS, "-isystem", jax.ffi.include_dir(), str(src), "-o", str(lib)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise RuntimeError(f"{compiler} could not build {SOURCE}: {last}")
        os.replace(lib, out)  # atomic: two processes building at once both end with a whole file
    return out


def available() -> bool:
    """Whether `attend` can run: enabled, on the CPU backend, built and registered (once per process)."""
    if "ok" not in _state:
        try:
            if os.environ.get(ENV, "1") == "0":
                raise RuntimeError(f"turned off by {ENV}=0")
            if jax.default_backend() != "cpu":
                raise RuntimeError(f"the kernel is for the CPU; the backend is {jax.default_backend()!r}")
            lib = ctypes.CDLL(str(build()))
            for target, symbol in _TARGETS.values():
                jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
            _state.update(ok=True, why="")
        except (OSError, RuntimeError, AttributeError) as e:
            _state.update(ok=False, why=f"dantinox.pool_kernel: not used ({e}); paged decode reads through XLA")
    return bool(_state["ok"])


def why_not() -> str:
    """One line on why the kernel is not used ('' when it is)."""
    available()
    return str(_state["why"])


def handles(k_dtype, quantized: bool) -> bool:
    """Whether the kernel takes a pool stored in `k_dtype` (float32 or bfloat16, or int8 codes with scales)."""
    name = jnp.dtype(k_dtype).name
    return available() and (name == "int8") == quantized and name in _TARGETS


def attend(q_BKGH: jax.Array, k_RKHS: jax.Array, v_RKSH: jax.Array, mask_BS: jax.Array, scale: float,
           k_scale_RKS: jax.Array | None = None, v_scale_RKS: jax.Array | None = None) -> jax.Array:
    """One query token per sequence over cached keys and values: [B, K, G, H] float32 out, zeros for a row
    that sees no slot. Keys [R, K, H, S] and values [R, K, S, H] are float32 or bfloat16, or int8 codes with
    scales [R, K, S]; R = 1 is one pool every sequence reads (its mask picks its slots), R = B a row each."""
    R, B = k_RKHS.shape[0], q_BKGH.shape[0]
    if R not in (1, B):
        raise ValueError(f"k_RKHS: expected 1 or {B} rows (the batch), got {R}")
    out = jax.ShapeDtypeStruct(q_BKGH.shape, jnp.float32)
    args = [q_BKGH.astype(jnp.float32), k_RKHS, v_RKSH]
    target = _TARGETS[jnp.dtype(k_RKHS.dtype).name][0]
    if k_scale_RKS is not None:
        args += [k_scale_RKS.astype(jnp.float32), v_scale_RKS.astype(jnp.float32)]
    return jax.ffi.ffi_call(target, out)(*args, mask_BS.astype(bool), scale=np.float32(scale))
