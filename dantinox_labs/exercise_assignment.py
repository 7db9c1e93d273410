"""The exercises as an nbgrader assignment: the lab's skeletons to fill in, the lab's check visible, other
random cases hidden.

    write_exercises("course/source/exercises")                       # every exercise, one notebook
    write_exercises("course/source/ex", ["d-ring-buffer", "e-page-table"], points=2)
    dantinox classroom nbgrader --exercises [ID ...] --out course/source/exercises

Per exercise: a locked question (title, concept entry, lab), the skeleton as the answer cell, and a locked test
cell. In the source notebook each `raise NotImplementedError` of the skeleton is an nbgrader solution region
that hands the call to the exercise's reference (so `nbgrader generate_assignment` validates a working
solution); the release shows the skeleton with nbgrader's own "YOUR CODE HERE" in its place. The test cell runs
`widgets.exercises.check` — the lab's own check — on seed VISIBLE_SEED, which the learner sees and can run
before submitting; its hidden part runs the same check on seeds drawn at export time from [10**6, 2**31), a
range the lab's check button never draws from, so the graded cases are ones nobody has been shown. The
grading environment needs this project installed (the tests `import widgets.exercises`; (b) and (c) load
dantinox). So a submission could also import the reference from there and pass: nbgrader's manual review
(formgrader shows each answer cell) is where that is seen.
"""

from __future__ import annotations

import ast
import secrets
from collections.abc import Sequence
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from classroom.nbgrader_export import KERNEL, cell_meta
from widgets.exercises import EXERCISES, Exercise

VISIBLE_SEED = 0
HIDDEN_SEEDS = 2  # hidden checks per exercise
HIDDEN_RANGE = (10**6, 2**31)  # the lab's check button draws seeds below 10**6


def hidden_seeds(n: int = HIDDEN_SEEDS) -> list[int]:
    """`n` distinct seeds no lab check uses, drawn afresh for each export."""
    low, high = HIDDEN_RANGE
    seeds: set[int] = set()
    while len(seeds) < n:
        seeds.add(low + secrets.randbelow(high - low))
    return sorted(seeds)


def solution_source(ex: Exercise) -> str:
    """The skeleton with each `raise NotImplementedError` turned into a solution region that calls the reference
    (a method of a class skeleton calls the same method of a reference instance made in __init__)."""
    tree = ast.parse(ex.skeleton)
    calls: dict[int, str] = {}  # line of a `raise NotImplementedError` -> what the solution does instead
    ref = f"EXERCISES[{ex.id!r}].reference"
    for node in ast.walk(tree):
        methods = [f for f in node.body if isinstance(f, ast.FunctionDef)] if isinstance(node, ast.ClassDef) else []
        for fn in methods:
            args = ", ".join(a.arg for a in fn.args.args[1:])
            calls[fn.body[-1].lineno] = (f"self._solution = {ref}({args})" if fn.name == "__init__" else
                                         f"return self._solution.{fn.name}({args})")
    for fn in tree.body:
        if isinstance(fn, ast.FunctionDef):
            calls[fn.body[-1].lineno] = f"return {ref}({', '.join(a.arg for a in fn.args.args)})"
    lines = ex.skeleton.rstrip("\n").split("\n")
    for lineno, call in calls.items():
        line = lines[lineno - 1]
        if line.strip() != "raise NotImplementedError":
            raise ValueError(f"{ex.id}: expected the skeleton's line {lineno} to be `raise NotImplementedError`, "
                             f"got {line.strip()!r}")
        pad = line[:len(line) - len(line.lstrip())]
        body = ("from widgets.exercises import EXERCISES  # the instructor's copy: the reference", call) \
            if "EXERCISES[" in call else (call,)
        lines[lineno - 1] = "\n".join(pad + x for x in ("### BEGIN SOLUTION", *body, "### END SOLUTION"))
    return "\n".join(lines)


def exercise_notebook(ids: Sequence[str] | None = None, points: float = 1.0,
                      seeds: Sequence[int] | None = None) -> nbformat.NotebookNode:
    """The exercises `ids` (default: all, core first) as one nbgrader source notebook."""
    if isinstance(points, bool) or not isinstance(points, int | float) or not 0 < points <= 1000:
        raise ValueError(f"points: expected a number of points per exercise above 0 (at most 1000), got {points!r}")
    ids = list(EXERCISES) if not ids else list(ids)
    unknown = [i for i in ids if i not in EXERCISES]
    if unknown:
        raise ValueError(f"--exercises: expected ids among {', '.join(EXERCISES)}, got {', '.join(unknown)}")
    if len(set(ids)) != len(ids):
        raise ValueError(f"--exercises: expected each exercise once, got {', '.join(ids)}")
    cells = [new_markdown_cell(
        "# Exercises: build the KV cache\n\nFill in each cell below its question (keep the names), run it, then "
        f"run the check under it: that is the lab's own check on seed {VISIBLE_SEED}. Grading runs the same check "
        f"on other random cases. {points:g} point(s) per exercise.", metadata=cell_meta("intro", locked=True))]
    for ex in (EXERCISES[i] for i in ids):
        drawn = list(seeds) if seeds is not None else hidden_seeds()
        lab = f", lab `{ex.lab}`" if ex.lab else ""
        question = (f"## {ex.title}\n\n*{ex.tier}; concept entry `{ex.entry}`{lab}.* Write `{ex.name}` below; "
                    "its docstring says what it takes and returns.")
        visible = (f"from widgets.exercises import check\n\n"
                   f"_verdict = check({ex.id!r}, {ex.name}, seed={VISIBLE_SEED})\nprint(_verdict.message)\n"
                   f"assert _verdict.passed, _verdict.message\n")
        hidden = (f"for _seed in {drawn!r}:  # cases nobody was shown\n"
                  f"    _verdict = check({ex.id!r}, {ex.name}, seed=_seed)\n"
                  f"    assert _verdict.passed, _verdict.message")
        cells += [new_markdown_cell(question, metadata=cell_meta(f"{ex.id}-question", locked=True)),
                  new_code_cell(solution_source(ex), metadata=cell_meta(ex.id, solution=True)),
                  new_code_cell(f"{visible}### BEGIN HIDDEN TESTS\n{hidden}\n### END HIDDEN TESTS",
                                metadata=cell_meta(f"{ex.id}-test", grade=True, locked=True, points=points))]
    return new_notebook(cells=cells, metadata={"kernelspec": KERNEL, "language_info": {"name": "python"}})


def write_exercises(out: str | Path, ids: Sequence[str] | None = None, points: float = 1.0) -> Path:
    """Write `exercises.ipynb` into `out` (an nbgrader `source/<assignment>` folder); returns its path."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out: expected a directory, got the file {out}")
    nb = exercise_notebook(ids, points)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "exercises.ipynb"
    nbformat.write(nb, path)
    return path
