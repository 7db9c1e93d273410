"""The project's own promises: dependencies in step, dantinox free of Jupyter, compilation cache."""

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

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


def test_dantinox_never_imports_jupyter_packages():
    banned = {"ipywidgets", "IPython", "plotly", "anywidget", "jupyterlab", "ipykernel", "widgets", "nbformat"}
    for path in (ROOT / "dantinox").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                mods = [node.module or ""]
            else:
                continue
            for mod in mods:
                assert mod.split(".")[0] not in banned, f"{path.relative_to(ROOT)} imports {mod}"


_PROBE = """
import jax, jax.numpy as jnp
from jax import monitoring
hits = []
monitoring.register_event_listener(lambda name, **kw: hits.append(name))
import dantinox
print(dantinox._jax_setup.compilation_cache_dir())
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
