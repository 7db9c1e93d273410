"""nbgrader export: nbgrader's own generate_assignment and autograde score a right and a wrong submission."""

import os
import shutil
import string
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

import content
from classroom.nbgrader_export import entry_notebook, write_assignment
from dantinox_labs.cli import main

ROOT = Path(__file__).resolve().parents[1]
NBGRADER = Path(sys.executable).with_name("nbgrader")


def answers(entry, wrong=()):
    """What a student types into each answer cell; checks in `wrong` get a wrong answer."""
    out = {}
    for i, check in enumerate(entry.checks):
        if check.kind == "numeric":
            value = content.check_answer(entry, i) * (3.0 if i in wrong else 1.0)
            out[i] = f"q{i + 1} = {value!r}"
        else:
            key = check.answer if i not in wrong else (check.answer + 1) % len(check.options)
            out[i] = f"q{i + 1} = {string.ascii_uppercase[key]!r}"
    return out


def test_source_notebook_has_nbgrader_cells_for_every_check():
    entry = content.load_entry("kv-cache")
    nb = entry_notebook(entry, points=2)
    graded = [c for c in nb.cells if c.metadata["nbgrader"]["grade"]]
    solutions = [c for c in nb.cells if c.metadata["nbgrader"]["solution"]]
    assert len(graded) == len(solutions) == len(entry.checks)
    assert all(c.metadata["nbgrader"]["points"] == 2 and c.metadata["nbgrader"]["locked"] for c in graded)
    assert all("### BEGIN HIDDEN TESTS" in c.source and "content.load_entry('kv-cache')" in c.source for c in graded)
    assert "content.check_answer(_entry, 0)" in graded[0].source  # recomputed at grading time, not typed
    assert f"q1 = {content.check_answer(entry, 0)!r}" in solutions[0].source
    with pytest.raises(ValueError, match="^points: expected a number of points per check above 0"):
        entry_notebook(entry, points=0)


def test_nbgrader_generates_and_autogrades_a_right_and_a_wrong_submission(tmp_path):
    course = tmp_path / "course"
    course.mkdir()
    (course / "nbgrader_config.py").write_text(
        f"c = get_config()\nc.CourseDirectory.root = {str(course)!r}\nc.CourseDirectory.course_id = 'dantinox'\n")
    entry = content.load_entry("kv-cache")
    assert main(["classroom", "nbgrader", "kv-cache", "--out", str(course / "source" / "kv"), "--points", "2"]) == 0
    # nbgrader runs `alembic` from PATH, as in an activated environment; the kernel imports content
    env = {**os.environ, "PATH": f"{NBGRADER.parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT)}

    def nbgrader(*args):
        done = subprocess.run([str(NBGRADER), *args], cwd=course, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    nbgrader("generate_assignment", "kv", "--force")
    released = nbformat.read(course / "release" / "kv" / "kv-cache.ipynb", as_version=4)
    text = "\n".join(c.source for c in released.cells)
    assert "BEGIN HIDDEN TESTS" not in text and "raise NotImplementedError()" in text
    wrong = {0, 2}  # one numeric and one choice check
    for student, wrong_checks in (("right", ()), ("wrong", wrong)):
        nb = nbformat.read(course / "release" / "kv" / "kv-cache.ipynb", as_version=4)
        typed = answers(entry, wrong_checks)
        for cell in nb.cells:
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id", "")
            if cell.metadata.get("nbgrader", {}).get("solution"):
                cell.source = typed[int(grade_id.rsplit("-q", 1)[1]) - 1]
        folder = course / "submitted" / student / "kv"
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / "kv-cache.ipynb")
    nbgrader("autograde", "kv", "--force")

    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        right, wrong_one = gb.find_submission("kv", "right"), gb.find_submission("kv", "wrong")
        n = len(entry.checks)
        assert (right.score, right.max_score) == (2.0 * n, 2.0 * n)
        assert (wrong_one.score, wrong_one.max_score) == (2.0 * (n - len(wrong)), 2.0 * n)
    shutil.rmtree(course)


def test_nbgrader_command_refuses_bad_input_in_one_line(tmp_path, capsys):
    assert main(["classroom", "nbgrader", "no-such-entry", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dantinox classroom nbgrader: error: id: expected one of the entries") and \
        err.count("\n") == 1
    (tmp_path / "file").write_text("x")
    assert main(["classroom", "nbgrader", "kv-cache", "--out", str(tmp_path / "file")]) == 2
    assert "--out: expected a directory, got the file" in capsys.readouterr().err
    assert main(["classroom", "nbgrader", "kv-cache", "kv-cache", "--out", str(tmp_path / "b")]) == 2
    assert "ENTRY: expected each entry once" in capsys.readouterr().err
    written = write_assignment(["kv-cache", "attention"], tmp_path / "two")
    assert [p.name for p in written] == ["kv-cache.ipynb", "attention.ipynb"]
