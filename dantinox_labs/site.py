"""The course in a browser tab: a static JupyterLite site with the Pyodide kernel, built from this checkout.

    python -m dantinox_labs.site build [--out build/site]   what `python3 dev.py site` runs
    python -m dantinox_labs.site lock                       maintainers: re-pin the browser packages

The site holds the notebooks that need no model (the concept map course and the instructor view), the
`content`, `widgets` and `classroom` code as one wheel, and every browser-side package pinned in
`site_lock.json` with its checksum: Python wheels from PyPI (fetched with pip), the Pyodide runtime from its
npm package, PyYAML as a pure-Python wheel made from its PyPI sdist. Everything is served from the site's
own origin (`pyodideUrl` points into the site; no CDN, no PyPI fallback). Downloads are kept in
`.venv/site-cache/`, so they happen once per clone; the same checkout gives the same site, byte for byte.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import email.parser
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LOCK = HERE / "site_lock.json"
CACHE = ROOT / ".venv" / "site-cache"
OUT = ROOT / "build" / "site"
NOTEBOOKS = ("concepts.ipynb", "instructor.ipynb")  # the labs that run without JAX
PLATFORM = "pyemscripten_2026_0_wasm32"  # Pyodide 314's wheel platform (PEP 783)
BROWSER_PYTHON = "3.14"
PYODIDE_FILES = ("pyodide.mjs", "pyodide.asm.mjs", "pyodide.asm.wasm", "python_stdlib.zip", "pyodide-lock.json")
# Federated extensions the site needs; everything else in the venv (nbgrader, JupyterLab's own) stays out.
EXTENSIONS = ("@jupyter-widgets/jupyterlab-manager", "jupyterlab-plotly", "anywidget",
              "@jupyterlite/pyodide-kernel-extension")
KERNEL_PLUGIN = "@jupyterlite/pyodide-kernel-extension:kernel"
# What the browser runs, at the versions the desktop venv uses where a browser wheel exists. The kernel's own
# ipykernel shim, pyodide-kernel and piplite wheels come with jupyterlite-pyodide-kernel (pinned in pyproject).
PINS = {
    "ipython": "9.18.1", "ipython-pygments-lexers": "1.1.1", "jedi": "0.20.1", "parso": "0.8.7", "comm": "0.2.3",
    "matplotlib-inline": "0.2.2", "prompt-toolkit": "3.0.53", "wcwidth": "0.9.4", "pygments": "2.21.0",
    "stack-data": "0.6.3", "executing": "2.3.0", "asttokens": "3.0.2", "pure-eval": "0.2.4", "traitlets": "5.16.1",
    "micropip": "0.11.1", "packaging": "26.4", "ipywidgets": "8.1.9", "plotly": "7.1.0", "narwhals": "2.29.0",
    "anywidget": "0.11.0", "psygnal": "0.16.1", "typing-extensions": "4.16.0", "pydantic": "2.14.4",
    "pydantic-core": "2.50.5", "annotated-types": "0.8.0", "typing-inspection": "0.4.5", "platformdirs": "4.14.9",
    "nbformat": "5.11.1", "fastjsonschema": "2.22.3", "jupyter-core": "5.9.1",
    "jsonschema": "4.17.3", "attrs": "26.1.0", "pyrsistent": "0.20.0",  # 4.18+ needs rpds-py: no browser wheel
}
PYYAML = ("pyyaml", "6.0.4")  # no browser wheel on PyPI: its pure-Python half, from the sdist
PYODIDE_NPM = ("pyodide", "314.0.6")  # the runtime jupyterlite-pyodide-kernel 0.8.6 is built for
PRELOAD_FIRST = ("micropip", "piplite", "ipykernel", "comm", "pyodide-kernel", "jedi", "ipython")
SITE_WHEEL = "dantinox_labs"  # our code for the browser: content, widgets, classroom, dantinox_labs.shipped
SITE_PACKAGES = ("content", "widgets", "classroom")
SITE_DEPENDS = ("pydantic", "pyyaml", "ipywidgets", "plotly", "anywidget", "platformdirs", "nbformat")
EPOCH = 1767225600  # 2026-01-01: the files' time stamp where the checkout's last commit time is unknown


class SiteError(RuntimeError):
    """One line for the user: what failed and what to do."""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "download", "--quiet", "--no-deps", *args]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        last = [line for line in res.stderr.splitlines() if line.startswith("ERROR")] or res.stderr.splitlines()
        raise SiteError(f"site: pip could not download the browser packages ({(last or ['no output'])[-1]}); "
                        "the first build needs the package registries") from None


def _npm_registry() -> str:
    return os.environ.get("npm_config_registry", "https://registry.npmjs.org").rstrip("/")


def _fetch(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=120) as response:
            return response.read()
    except OSError as err:
        raise SiteError(f"site: could not download {url} ({err}); "
                        "the first build needs the package registries") from None


# Lock ----------------------------------------------------------------------------------------------------
def _wheel_metadata(path: Path) -> tuple[list[str], list[str]]:
    """(requirements for the browser, top-level import names) read from a wheel."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    env = {**default_environment(), "sys_platform": "emscripten", "platform_system": "Emscripten",
           "python_version": BROWSER_PYTHON, "python_full_version": BROWSER_PYTHON + ".0",
           "platform_machine": "wasm32", "os_name": "posix", "extra": ""}
    with zipfile.ZipFile(path) as whl:
        names = whl.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        message = email.parser.Parser().parsestr(whl.read(meta).decode())
    depends = []
    for line in message.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(env):
            depends.append(_norm(req.name))
    tops = set()
    for n in names:
        first = n.split("/")[0]
        if first.endswith((".dist-info", ".data")):
            continue
        if "/" in n or first.endswith(".py"):
            tops.add(first.removesuffix(".py"))
    return sorted(set(depends)), sorted(t for t in tops if t.isidentifier())


def make_lock() -> dict:
    """Download every pinned package once, and write what the site needs of each: file, sha256, deps, imports."""
    with tempfile.TemporaryDirectory() as tmp:
        dl = Path(tmp)
        _pip("--only-binary=:all:", f"--platform={PLATFORM}", f"--python-version={BROWSER_PYTHON}",
             "--implementation=cp", f"--abi=cp{BROWSER_PYTHON.replace('.', '')}", "-d", str(dl),
             *(f"{n}=={v}" for n, v in PINS.items()))
        _pip("--no-binary=:all:", "--no-build-isolation", "-d", str(dl), f"{PYYAML[0]}=={PYYAML[1]}")
        wheels = []
        for path in sorted(dl.glob("*.whl")):
            name = _norm(path.name.split("-")[0])
            depends, imports = _wheel_metadata(path)
            kept = [d for d in depends if d in PINS or d == PYYAML[0]]
            wheels.append({"name": name, "version": PINS[name], "file": path.name, "sha256": _sha256(path),
                           "depends": kept, "not_in_browser": sorted(set(depends) - set(kept)), "imports": imports})
        sdist = next(dl.glob("*.tar.gz"))
        meta = json.loads(_fetch(f"{_npm_registry()}/{PYODIDE_NPM[0]}/{PYODIDE_NPM[1]}"))
        lock = {"about": "Browser packages of the site (python -m dantinox_labs.site lock writes this file).",
                "platform": PLATFORM, "python": BROWSER_PYTHON,
                "pyodide": {"npm": f"{PYODIDE_NPM[0]}@{PYODIDE_NPM[1]}", "tarball": meta["dist"]["tarball"],
                            "integrity": meta["dist"]["integrity"]},
                "pyyaml_sdist": {"name": PYYAML[0], "version": PYYAML[1], "file": sdist.name,
                                 "sha256": _sha256(sdist)},
                "wheels": wheels}
    LOCK.write_text(json.dumps(lock, indent=1) + "\n")
    return lock


# Downloads (once per clone) ------------------------------------------------------------------------------
def _read_lock() -> dict:
    try:
        return json.loads(LOCK.read_text())
    except (OSError, ValueError) as err:
        raise SiteError(f"site: {LOCK}: expected the browser package lock ({err})") from None


def fetch_wheels(lock: dict, cache: Path) -> dict[str, Path]:
    """Every locked wheel in the cache, checked against its sha256; pip fetches the missing ones."""
    wheels_dir = cache / "wheels"
    wheels_dir.mkdir(parents=True, exist_ok=True)
    missing = [w for w in lock["wheels"] if not (wheels_dir / w["file"]).is_file()]
    if missing:
        with tempfile.TemporaryDirectory() as tmp:
            reqs = Path(tmp) / "requirements.txt"
            reqs.write_text("".join(f"{w['name']}=={w['version']} --hash=sha256:{w['sha256']}\n" for w in missing))
            _pip("--only-binary=:all:", f"--platform={lock['platform']}", f"--python-version={lock['python']}",
                 "--implementation=cp", f"--abi=cp{lock['python'].replace('.', '')}", "--require-hashes",
                 "-r", str(reqs), "-d", str(wheels_dir))
    out = {}
    for w in lock["wheels"]:
        path = wheels_dir / w["file"]
        if not path.is_file() or _sha256(path) != w["sha256"]:
            raise SiteError(f"site: {path}: expected sha256 {w['sha256']} from {LOCK.name}; delete it and rebuild")
        out[w["name"]] = path
    return out


def fetch_pyyaml_sdist(lock: dict, cache: Path) -> Path:
    sd = lock["pyyaml_sdist"]
    path = cache / "sdists" / sd["file"]
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            reqs = Path(tmp) / "requirements.txt"
            reqs.write_text(f"{sd['name']}=={sd['version']} --hash=sha256:{sd['sha256']}\n")
            _pip("--no-binary=:all:", "--no-build-isolation", "--require-hashes", "-r", str(reqs),
                 "-d", str(path.parent))
    if _sha256(path) != sd["sha256"]:
        raise SiteError(f"site: {path}: expected sha256 {sd['sha256']} from {LOCK.name}; delete it and rebuild")
    return path


def fetch_pyodide(lock: dict, cache: Path) -> Path:
    """The Pyodide runtime files from its npm package, checked against the lock's sha512 integrity."""
    spec = lock["pyodide"]
    folder = cache / spec["npm"].replace("@", "-")
    if all((folder / f).is_file() for f in PYODIDE_FILES):
        return folder
    data = _fetch(spec["tarball"])
    algo, want = spec["integrity"].split("-", 1)
    got = base64.b64encode(hashlib.new(algo, data).digest()).decode()
    if got != want:
        raise SiteError(f"site: {spec['tarball']}: expected integrity {spec['integrity']}, got {algo}-{got}")
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for name in PYODIDE_FILES:
            member = tar.extractfile(f"package/{name}")
            if member is None:
                raise SiteError(f"site: {spec['npm']}: expected package/{name} in the npm package")
            (folder / name).write_bytes(member.read())
    return folder


# Wheels the site makes ---------------------------------------------------------------------------------
def write_wheel(path: Path, name: str, version: str, files: dict[str, bytes], requires: tuple[str, ...] = ()) -> Path:
    """A py3-none-any wheel with fixed time stamps and sorted entries: the same files give the same bytes."""
    dist = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    entries = {**files, f"{dist}/METADATA": meta.encode(),
               f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: dantinox_labs.site\nRoot-Is-Purelib: true\n"
                                b"Tag: py3-none-any\n"}
    record = "".join(f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()},"
                     f"{len(b)}\n" for n, b in sorted(entries.items())) + f"{dist}/RECORD,,\n"
    entries[f"{dist}/RECORD"] = record.encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as whl:
        for n in sorted(entries):
            info = zipfile.ZipInfo(n, date_time=(2026, 1, 1, 0, 0, 0))
            info.compress_type, info.external_attr = zipfile.ZIP_DEFLATED, 0o644 << 16
            whl.writestr(info, entries[n])
    return path


def pyyaml_wheel(sdist: Path, out: Path, version: str) -> Path:
    """PyYAML without its C extension: the `yaml` package from the sdist (it falls back to pure Python)."""
    files = {}
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            if member.isfile() and parts[1:3] == ["lib", "yaml"] and member.name.endswith(".py"):
                files["yaml/" + "/".join(parts[3:])] = tar.extractfile(member).read()
    if "yaml/__init__.py" not in files:
        raise SiteError(f"site: {sdist}: expected lib/yaml/__init__.py in the PyYAML sdist")
    return write_wheel(out / f"pyyaml-{version}-py3-none-any.whl", "pyyaml", version, files)


def site_wheel(out: Path) -> Path:
    """content (with its entries), widgets, classroom and dantinox_labs.shipped: the browser's course code."""
    files = {}
    for package in SITE_PACKAGES:
        for path in sorted((ROOT / package).rglob("*")):
            rel = path.relative_to(ROOT).as_posix()
            if path.is_file() and "__pycache__" not in rel and path.suffix in {".py", ".yaml", ".json"}:
                files[rel] = path.read_bytes()
    for name in ("__init__.py", "shipped.py"):
        files[f"dantinox_labs/{name}"] = (HERE / name).read_bytes()
    return write_wheel(out / f"{SITE_WHEEL}-0.1.0-py3-none-any.whl", SITE_WHEEL, "0.1.0", files, SITE_DEPENDS)


# The site --------------------------------------------------------------------------------------------------
def _lock_entry(path: Path, name: str, version: str, depends: list[str], imports: list[str]) -> dict:
    return {"name": name, "version": version, "file_name": path.name, "install_dir": "site",
            "sha256": _sha256(path), "package_type": "package", "imports": imports, "depends": depends,
            "unvendored_tests": False}


def _kernel_wheels() -> list[Path]:
    pypi = Path(sys.prefix) / "share/jupyter/labextensions/@jupyterlite/pyodide-kernel-extension/static/pypi"
    wheels = [p for p in sorted(pypi.glob("*.whl")) if not p.name.startswith("widgetsnbextension-3")]
    if not wheels:
        raise SiteError(f"site: {pypi}: expected the Pyodide kernel's wheels (pip install the [dev] extras)")
    return wheels


def banner(notebook: str) -> dict:
    """The first cell of every site notebook: what runs here, what needs the full install, the two commands."""
    here = ", ".join(f"`{n}`" for n in NOTEBOOKS)
    elsewhere = sorted(p.stem for p in (ROOT / "labs").glob("*.ipynb") if p.name not in NOTEBOOKS)
    text = (
        "> **The browser edition.** This notebook runs in your browser (Python on Pyodide, nothing installed). "
        f"It holds the labs that need no model: {here}. Every number is computed by the same content code as "
        "in JupyterLab; your quiz answers are kept in this browser's own storage for this site.\n>\n"
        "> The labs that run a real model need the full install (JAX): "
        + ", ".join(f"`{n}`" for n in elsewhere) + ". On a machine with Python 3.11, from a clone of the "
        "repository (see [README.md](README.md), *The two commands*):\n>\n"
        "> `python3 dev.py lab` opens every lab in JupyterLab; `python3 dev.py test` runs the whole test suite.")
    return {"cell_type": "markdown", "id": "browser-edition", "metadata": {}, "source": text}


def site_notebook(name: str) -> bytes:
    nb = json.loads((ROOT / "labs" / name).read_text())
    nb["cells"].insert(0, banner(name))
    return (json.dumps(nb, indent=1, ensure_ascii=False) + "\n").encode()


@contextlib.contextmanager
def _cache_lock(cache: Path):
    """One download at a time into `cache` (two test workers may build at once)."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as handle:
        try:
            import fcntl
        except ImportError:  # Windows: no second worker shares a cache there in practice
            yield
            return
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def stage(lite: Path, lock: dict, cache: Path) -> None:
    """The JupyterLite input folder: config, the Pyodide folder with every wheel and its lock, the notebooks."""
    with _cache_lock(cache):
        pyodide_src = fetch_pyodide(lock, cache)
        wheels = fetch_wheels(lock, cache)
        sdist = fetch_pyyaml_sdist(lock, cache)
    static = lite / "static" / "pyodide"
    static.mkdir(parents=True)
    for name in PYODIDE_FILES[:-1]:
        shutil.copyfile(pyodide_src / name, static / name)
    base = json.loads((pyodide_src / "pyodide-lock.json").read_text())
    packages = {}
    for w in lock["wheels"]:
        shutil.copyfile(wheels[w["name"]], static / w["file"])
        packages[w["name"]] = _lock_entry(static / w["file"], w["name"], w["version"], w["depends"], w["imports"])
    made = pyyaml_wheel(sdist, static, lock["pyyaml_sdist"]["version"])
    packages["pyyaml"] = _lock_entry(made, "pyyaml", lock["pyyaml_sdist"]["version"], [], ["yaml"])
    for whl in _kernel_wheels():
        target = static / whl.name
        shutil.copyfile(whl, target)
        depends, imports = _wheel_metadata(target)
        name, version = _norm(whl.name.split("-")[0]), whl.name.split("-")[1]
        packages[name] = _lock_entry(target, name, version, [d for d in depends if d in packages or
                                                             d in {"pyodide-kernel", "ipykernel"}], imports)
    ours = site_wheel(static)
    packages[_norm(SITE_WHEEL)] = _lock_entry(ours, _norm(SITE_WHEEL), "0.1.0", list(SITE_DEPENDS),
                                              ["content", "widgets", "classroom", "dantinox_labs"])
    for entry in packages.values():
        unknown = [d for d in entry["depends"] if d not in packages]
        if unknown:
            raise SiteError(f"site: {entry['name']} depends on {', '.join(unknown)}, which is not in {LOCK.name}")
    (static / "pyodide-lock.json").write_text(json.dumps(
        {"info": base["info"], "packages": dict(sorted(packages.items()))}, indent=1, sort_keys=True) + "\n")
    preload = [*PRELOAD_FIRST, *sorted(set(packages) - set(PRELOAD_FIRST))]
    config = {"jupyter-lite-schema-version": 0, "jupyter-config-data": {
        "appName": "DantinoX Labs in the browser",
        "litePluginSettings": {KERNEL_PLUGIN: {
            "pyodideUrl": "./static/pyodide/pyodide.mjs", "disablePyPIFallback": True,
            "loadPyodideOptions": {"packages": preload}}}}}
    (lite / "jupyter-lite.json").write_text(json.dumps(config, indent=1) + "\n")
    extensions = lite / "labextensions"
    build_config = {"LiteBuildConfig": {"ignore_sys_prefix": True},
                    "FederatedExtensionAddon": {"extra_labextensions_path": [extensions.name]}}  # from lite
    (lite / "jupyter_lite_config.json").write_text(json.dumps(build_config, indent=1) + "\n")
    for ext in EXTENSIONS:
        src = Path(sys.prefix) / "share/jupyter/labextensions" / ext
        if not (src / "package.json").is_file():
            raise SiteError(f"site: {src}: expected the {ext} lab extension (pip install the [dev] extras)")
        shutil.copytree(src, extensions / ext, ignore=shutil.ignore_patterns("*.map"))
    files = lite / "files"
    files.mkdir()
    for name in NOTEBOOKS:
        (files / name).write_bytes(site_notebook(name))
    shutil.copyfile(ROOT / "README.md", files / "README.md")
    for target in readme_files():  # the screenshots and pages it links to, so no link in the site is broken
        (files / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / target, files / target)


def readme_files() -> list[str]:
    """The repository files README.md links to by a relative path (a link's #fragment dropped), in order."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = dict.fromkeys(m.split("#", 1)[0] for m in re.findall(r"\]\(([^)\s]+)\)", text)
                            if not re.match(r"[a-z][a-z0-9+.-]*:|#", m))
    for target in targets:
        if not (ROOT / target).is_file() or ".." in Path(target).parts:
            raise SiteError(f"site: README.md links to {target!r}: expected a file inside the checkout")
    return list(targets)


def source_date() -> int:
    """The time stamp of every file in the site: the checkout's last commit, so a rebuild changes nothing."""
    try:
        res = subprocess.run(["git", "log", "-1", "--format=%ct"], cwd=ROOT, capture_output=True, text=True)
        return int(res.stdout.strip())
    except (OSError, ValueError):
        return EPOCH


def build(out: Path = OUT, cache: Path = CACHE) -> Path:
    """Build the site into `out` (replaced); returns it."""
    lock = _read_lock()
    out = Path(out).resolve()
    with tempfile.TemporaryDirectory(prefix="dantinox-site-") as tmp:
        lite = Path(tmp) / "lite"
        stage(lite, lock, Path(cache))
        build_dir = Path(tmp) / "site"
        cmd = [sys.executable, "-m", "jupyterlite_core", "build", "--lite-dir", str(lite), "--output-dir",
               str(build_dir), "--contents", str(lite / "files"), "--apps", "lab", "--apps", "notebooks",
               "--apps", "tree", "--no-sourcemaps", "--no-unused-shared-packages"]
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(source_date())}
        res = subprocess.run(cmd, cwd=lite, env=env, capture_output=True, text=True)
        if res.returncode:
            tail = (res.stderr or res.stdout).strip().splitlines()[-15:]
            raise SiteError("site: jupyter lite build failed:\n" + "\n".join(tail))
        for junk in (".jupyterlite.doit.db",):
            (build_dir / junk).unlink(missing_ok=True)
        if (build_dir / "lab" / "favicon.ico").is_file():  # browsers ask the root for one: no 404 in the console
            shutil.copyfile(build_dir / "lab" / "favicon.ico", build_dir / "favicon.ico")
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(build_dir), str(out))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dantinox_labs.site", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the static site")
    b.add_argument("--out", type=Path, default=OUT, help=f"output folder (replaced; default {OUT.relative_to(ROOT)})")
    b.add_argument("--cache", type=Path, default=CACHE, help="where downloads are kept (default .venv/site-cache)")
    sub.add_parser("lock", help=f"re-pin the browser packages into {LOCK.name}")
    args = parser.parse_args(argv)
    try:
        if args.command == "lock":
            lock = make_lock()
            print(f"site: {LOCK} lists {len(lock['wheels'])} wheels, PyYAML's sdist and {lock['pyodide']['npm']}")
        else:
            out = build(args.out, args.cache)
            files = [p for p in out.rglob("*") if p.is_file()]
            size = sum(p.stat().st_size for p in files)
            print(f"site: built {out} ({len(files)} files, {size / 2**20:.1f} MiB); serve the folder with any "
                  f"static web server, e.g. python3 -m http.server -d {out}")
    except SiteError as err:
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
