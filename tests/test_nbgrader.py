"""nbgrader export: nbgrader's own generate_assignment and autograde score a right and a wrong submission, of an
entry's quiz and of two exercises in the same assignment (one nbgrader run for both: each run costs seconds)."""

import inspect
import os
import re
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


EXERCISES = ("a-hybrid-bytes", "d-ring-buffer")  # model-free: the graded kernel loads no JAX


def exercise_answers(wrong: bool) -> dict[str, str]:
    """What a student types for each exercise: the lab's reference written out, or with a ring off by one."""
    from widgets.exercises import model_free as mf

    typed = {"a-hybrid-bytes": inspect.getsource(mf.hybrid_bytes),
             "d-ring-buffer": "import numpy as np\n\n" + inspect.getsource(mf.ring_view)}
    if wrong:  # the window-plus-one mistake: a query sees one key too many
        typed["d-ring-buffer"] = typed["d-ring-buffer"].replace("p - held < window", "p - held <= window")
        assert "<= window" in typed["d-ring-buffer"]
    return typed


def test_nbgrader_generates_and_autogrades_a_right_and_a_wrong_submission(tmp_path):
    course = tmp_path / "course"
    course.mkdir()
    (course / "nbgrader_config.py").write_text(
        f"c = get_config()\nc.CourseDirectory.root = {str(course)!r}\nc.CourseDirectory.course_id = 'dantinox'\n")
    entry = content.load_entry("kv-cache")
    assert main(["classroom", "nbgrader", "kv-cache", "--exercises", *EXERCISES, "--out", str(course / "source" / "kv"),
                 "--points", "2"]) == 0
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
    source = "\n".join(c.source for c in nbformat.read(course / "source" / "kv" / "exercises.ipynb", 4).cells)
    hidden = [int(x) for x in re.findall(r"for _seed in \[([\d, ]+)\]", source)[0].split(", ")]
    assert len(hidden) == 2 and min(hidden) >= 10**6  # seeds the lab's check button (below 10**6) never draws
    released = "\n".join(c.source for c in nbformat.read(course / "release" / "kv" / "exercises.ipynb", 4).cells)
    assert "BEGIN HIDDEN TESTS" not in released and "EXERCISES[" not in released and str(hidden[0]) not in released
    assert "def ring_view(window, slots, length):" in released and "seed=0" in released  # skeleton, visible check
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
        ex = nbformat.read(course / "release" / "kv" / "exercises.ipynb", as_version=4)
        typed = exercise_answers(wrong=bool(wrong_checks))
        for cell in ex.cells:
            if cell.metadata.get("nbgrader", {}).get("solution"):
                cell.source = typed[cell.metadata["nbgrader"]["grade_id"]]
        nbformat.write(ex, folder / "exercises.ipynb")
    nbgrader("autograde", "kv", "--force")

    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        right, wrong_one = gb.find_submission("kv", "right"), gb.find_submission("kv", "wrong")
        n = len(entry.checks) + len(EXERCISES)
        assert (right.score, right.max_score) == (2.0 * n, 2.0 * n)
        assert (wrong_one.score, wrong_one.max_score) == (2.0 * (n - len(wrong) - 1), 2.0 * n)
        graded = {g.name: g.score for g in gb.find_submission_notebook("exercises", "kv", "wrong").grades}
        assert graded == {"a-hybrid-bytes-test": 2.0, "d-ring-buffer-test": 0.0}
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
    assert main(["classroom", "nbgrader", "--exercises", "z-nope", "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dantinox classroom nbgrader: error: --exercises: expected ids among a-hybrid-bytes") \
        and err.count("\n") == 1
    assert main(["classroom", "nbgrader", "--out", str(tmp_path / "d")]) == 2
    assert "ENTRY: expected at least one entry id, got none" in capsys.readouterr().err


def test_every_exercise_exports_with_a_working_solution_and_a_skeleton_release():
    from dantinox_labs.exercise_assignment import exercise_notebook
    from widgets.exercises import EXERCISES as ALL

    nb = exercise_notebook(seeds=[10**6 + 1])
    solutions = {c.metadata["nbgrader"]["grade_id"]: c.source for c in nb.cells if c.metadata["nbgrader"]["solution"]}
    assert list(solutions) == list(ALL)
    for exercise_id, text in solutions.items():  # the source's solution is a working one: it passes the check
        namespace = {}
        exec(compile(text, exercise_id, "exec"), namespace)  # noqa: S102 - our own generated source
        ex = ALL[exercise_id]
        if ex.model_free:
            assert ex.check(namespace[ex.name], seed=1).passed, exercise_id
        stub = re.sub(r"( *)### BEGIN SOLUTION\n.*?### END SOLUTION", r"\1raise NotImplementedError", text,
                      flags=re.S)
        assert stub.strip() == ex.skeleton.strip(), exercise_id  # what the learner is given: the lab's skeleton
