"""`with compile_log() as names:` collects what JAX compiles inside the block, from JAX's own compile log.

Tests use it for "nothing compiles on the second call" instead of reading private jit caches.
"""

import contextlib
import logging
import re

import jax


@contextlib.contextmanager
def compile_log():
    """Names of the programs JAX compiles inside the block (e.g. `jit(broadcast_in_dim)`), in order."""
    names, logger = [], logging.getLogger("jax")

    class Collect(logging.Handler):
        def emit(self, record):
            match = re.match(r"Compiling (\S+)", record.getMessage())
            if match:
                names.append(match.group(1))

    handler = Collect()
    logger.addHandler(handler)
    previous = jax.config.jax_log_compiles
    jax.config.update("jax_log_compiles", True)  # global, not thread-local: the whole process logs meanwhile
    try:
        yield names
    finally:
        jax.config.update("jax_log_compiles", previous)
        logger.removeHandler(handler)
