"""Which JupyterLab extensions a lab server loads: every installed one but the course site's.

The site build (`dev.py site`) installs JupyterLite's kernel front end into the same environment; in a desktop
or hub JupyterLab it fails to load ("Shared module @jupyterlite/services doesn't exist in shared scope
default") on every page. JupyterLab loads the code of every federated extension it finds, even one that
`disabledExtensions` names, so the site-only ones are left out of the folders it searches instead: a folder of
links to the others, given to JupyterLab as `LabApp.labextensions_path`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path

SITE_ONLY_EXTENSIONS = ("@jupyterlite/",)


def link_extensions(target: Path, bases: Iterable[str | Path] | None = None) -> Path:
    """`target` made anew as a labextensions folder of links to the extensions under `bases` (default: every
    folder JupyterLab searches), the site-only ones left out; the first copy found of an extension wins, as
    in JupyterLab. Rebuilt at each call: an install may have added or removed one."""
    if bases is None:
        from jupyter_core.paths import jupyter_path

        bases = jupyter_path("labextensions")
    if target.exists():
        shutil.rmtree(target)  # removes the links, never what they point to
    target.mkdir(parents=True)
    for base in map(Path, bases):
        for package in sorted([*base.glob("[!@]*/package.json"), *base.glob("@*/*/package.json")]):
            name = package.parent.relative_to(base).as_posix()
            link = target / name
            if name.startswith(SITE_ONLY_EXTENSIONS) or link.exists():
                continue
            link.parent.mkdir(parents=True, exist_ok=True)
            try:
                link.symlink_to(package.parent, target_is_directory=True)
            except OSError:  # no symlinks (Windows without developer mode): a copy
                shutil.copytree(package.parent, link)
    return target


def environment_extensions() -> list[str]:
    """The labextensions folders of this Python environment and of the system, not of the account running it:
    what every account on a hub machine can read (a root-run hub's own ~/.local is not)."""
    from jupyter_core.paths import ENV_JUPYTER_PATH, SYSTEM_JUPYTER_PATH

    paths = [*ENV_JUPYTER_PATH, *SYSTEM_JUPYTER_PATH]
    if not any(Path(p) == Path(sys.prefix) / "share" / "jupyter" for p in paths):
        paths.insert(0, str(Path(sys.prefix) / "share" / "jupyter"))
    return [os.path.join(p, "labextensions") for p in paths]


def hub_lab_config(folder: Path) -> Path:
    """A Jupyter config folder (for every hub user's $JUPYTER_CONFIG_PATH) whose JupyterLab loads the
    environment's extensions but the site-only ones. Made readable by every account (the servers of a `pam`
    hub run as the learners'); the links point into the environment, which they can read too."""
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o755)
    links = link_extensions(folder / "labextensions", environment_extensions())
    for path in [links, *links.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            os.chmod(path, 0o755)
    server = {"LabApp": {"labextensions_path": [str(links)]}}
    config = folder / "jupyter_server_config.json"
    config.write_text(json.dumps(server, indent=1) + "\n", encoding="utf-8")
    os.chmod(config, 0o644)
    return folder
