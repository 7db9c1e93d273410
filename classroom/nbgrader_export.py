"""nbgrader source assignments from content entries: every check becomes an autograded question.

    write_assignment(["kv-cache", "multi-head-latent-attention"], "course/source/kv")   # one notebook per entry
    dantinox classroom nbgrader kv-cache --out course/source/kv                       # the same from a shell

A numeric check becomes an answer cell (`q1 = ...`, the solution computed from the science item now) and a
locked test cell whose hidden part recomputes the expected value from the entry's science item at grading
time and accepts it with the check's tolerance (the same `content.is_correct` rule as the lab quiz). A choice
check lists its options as letters; its hidden test compares with the entry's keyed option. `nbgrader
generate_assignment` strips the solutions and hidden tests from the release; the grading environment needs
this project installed, since hidden tests `import content`.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

import content
from content.units import tolerance_text

KERNEL = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def cell_meta(grade_id: str, *, solution: bool = False, grade: bool = False, locked: bool = False,
               points: float | None = None) -> dict[str, Any]:
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3, "solution": solution,
            "task": False}
    if grade:
        meta["points"] = points
    return {"nbgrader": meta}


def _number(value: float) -> str:
    return repr(float(f"{value:.12g}"))


def entry_notebook(entry: Any, points: float = 1.0) -> nbformat.NotebookNode:
    """One entry's checks as an nbgrader source notebook: per check a question, an answer cell, a test cell."""
    if isinstance(points, bool) or not isinstance(points, int | float) or not 0 < points <= 1000:
        raise ValueError(f"points: expected a number of points per check above 0 (at most 1000), got {points!r}")
    cells = [new_markdown_cell(
        f"# {entry.name}\n\n{entry.learning_objective}\n\nAnswer each question by setting the variable named "
        f"in it, then run the cell below it. {points:g} point(s) per question.",
        metadata=cell_meta("intro", locked=True))]
    load = f"import content\n_entry = content.load_entry({entry.id!r})\n"
    for i, check in enumerate(entry.checks):
        name, grade_id = f"q{i + 1}", f"{entry.id}-q{i + 1}"
        if check.kind == "numeric":
            expected = content.check_answer(entry, i)
            prompt = (f"**Q{i + 1}.** {content.render_question(entry, i)}\n\nSet `{name}` to your answer in "
                      f"**{check.unit}** (a number; accepted within {tolerance_text(check.tolerance)} of the "
                      f"formula's value).")
            solution = f"### BEGIN SOLUTION\n{name} = {_number(expected)}\n### END SOLUTION"
            visible = f"assert isinstance({name}, (int, float)), '{name}: expected a number in {check.unit}'\n"
            hidden = (f"{load}_expected = content.check_answer(_entry, {i})  # from the science item "
                      f"{check.science!r}\nassert content.is_correct(_entry, {i}, float({name})), \\\n"
                      f"    f'{name}: expected {{_expected:.6g}} {check.unit} within ±{check.tolerance:.0%}, "
                      f"got {{{name}!r}}'")
        else:
            letters = string.ascii_uppercase[:len(check.options)]
            options = "\n".join(f"- **{letter}.** {text}" for letter, text in zip(letters, check.options, strict=True))
            prompt = (f"**Q{i + 1}.** {check.question}\n\n{options}\n\nSet `{name}` to the letter of your answer "
                      f"(a string: one of {', '.join(repr(x) for x in letters)}).")
            solution = f"### BEGIN SOLUTION\n{name} = {letters[check.answer]!r}\n### END SOLUTION"
            visible = (f"assert isinstance({name}, str) and {name}.strip().upper() in {letters!r}, "
                       f"'{name}: expected one of the letters {letters}'\n")
            hidden = (f"{load}_key = {letters!r}[_entry.checks[{i}].answer]  # the entry's keyed option\n"
                      f"assert {name}.strip().upper() == _key, f'{name}: expected {{_key}}, got {{{name}!r}}'")
        cells += [new_markdown_cell(prompt, metadata=cell_meta(f"{grade_id}-question", locked=True)),
                  new_code_cell(solution, metadata=cell_meta(grade_id, solution=True)),
                  new_code_cell(f"{visible}### BEGIN HIDDEN TESTS\n{hidden}\n### END HIDDEN TESTS",
                                metadata=cell_meta(f"{grade_id}-test", grade=True, locked=True, points=points))]
    return new_notebook(cells=cells, metadata={"kernelspec": KERNEL, "language_info": {"name": "python"}})


def write_assignment(entry_ids: Sequence[str], out: str | Path, points: float = 1.0) -> list[Path]:
    """Write one source notebook per entry into `out` (an nbgrader `source/<assignment>` folder)."""
    if not entry_ids:
        raise ValueError("ENTRY: expected at least one entry id, got none")
    if len(set(entry_ids)) != len(entry_ids):
        raise ValueError(f"ENTRY: expected each entry once, got {', '.join(entry_ids)}")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out: expected a directory, got the file {out}")
    notebooks = [(entry_id, entry_notebook(content.load_entry(entry_id), points)) for entry_id in entry_ids]
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for entry_id, nb in notebooks:
        path = out / f"{entry_id}.ipynb"
        nbformat.write(nb, path)
        written.append(path)
    return written
