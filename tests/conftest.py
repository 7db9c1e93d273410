import os

# Tests share one compilation cache per run so they never depend on (or pollute) the user's.
_HERE = os.path.dirname(os.path.abspath(__file__))
os.environ.setdefault("DANTINOX_JAX_CACHE_DIR", os.path.join(_HERE, "..", ".venv", "jax_cache_tests"))
