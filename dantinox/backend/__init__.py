"""The CPU speed layer, apart from the reference: native kernels, the rules that choose them, XLA:CPU options.

dantinox imports this package once, from its own __init__ (outside any trace). `DANTINOX_BACKEND` chooses:

    native     (the default) installs dantinox/backend/cpu.py's backend into dantinox.ops: C++ kernels
               (kernels/*.cc, XLA FFI custom calls, built by native.py) where they build and a measured rule
               takes them, XLA:CPU's faster arrangements and compiler options elsewhere
    reference  installs nothing: model.py, attention.py, cache.py and generate.py run as they read,
               in pure JAX

`NAME` is the backend in use.
"""

from __future__ import annotations

import os

from dantinox import ops

ENV = "DANTINOX_BACKEND"
CHOICES = ("native", "reference")


def _selected() -> str:
    name = os.environ.get(ENV) or "native"
    if name not in CHOICES:
        raise ValueError(f"{ENV}={name!r}: expected one of {', '.join(CHOICES)}")
    return name


NAME = _selected()
if NAME == "native":
    import dantinox.backend.cpu as cpu
    import dantinox.backend.dense_kernel as dense_kernel
    import dantinox.backend.pool_kernel as pool_kernel

    pool_kernel.load()  # here, outside any trace: a decode step's first trace never waits for a compiler
    dense_kernel.load()
    ops.install(cpu.CPU())
