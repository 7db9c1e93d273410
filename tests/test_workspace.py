"""The learner's working copy of the labs: copied, kept, updated without losing edits, saved without stale widgets."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from classroom.jupyterhub_config import LEARNER_JUPYTER_CONFIG
from dantinox_labs import shipped, workspace
from dantinox_labs.cli import main

VIEW = workspace.WIDGET_VIEW


def widget_outputs(notebook: dict) -> list[dict]:
    return [o for c in notebook["cells"] for o in c.get("outputs", []) if VIEW in o.get("data", {})]


def test_prepare_copies_every_lab_once_and_leaves_the_shipped_ones_alone(tmp_path):
    before = {p.name: p.read_bytes() for p in shipped.LABS.glob("*.ipynb")}
    assert any(widget_outputs(json.loads(data)) for data in before.values())  # the shipped labs hold widget views
    changes = workspace.prepare(tmp_path / "mine")
    assert changes == [f"{name}: copied" for name in sorted(before)]
    for name, data in before.items():
        copy = json.loads((tmp_path / "mine" / name).read_text(encoding="utf-8"))
        original = json.loads(data)
        assert widget_outputs(copy) == []  # none left to read "model not found"
        assert [c["source"] for c in copy["cells"]] == [c["source"] for c in original["cells"]]
    assert workspace.prepare(tmp_path / "mine") == []
    assert {p.name: p.read_bytes() for p in shipped.LABS.glob("*.ipynb")} == before


def test_a_stale_widget_keeps_its_static_html_or_says_to_run_the_cell():
    card = {"output_type": "display_data", "data": {VIEW: {"model_id": "a"}, "text/html": "<h3>card</h3>",
                                                     "text/plain": "ConceptCard(...)"}, "metadata": {}}
    lab = {"output_type": "display_data", "data": {VIEW: {"model_id": "b"}, "text/plain": "CacheLab(...)"},
           "metadata": {}}
    saved = {"output_type": "display_data", "data": {VIEW: {"model_id": "c"}, "text/plain": "Quiz(...)"},
             "metadata": {}}
    state = {"widgets": {workspace.WIDGET_STATE: {"state": {"c": {}}, "version_major": 2, "version_minor": 0}}}
    notebook = {"cells": [{"cell_type": "code", "outputs": [card, lab, saved]}], "metadata": state}
    model = {"type": "notebook", "content": notebook}
    workspace.pre_save_hook(model=model, path="x.ipynb", contents_manager=None)
    card_out, lab_out, saved_out = notebook["cells"][0]["outputs"]
    assert card_out["data"] == {"text/html": "<h3>card</h3>"}
    assert lab_out["data"] == {"text/html": workspace.RERUN_HTML, "text/plain": workspace.RERUN_TEXT}
    assert VIEW in saved_out["data"]  # its state is saved in the notebook: it still renders


def _shipped_copy(tmp_path: Path) -> Path:
    source = tmp_path / "shipped"
    source.mkdir()
    for name in ("mla.ipynb", "mesh.ipynb"):
        shutil.copy(shipped.LABS / name, source / name)
    return source


def test_a_newer_shipped_lab_replaces_an_untouched_copy_and_keeps_an_edited_one(tmp_path):
    source, mine = _shipped_copy(tmp_path), tmp_path / "mine"
    workspace.prepare(mine, source)
    edited = json.loads((mine / "mla.ipynb").read_text(encoding="utf-8"))
    edited["cells"][0]["source"] = "my own notes"
    (mine / "mla.ipynb").write_text(json.dumps(edited), encoding="utf-8")
    for name in ("mla.ipynb", "mesh.ipynb"):  # a new version of both ships
        nb = json.loads((source / name).read_text(encoding="utf-8"))
        nb["cells"][0]["source"] = "new text"
        (source / name).write_text(json.dumps(nb), encoding="utf-8")
    changes = workspace.prepare(mine, source)
    kept = sorted((mine / "earlier").glob("mla-*.ipynb"))
    assert len(kept) == 1 and json.loads(kept[0].read_text(encoding="utf-8"))["cells"][0]["source"] == "my own notes"
    assert changes == ["mesh.ipynb: updated to the newly shipped version",
                       f"mla.ipynb: a newer version shipped; your copy is kept as earlier/{kept[0].name}"]
    for name in ("mla.ipynb", "mesh.ipynb"):
        assert json.loads((mine / name).read_text(encoding="utf-8"))["cells"][0]["source"] == "new text"
    assert workspace.prepare(mine, source) == []


def test_an_edited_copy_stays_while_nothing_new_ships(tmp_path):
    source, mine = _shipped_copy(tmp_path), tmp_path / "mine"
    workspace.prepare(mine, source)
    (mine / "mesh.ipynb").write_text("{}", encoding="utf-8")  # whatever the learner or autosave left
    assert workspace.prepare(mine, source) == [] and (mine / "mesh.ipynb").read_text(encoding="utf-8") == "{}"
    (mine / workspace.MANIFEST).write_text("not json")  # a damaged manifest: every copy counts as edited
    workspace.prepare(mine, source)
    assert [p.read_text(encoding="utf-8") for p in (mine / "earlier").glob("mesh-*.ipynb")] == ["{}"]


def test_lab_command_prepares_the_folder_it_is_given_and_refuses_a_file(tmp_path, capsys):
    assert main(["lab", "--dir", str(tmp_path / "w"), "--prepare-only"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == str(tmp_path / "w") and "dantinox lab: kv-cache.ipynb: copied" in out
    (tmp_path / "f").write_text("x")
    assert main(["lab", "--dir", str(tmp_path / "f"), "--prepare-only"]) == 2
    assert capsys.readouterr().err.strip() == (f"dantinox lab: error: ${workspace.ENV_VAR}: {tmp_path / 'f'} is a "
                                               "file; expected a folder for your copy of the labs")


def test_the_learners_jupyterlab_hides_nbgrader(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", "/elsewhere")
    argv, env = workspace.lab_command(tmp_path, ["--port=1"])
    assert f"--ServerApp.root_dir={tmp_path}" in argv and argv[-1] == "--port=1"
    own, hidden, elsewhere = map(Path, env["JUPYTER_CONFIG_PATH"].split(os.pathsep))
    assert hidden == LEARNER_JUPYTER_CONFIG and elsewhere == Path("/elsewhere")  # the hub's learners get `hidden`
    hook = json.loads((own / "jupyter_server_config.json").read_text())["ContentsManager"]["pre_save_hook"]
    assert hook == "dantinox_labs.workspace.pre_save_hook"


def test_the_hidden_extensions_are_every_one_nbgrader_installs():
    import sys

    installed = Path(sys.prefix) / "etc" / "jupyter" / "jupyter_server_config.d" / "nbgrader.json"  # turns them on
    enabled = json.loads(installed.read_text())["ServerApp"]["jpserver_extensions"]
    server = json.loads((LEARNER_JUPYTER_CONFIG / "jupyter_server_config.json").read_text())
    assert server == {"ServerApp": {"jpserver_extensions": dict.fromkeys(enabled, False)}}  # a new one would show
    page = json.loads((LEARNER_JUPYTER_CONFIG / "labconfig" / "page_config.json").read_text())
    assert page == {"disabledExtensions": {"@jupyter/nbgrader": True,  # and JupyterLab's news toast, for the hub's
                                           "@jupyterlab/apputils-extension:announcements": True}}  # learners
    assert (Path(sys.prefix) / "share" / "jupyter" / "labextensions" / "@jupyter" / "nbgrader").is_dir()


def test_the_labs_folder_holds_only_the_labs():
    """Learners see notebooks there, not the test machinery (conftest.py, nbval's sanitizers live elsewhere)."""
    names = {p.name for p in shipped.LABS.iterdir() if p.is_file() and not p.name.startswith(".")}
    assert names and {Path(n).suffix for n in names} == {".ipynb"}, sorted(names)


def test_the_learners_jupyterlab_loads_no_site_only_extension_and_shows_no_news_toast(tmp_path):
    """Every page logged 'Shared module @jupyterlite/services doesn't exist' (the site build's kernel extension),
    and JupyterLab's news question covered the lower right of every lab."""
    import re
    import socket
    import subprocess
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv, env = workspace.lab_command(tmp_path, [f"--port={port}", "--ip=127.0.0.1", "--no-browser",
                                                 "--IdentityProvider.token=t"])
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    links = tmp_path / ".jupyter-config" / "labextensions"
    assert not list(links.glob("@jupyterlite/*")) and (links / "@jupyter-widgets" / "jupyterlab-manager").is_dir()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, page = time.time() + 90, None
        while page is None and time.time() < deadline:
            assert proc.poll() is None, "jupyter lab exited"
            try:
                page = urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token=t", timeout=5).read().decode()
            except OSError:
                time.sleep(0.3)
        config = json.loads(re.search(r'id="jupyter-config-data"[^>]*>(.*?)</script>', page, re.S).group(1))
        names = [e["name"] for e in config["federated_extensions"]]
        assert not [n for n in names if n.startswith("@jupyterlite/")]
        assert {"@jupyter-widgets/jupyterlab-manager", "jupyterlab-plotly", "anywidget"} <= set(names)
        assert "@jupyterlab/apputils-extension:announcements" in config["disabledExtensions"]
        assert "@jupyter/nbgrader" in config["disabledExtensions"]  # the hidden menus stay hidden
        widgets_ext = config["federated_extensions"][names.index("@jupyter-widgets/jupyterlab-manager")]
        url = f"http://127.0.0.1:{port}/lab/extensions/{widgets_ext['name']}/{widgets_ext['load']}?token=t"
        assert urllib.request.urlopen(url, timeout=10).status == 200  # served through the link
    finally:
        proc.terminate()
        proc.wait(timeout=20)
