import os

# Tests share one compilation cache per run so they never depend on (or pollute) the user's.
_HERE = os.path.dirname(os.path.abspath(__file__))
os.environ.setdefault("DANTINOX_JAX_CACHE_DIR", os.path.join(_HERE, "..", ".venv", "jax_cache_tests"))
# Every process of the run uses it, not only the labs that turn it on: a program compiled once (a lab under
# nbval, then the same lab's kernel in the browser; the CLI's subprocesses) is read back, not compiled again.
# JAX reads these variables when it is imported, in this process and in every kernel and subprocess after it.
for _name, _value in (("JAX_COMPILATION_CACHE_DIR", os.environ["DANTINOX_JAX_CACHE_DIR"]),
                      ("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.05"),
                      ("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")):
    os.environ.setdefault(_name, _value)

# Quizzes write every attempt to an answer store: never the user's real one. Kernels that nbval starts
# inherit this session-wide file; each test below gets a fresh file of its own.
import tempfile  # noqa: E402

import pytest  # noqa: E402

os.environ["DANTINOX_ANSWERS_DB"] = os.path.join(tempfile.mkdtemp(prefix="dantinox-answers-"), "answers.sqlite")


@pytest.fixture(autouse=True)
def _own_answer_store(tmp_path, monkeypatch):
    monkeypatch.setenv("DANTINOX_ANSWERS_DB", str(tmp_path / "answers.sqlite"))

