"""The dependency rule, checked over the source of every module, and the commands that must start without JAX.

    dantinox       the model library: no content, classroom, widgets, dantinox_labs, no Jupyter code,
                   no repository folder (runs/, benchmarks/, labs/) read by a path of its own; its reference
                   modules import nothing from its speed layer, dantinox/backend
    content        concept entries: no jax/flax/optax, no dantinox, widgets, classroom or dantinox_labs
    classroom      answers and the hub service: no model (jax, dantinox), no widgets, no dantinox_labs
    widgets        the labs' components: the libraries above, and from dantinox_labs only `shipped`
    dantinox_labs  the application that composes them; `shipped` itself needs nothing but the standard library

Every import counts, at the top of a module or inside a function (lazy imports too).
"""

from __future__ import annotations

import ast
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dantinox", "content", "classroom", "widgets", "dantinox_labs")
MODEL = {"jax", "jaxlib", "flax", "optax", "dantinox"}
JUPYTER = {"ipywidgets", "IPython", "traitlets", "anywidget", "plotly", "jupyterlab", "jupyter_server",
           "jupyter_client", "jupyterhub", "nbformat", "nbclient", "nbconvert", "nbgrader", "tornado", "notebook"}
FORBIDDEN = {  # package -> top-level names it must never import (dantinox_labs.shipped is the one exception)
    "dantinox": {"content", "classroom", "widgets", "dantinox_labs"} | JUPYTER,
    "content": MODEL | {"widgets", "classroom", "dantinox_labs"},
    "classroom": MODEL | {"widgets", "dantinox_labs"},
    "widgets": set(),
}
REPOSITORY_FOLDERS = {"runs", "benchmarks", "labs", "tests", "docs"}
FOLDER_PATH = re.compile(rf"(\.\.?/)*({'|'.join(REPOSITORY_FOLDERS)})/[\w./-]*")  # 'runs/tiny', '../labs/x.ipynb'


def modules(package: str) -> list[Path]:
    found = sorted((ROOT / package).rglob("*.py"))
    assert found, f"{package}: no modules found under {ROOT}"
    return found


def imports(path: Path, root: Path = ROOT) -> set[str]:
    """Every module name `path` imports anywhere (relative imports resolved), and importlib.import_module('x')."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)  # `from pkg import submodule`
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
              in {"import_module", "__import__"} and node.args and isinstance(node.args[0], ast.Constant)):
            names.add(str(node.args[0].value))
    return names


def folder_reads(path: Path) -> list[str]:
    """Places where a module builds a path into a repository folder or climbs out of its package."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if FOLDER_PATH.fullmatch(node.value.replace("\\", "/")):
                found.append(f"line {node.lineno}: path {node.value!r}")
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant)
                and node.right.value in REPOSITORY_FOLDERS):
            found.append(f"line {node.lineno}: ... / {node.right.value!r}")
        if isinstance(node, ast.Attribute) and node.attr == "parent" and getattr(node.value, "attr", "") == "parent":
            found.append(f"line {node.lineno}: .parent.parent climbs out of the package")
        if isinstance(node, ast.Attribute) and node.attr == "parents":
            found.append(f"line {node.lineno}: .parents[...] climbs out of the package")
    return found


def test_the_scanner_sees_lazy_relative_and_dynamic_imports(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "mod.py").write_text("def f():\n    import content.api\n    from . import sibling\n"
                                "    importlib.import_module('widgets.quiz')\n"
                                "    return Path(__file__).parent.parent / 'runs'\n")
    assert {"content.api", "pkg", "pkg.sibling", "widgets.quiz"} <= imports(pkg / "mod.py", tmp_path)
    assert len(folder_reads(pkg / "mod.py")) == 2


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_dependency_rule(package):
    broken = []
    for path in modules(package):
        for name in sorted(imports(path)):
            top = name.split(".")[0]
            if top in FORBIDDEN[package]:
                broken.append(f"{path.relative_to(ROOT)} imports {name}")
            if top == "dantinox_labs" and name not in {"dantinox_labs", "dantinox_labs.shipped"}:
                broken.append(f"{path.relative_to(ROOT)} imports {name} (widgets may use dantinox_labs.shipped only)")
    assert broken == []


# The reference a learner reads: these import nothing from the speed layer (dantinox/backend), which reaches them
# through dantinox/ops.py's hooks instead.
REFERENCE = ("architectures/model.py", "architectures/attention.py", "generation/generate.py", "ops.py",
             *(f"cache/{p.name}" for p in sorted((ROOT / "dantinox" / "cache").glob("*.py"))))


@pytest.mark.parametrize("name", REFERENCE)
def test_the_reference_imports_no_backend(name):
    found = sorted(n for n in imports(ROOT / "dantinox" / name) if n.startswith("dantinox.backend"))
    assert found == [], f"dantinox/{name} imports {found}"


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def test_no_import_circle_inside_dantinox():
    """No two dantinox modules reach each other by imports (lazy ones included): the layout modules register
    themselves in dantinox/cache/registry.py instead of the container importing them."""
    mods = {_module_name(p): p for p in modules("dantinox")}
    edges = {}
    for name, path in mods.items():
        edges[name] = set()
        for target in imports(path):
            while target and target not in mods:
                target = target.rpartition(".")[0]
            if target and target not in (name, "dantinox"):
                edges[name].add(target)

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen
    circles = sorted({" <-> ".join(sorted((a, b))) for a in edges for b in edges[a] if a in reach(b)})
    assert circles == []


def test_no_private_name_is_imported_across_dantinox_modules():
    crossing = []
    for path in modules("dantinox"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dantinox"):
                crossing += [f"{path.relative_to(ROOT)}: {node.module}.{a.name}" for a in node.names
                             if a.name.startswith("_") and a.name != "__future__"]
    assert crossing == []


def test_no_layout_capability_is_probed_with_hasattr():
    """Layouts declare what they can do (pooled, bounded, keeps_sinks, scored, fit_slots); nothing asks
    hasattr / getattr of a layout, an addressing or a payload."""
    probes = re.compile(r"(hasattr|getattr)\((lay|layout|addr|addressing|layer|lay\.addressing|layout\.addressing)\b")
    found = [f"{p.relative_to(ROOT)}:{i}" for p in modules("dantinox")
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if probes.search(line)]
    assert found == []


def test_the_backend_is_the_only_place_for_kernels_and_xla_options():
    """Kernel calls (jax.ffi) and XLA compiler options are named inside dantinox/backend only."""
    outside = []
    for path in modules("dantinox"):
        if "backend" in path.relative_to(ROOT / "dantinox").parts:
            continue
        text = path.read_text(encoding="utf-8")
        outside += [f"{path.relative_to(ROOT)}: {word}" for word in ("jax.ffi", "xla_cpu_") if word in text]
    assert outside == []


def test_the_reference_backend_is_pure_jax():
    """DANTINOX_BACKEND=reference installs nothing: no kernel is loaded, and a decode step of a model whose kernels
    would otherwise be taken (bfloat16 weights, an int8 cache) lowers to no custom call. A value it does not know
    is refused in one line that names the variable."""
    code = ("import sys, importlib, jax.numpy as jnp\nfrom flax import nnx\nimport dantinox, dantinox.ops as ops\n"
            "cfg = dantinox.ModelConfig.preset('test', kv_heads=2, param_dtype='bfloat16', cache_dtype='int8')\n"
            "model = dantinox.Transformer(cfg, rngs=nnx.Rngs(0))\n"
            "forward = importlib.import_module('dantinox.architectures.model')._compiled_forward\n"
            "text = forward.lower(*nnx.split(model), jnp.asarray([[3]]), dantinox.init_cache(cfg, 1, 16)).as_text()\n"
            "print(ops.current().name, 'custom_call' in text, 'dantinox.backend.cpu' in sys.modules)")
    res = python(code, env={**os.environ, "DANTINOX_BACKEND": "reference"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["reference", "False", "False"]
    res = python("import dantinox", env={**os.environ, "DANTINOX_BACKEND": "fast"})
    assert res.returncode != 0 and res.stderr.strip().splitlines()[-1] == (
        "ValueError: DANTINOX_BACKEND='fast': expected one of native, reference")


def test_shipped_data_needs_only_the_standard_library():
    names = {n.split(".")[0] for n in imports(ROOT / "dantinox_labs" / "shipped.py")}
    assert names <= set(sys.stdlib_module_names), names - set(sys.stdlib_module_names)


@pytest.mark.parametrize("package", ["dantinox", "content", "classroom", "widgets"])
def test_libraries_read_no_repository_folder(package):
    reads = [f"{path.relative_to(ROOT)} {where}" for path in modules(package) for where in folder_reads(path)]
    assert reads == []


def python(code: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120, **kw)


def test_content_check_runs_without_jax():
    res = python("import sys\nfrom dantinox_labs.cli import main\nrc = main(['content', 'check', 'content/entries'])\n"
                 "heavy = sorted(m for m in ('jax', 'flax', 'optax', 'dantinox', 'ipywidgets') if m in sys.modules)\n"
                 "print(rc, heavy)")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "0 []"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_classroom_serve_starts_without_jax(tmp_path):
    """The real command, as the hub starts it: every module it imported, from `-X importtime`, holds no JAX."""
    port = _free_port()
    env = {**os.environ, "JUPYTERHUB_API_TOKEN": "not-checked-at-start", "JUPYTERHUB_API_URL":
           "http://127.0.0.1:1/hub/api", "JUPYTERHUB_SERVICE_PREFIX": "/services/classroom/"}
    proc = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "dantinox_labs.cli", "classroom", "serve",
                             "--port", str(port), "--db", str(tmp_path / "class.sqlite")],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        else:
            pytest.fail(f"the service did not start: {proc.communicate(timeout=10)}")
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    lines = [line for line in err.splitlines() if line.startswith("import time:")]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in lines}
    assert "classroom" in imported and "tornado" in imported, err[-2000:]
    assert imported & (MODEL | {"widgets", "ipywidgets"}) == set()


def test_importing_the_command_line_imports_no_library():
    res = python("import sys, dantinox_labs.cli\n"
                 "print(sorted(m for m in ('jax', 'dantinox', 'content', 'classroom', 'widgets') if m in sys.modules))")
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stderr


def test_import_dantinox_without_os_sysconf():
    """Windows has no os.sysconf: the host's RAM comes from GlobalMemoryStatusEx (faked here) and the import works."""
    code = """
import ctypes, os
del os.sysconf

class Kernel32:
    def GlobalMemoryStatusEx(self, ref):
        ref._obj.ullTotalPhys = 16 * 2**30
        return 1

ctypes.windll = type("windll", (), {"kernel32": Kernel32()})()
import dantinox
print(dantinox.DEVICE_PRESETS["this machine (RAM)"].memory_bytes)
"""
    res = python(code, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(16 * 2**30)


def test_concept_widgets_run_without_jax_or_numpy(tmp_path):
    """The browser site's path: the map, the explorer, the card and the quiz, with numpy and JAX made unimportable."""
    res = python("import sys\nsys.modules.update(numpy=None, jax=None)\n"
                 "import content\nfrom widgets import ConceptCard, ConceptMap, FormulaExplorer, Quiz\n"
                 "entries = content.load_all()\nConceptMap(entries, selected='paged-attention')\n"
                 "FormulaExplorer(entries['kv-cache']).x_axis.value = 'T'\n"
                 "print(sorted(m for m in ('dantinox', 'flax') if m in sys.modules))",
                 env={**os.environ, "DANTINOX_ANSWERS_DB": str(tmp_path / "answers.sqlite")})
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "[]"
