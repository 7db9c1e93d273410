import os

# Tests share one compilation cache per run so they never depend on (or pollute) the user's.
os.environ.setdefault("DANTINOX_JAX_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".venv", "jax_cache_tests"))
