"""The one place that configures JAX for dantinox: the persistent compilation cache."""

from __future__ import annotations

import os
from pathlib import Path

import jax

ENV_VAR = "DANTINOX_JAX_CACHE_DIR"


def compilation_cache_dir() -> Path:
    """`$DANTINOX_JAX_CACHE_DIR`, else ~/.cache/jax_xla/dantinox."""
    return Path(os.environ.get(ENV_VAR) or Path.home() / ".cache" / "jax_xla" / "dantinox").expanduser()


def enable_compilation_cache() -> Path:
    """Persist compiled programs across processes, including this project's many sub-second ones."""
    path = compilation_cache_dir()
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # default 1 s would skip most
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path
