"""Where the data the labs read at run time lives: trained runs, the lab notebooks, benchmark measurements.

In a checkout these are the repository's `runs/`, `labs/` and `benchmarks/data/`; a wheel carries copies as
package data of `dantinox_labs` (pyproject.toml maps the folders), so `pip install .` outside the checkout
opens every lab. Only the standard library is imported here: widgets and the command line both read it.

    shipped.run("tiny")                      # a trained run directory
    shipped.LABS / "kv-cache.ipynb"          # a lab as shipped (learners open a copy: dantinox_labs.workspace)
    shipped.data("memory_savers.json")       # a measurement file the labs plot
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def _folder(installed: str, checkout: str) -> Path:
    """The wheel's copy when there is one, else the checkout's folder."""
    copy = HERE / installed
    return copy if copy.is_dir() else HERE.parent / checkout


RUNS = _folder("runs", "runs")  # one trained run directory per model the labs load
LABS = _folder("labs", "labs")  # the lab notebooks, <lab_id>.ipynb
DATA = _folder("data", "benchmarks/data")  # measurements and held-out text the labs read


def run(name: str) -> Path:
    """A shipped run directory by name ('tiny', 'tiny-gqa', ...); one line naming the choices if absent."""
    path = RUNS / name
    if not (path / "config.json").is_file():
        have = ", ".join(sorted(p.parent.name for p in RUNS.glob("*/config.json"))) or "none"
        raise ValueError(f"run: expected one of the shipped runs in {RUNS} ({have}), got {name!r}")
    return path


def data(name: str) -> Path:
    """A shipped measurement or text file by name ('memory_savers.json', 'heldout.txt')."""
    return DATA / name


def heldout_text() -> str:
    """The held-out text the quality measurements and the memory-savers lab read (never trained on)."""
    return data("heldout.txt").read_text(encoding="utf-8")
