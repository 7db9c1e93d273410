"""The course site's build, without a browser: the lock pins every browser package with its checksum and closes
over its dependencies; the folder handed to JupyterLite is the same byte for byte on a second build; the banner
names every lab left out; a first build without the registries stops with one line. (tests/browser/test_site.py
builds the whole site and runs it in Chromium.)"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dantinox_labs import site

ROOT = Path(__file__).resolve().parents[1]


def test_the_lock_pins_every_browser_package_with_a_checksum_and_closes_over_its_dependencies():
    lock = json.loads(site.LOCK.read_text())
    pinned = {w["name"]: w["version"] for w in lock["wheels"]}
    assert pinned == site.PINS
    assert (lock["pyyaml_sdist"]["name"], lock["pyyaml_sdist"]["version"]) == site.PYYAML
    assert lock["pyodide"]["npm"] == "@".join(site.PYODIDE_NPM) and lock["pyodide"]["integrity"].startswith("sha512-")
    names = set(pinned) | {"pyyaml"}
    for w in lock["wheels"]:
        assert re.fullmatch(r"[0-9a-f]{64}", w["sha256"]), w
        assert set(w["depends"]) <= names, w
        assert w["file"].endswith(("-py3-none-any.whl", "-py2.py3-none-any.whl", f"-{lock['platform']}.whl")), w
    assert set(site.SITE_DEPENDS) <= names


def _tree(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_staged_site_is_the_same_on_a_second_build(tmp_path):
    """Everything the project makes (wheels, pyodide-lock.json, config, notebooks) is byte-identical; the rest is
    JupyterLite's build, run with SOURCE_DATE_EPOCH (its reproducible-build setting)."""
    lock = json.loads(site.LOCK.read_text())
    site.stage(tmp_path / "a", lock, site.CACHE)
    site.stage(tmp_path / "b", lock, site.CACHE)
    first = _tree(tmp_path / "a")
    assert first == _tree(tmp_path / "b")
    pyodide_lock = json.loads((tmp_path / "a/static/pyodide/pyodide-lock.json").read_text())
    for name, entry in pyodide_lock["packages"].items():  # every file the browser loads is listed with its sha256
        assert first[f"static/pyodide/{entry['file_name']}"] == entry["sha256"], name
    config = json.loads((tmp_path / "a/jupyter-lite.json").read_text())["jupyter-config-data"]
    kernel = config["litePluginSettings"][site.KERNEL_PLUGIN]
    assert kernel["pyodideUrl"] == "./static/pyodide/pyodide.mjs" and kernel["disablePyPIFallback"] is True
    assert set(kernel["loadPyodideOptions"]["packages"]) == set(pyodide_lock["packages"])
    readme = (tmp_path / "a/files/README.md").read_text(encoding="utf-8")
    links = {m.split("#")[0] for m in re.findall(r"\]\(([^)\s]+)\)", readme) if not re.match(r"https?:|#", m)}
    assert "docs/screenshots/kv-cache.png" in links
    for link in links:  # the README's screenshots and pages are in the site beside it
        assert first.get(f"files/{link}") == hashlib.sha256((ROOT / link).read_bytes()).hexdigest(), link


def test_the_banner_names_every_lab_that_needs_the_full_install_and_the_two_commands():
    text = site.banner("concepts.ipynb")["source"]
    for lab in (ROOT / "labs").glob("*.ipynb"):
        assert f"`{lab.stem}`" in text or lab.name in site.NOTEBOOKS
    assert "`python3 dev.py lab`" in text and "`python3 dev.py test`" in text and "(README.md)" in text
    first = json.loads(site.site_notebook("concepts.ipynb"))["cells"]
    assert first[0]["source"] == text and first[1:] == json.loads((ROOT / "labs/concepts.ipynb").read_text())["cells"]


def test_a_first_build_without_the_registries_stops_with_one_line(tmp_path):
    dead = "http://127.0.0.1:9"  # nothing listens: every download fails at once
    env = {**os.environ, "https_proxy": dead, "http_proxy": dead, "HTTPS_PROXY": dead, "HTTP_PROXY": dead,
           "no_proxy": "", "NO_PROXY": "", "PIP_CONFIG_FILE": os.devnull, "PIP_RETRIES": "0", "PIP_TIMEOUT": "2"}
    res = subprocess.run([sys.executable, "-m", "dantinox_labs.site", "build", "--out", str(tmp_path / "site"),
                          "--cache", str(tmp_path / "empty")], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 1
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert res.stderr.startswith("site: could not download") and "package registries" in res.stderr
    assert not (tmp_path / "site").exists()


def test_a_readme_link_to_a_missing_file_stops_the_build_with_one_line(tmp_path, monkeypatch):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/here.png").write_bytes(b"png")
    (tmp_path / "README.md").write_text("![a](docs/here.png) [b](https://example.org) [c](#top) [d](docs/here.png#x)")
    monkeypatch.setattr(site, "ROOT", tmp_path)
    assert site.readme_files() == ["docs/here.png"]
    (tmp_path / "README.md").write_text("![a](docs/gone.png)")
    with pytest.raises(site.SiteError, match=r"README.md links to 'docs/gone.png': expected a file"):
        site.readme_files()
