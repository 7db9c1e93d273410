"""The learner's own copy of the labs, which JupyterLab opens so that the shipped notebooks are never rewritten.

    changes = prepare()            # copy what is missing or newly shipped; keep the learner's edits
    argv = lab_command(folder)     # jupyter lab on that copy: no nbgrader menus, widget outputs saved cleanly

`prepare` copies a shipped lab into the working folder ($DANTINOX_LABS_DIR, else `labs/` in the user's data
directory) when the lab is missing there, and replaces it when a newer version has shipped since it was
copied; a copy the learner changed (JupyterLab's autosave counts) is first kept under `earlier/`. A copy
that nothing new replaces stays exactly as the learner left it.

A widget's output is only a reference to a model in the kernel: saved without the model's state, it reads
"Error displaying widget: model not found" on every later visit. So each copy, and each save while the
learner works (`strip_stale_widgets`, the server's pre-save hook), replaces such outputs by the widget's
static HTML when it has one, else by a line saying to run the cell.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import platformdirs

from classroom.jupyterhub_config import LEARNER_JUPYTER_CONFIG
from classroom.lab_extensions import link_extensions
from dantinox_labs import shipped

ENV_VAR = "DANTINOX_LABS_DIR"
MANIFEST = ".shipped.json"  # lab name -> hashes of the shipped file and of the copy written from it
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
RERUN_HTML = ("<div style='color:#555;font-style:italic'>A live widget goes here: run this cell (or "
              "<b>Run &rarr; Run All Cells</b>) to show it.</div>")
RERUN_TEXT = "A live widget goes here: run this cell (or Run > Run All Cells) to show it."


def labs_folder() -> Path:
    """`$DANTINOX_LABS_DIR`, else labs/ in the user's data directory (~/.local/share/dantinox-labs/ on Linux)."""
    return Path(os.environ.get(ENV_VAR) or platformdirs.user_data_path("dantinox-labs") / "labs").expanduser()


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def strip_stale_widgets(notebook: dict) -> dict:
    """`notebook` (nbformat 4 JSON, changed in place) without widget outputs whose state it does not hold."""
    state = notebook.get("metadata", {}).get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            view = data.get(WIDGET_VIEW)
            if view is None or view.get("model_id") in state:
                continue
            html = data.get("text/html")
            output["data"] = {"text/html": html} if html else {"text/html": RERUN_HTML, "text/plain": RERUN_TEXT}
    return notebook


def pre_save_hook(model: dict, **_) -> None:
    """Jupyter server's ContentsManager.pre_save_hook: notebooks are saved without stale widget outputs."""
    if model.get("type") == "notebook" and isinstance(model.get("content"), dict):
        strip_stale_widgets(model["content"])


def _learner_copy(source: Path) -> bytes:
    notebook = strip_stale_widgets(json.loads(source.read_text(encoding="utf-8")))
    return (json.dumps(notebook, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def prepare(folder: Path | None = None, source: Path = shipped.LABS) -> list[str]:
    """Bring the working copy in `folder` up to date with the shipped labs; one line per change made."""
    folder = labs_folder() if folder is None else Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"${ENV_VAR}: {folder} is a file; expected a folder for your copy of the labs")
    folder.mkdir(parents=True, exist_ok=True)
    manifest_path = folder / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.is_file() else {}
    except json.JSONDecodeError:
        manifest = {}  # an unreadable manifest only means every existing copy counts as edited: nothing is lost
    changes = []
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for lab in sorted(source.glob("*.ipynb")):
        shipped_hash = _digest(lab.read_bytes())
        target, known = folder / lab.name, manifest.get(lab.name, {})
        if target.is_file() and known.get("shipped") == shipped_hash:
            continue  # nothing new shipped: the learner's copy stays as it is
        if target.is_file():
            if _digest(target.read_bytes()) != known.get("written"):
                kept = folder / "earlier" / f"{lab.stem}-{stamp}.ipynb"
                kept.parent.mkdir(exist_ok=True)
                shutil.move(target, kept)
                changes.append(f"{lab.name}: a newer version shipped; your copy is kept as {kept.relative_to(folder)}")
            else:
                changes.append(f"{lab.name}: updated to the newly shipped version")
        else:
            changes.append(f"{lab.name}: copied")
        data = _learner_copy(lab)
        target.write_bytes(data)
        manifest[lab.name] = {"shipped": shipped_hash, "written": _digest(data)}
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return changes


# JupyterLab's "get notified about official Jupyter news?" toast, which covers the lower right of every lab
LEARNER_DISABLED = {"@jupyterlab/apputils-extension:announcements": True}


def learner_config(folder: Path) -> Path:
    """A Jupyter config folder (for $JUPYTER_CONFIG_PATH): the pre-save hook, the extensions a learner's lab
    loads (no site-only ones) and the plugins it turns off (the news toast)."""
    config = folder / ".jupyter-config"
    config.mkdir(parents=True, exist_ok=True)
    server = {"ContentsManager": {"pre_save_hook": "dantinox_labs.workspace.pre_save_hook"},
              "LabApp": {"labextensions_path": [str(link_extensions(config / "labextensions"))]}}
    (config / "jupyter_server_config.json").write_text(json.dumps(server, indent=1) + "\n", encoding="utf-8")
    (config / "labconfig").mkdir(exist_ok=True)
    page = {"disabledExtensions": LEARNER_DISABLED}
    (config / "labconfig" / "page_config.json").write_text(json.dumps(page, indent=1) + "\n", encoding="utf-8")
    return config


def lab_command(folder: Path, extra: list[str]) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of the learner's JupyterLab on `folder`."""
    jupyter = Path(sys.executable).with_name("jupyter.exe" if os.name == "nt" else "jupyter")
    args = [str(jupyter), "lab", f"--ServerApp.root_dir={folder}"]
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY") or sys.platform == "darwin"):
        args.append("--no-browser")  # no screen: JupyterLab prints the URL with its token instead
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args.append("--allow-root")  # containers and CI machines often run as root; Jupyter refuses otherwise
    # LEARNER_JUPYTER_CONFIG: no nbgrader menus, the same folder the hub gives learners' servers
    paths = [str(learner_config(folder)), str(LEARNER_JUPYTER_CONFIG),
             *filter(None, os.environ.get("JUPYTER_CONFIG_PATH", "").split(os.pathsep))]
    return args + extra, {**os.environ, "JUPYTER_CONFIG_PATH": os.pathsep.join(paths)}
