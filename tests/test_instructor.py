"""The instructor notebook's records: a real class store from $DANTINOX_CLASSROOM_DB, or illustrative ones."""

from __future__ import annotations

import time

import pytest

from classroom import instructor
from classroom.exercise_catalogue import CATALOGUE, grade_exercise, is_exercise
from classroom.service import DB_ENV_VAR
from classroom.store import AnswerStore, Attempt, new_key
from classroom.summary import exercise_rows, learner_rows


def _attempt(learner: str, entry: str, check: int, correct: bool) -> Attempt:
    return Attempt(key=new_key(), learner=learner, entry_id=entry, check_index=check, question="q", params={},
                   response="r", expected="e", correct=correct, attempt=1, time=time.time(), content_version="0" * 64)


def test_the_notebook_reads_the_services_store_when_it_is_configured(tmp_path, monkeypatch):
    assert instructor.ENV_VAR == DB_ENV_VAR  # the variable the service writes its store to
    path = tmp_path / "classroom.sqlite"
    with AnswerStore(path) as store:
        for attempt in (_attempt("ada", "kv-cache", 0, True), _attempt("ada", "kv-cache", 1, False),
                        _attempt("<bo>", "paged-attention", 0, True)):
            store.add(attempt)
    monkeypatch.setenv(instructor.ENV_VAR, str(path))
    records = instructor.class_records()
    assert records.label == f"measured: the records in {path}"
    assert len(records.attempts) == 3 and set(records.entries) == {"kv-cache", "paged-attention"}
    html = instructor.learner_table_html(learner_rows(records.attempts, records.entries), records.entries)
    assert "&lt;bo&gt;" in html and "<bo>" not in html  # learner names are escaped
    kv_checks = len(records.entries["kv-cache"].checks)
    assert f"<td>ada</td><td align=right>1/2</td><td align=right>2/{kv_checks}</td><td align=right>–</td>" in html


def test_a_class_store_held_by_the_running_service_is_one_line(tmp_path, monkeypatch):
    path = tmp_path / "classroom.sqlite"
    service = AnswerStore(path, exclusive=True)  # as the service holds it while it runs
    service.add(_attempt("ada", "kv-cache", 0, True))
    monkeypatch.setenv(instructor.ENV_VAR, str(path))
    try:
        with pytest.raises(ValueError, match=r"^\$DANTINOX_CLASSROOM_DB: .* is held by the running classroom service"):
            instructor.class_records()
    finally:
        service.close()
    assert len(instructor.class_records().attempts) == 1  # once the service let go, it reads (and writes nothing)


def test_a_missing_class_store_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(instructor.ENV_VAR, str(tmp_path / "none.sqlite"))
    with pytest.raises(ValueError, match=r"^\$DANTINOX_CLASSROOM_DB: expected a class's answer store .* got "):
        instructor.class_records()


def test_without_a_class_store_the_records_are_illustrative(monkeypatch):
    monkeypatch.delenv(instructor.ENV_VAR, raising=False)
    records = instructor.class_records(learners=3, seed=1)
    assert records.label == "illustrative records" and set(records.entries) == set(instructor.ILLUSTRATIVE_ENTRIES)
    assert len({a.learner for a in records.attempts}) == 3


def test_the_illustrative_class_checked_exercises_as_a_kernel_reports_them(monkeypatch):
    monkeypatch.delenv(instructor.ENV_VAR, raising=False)
    attempts = instructor.class_records().attempts
    checks = [a for a in attempts if is_exercise(a.entry_id)]
    for a in checks:  # each is a record the service would accept and keep as it is
        assert grade_exercise(a, now=a.time) == a
    rows = exercise_rows(attempts)
    assert [r["exercise"] for r in rows] == list(CATALOGUE)  # every exercise, in the dashboard's order
    assert any(r["not_yet"] for r in rows) and any(r["passed_by"] for r in rows)
    assert any(r["commonest_mistake"] for r in rows)
    quiz = [a for a in attempts if not is_exercise(a.entry_id)]
    assert len(quiz) + len(checks) == len(attempts) and quiz  # the quiz records are still there beside them


def _check(learner: str, exercise: str, correct: bool, mistake: str | None, t: float) -> Attempt:
    return Attempt(key=new_key(), learner=learner, entry_id=exercise, check_index=0, question="q",
                   params={"seed": 1, "cases": 8}, response="r", expected="e", correct=correct, attempt=1,
                   time=t, content_version="0" * 64, mistake=mistake)


def test_the_notebooks_exercise_table_is_the_dashboards_rows_escaped(tmp_path, monkeypatch):
    path = tmp_path / "classroom.sqlite"
    with AnswerStore(path) as store:
        for attempt in (_check("ada", "d-ring-buffer", False, "slot-after-newest", 1.0),
                        _check("<bo>", "d-ring-buffer", False, "slot-after-newest", 2.0),
                        _check("ada", "d-ring-buffer", True, None, 3.0),
                        _check("cy", "d-ring-buffer", False, "window-plus-one", 4.0),
                        _attempt("cy", "kv-cache", 0, True)):
            store.add(attempt)
    monkeypatch.setenv(instructor.ENV_VAR, str(path))
    records = instructor.class_records()
    assert set(records.entries) == {"kv-cache"}  # an exercise id is never read as a concept entry
    html = instructor.exercise_table_html(exercise_rows(records.attempts))
    assert "<bo>" not in html and "&lt;bo&gt;" in html
    title = CATALOGUE["d-ring-buffer"].title
    assert (f"<td>{title}</td><td align=right>3</td><td align=right>4</td><td align=right>1</td><td>ada</td>"
            f"<td style='color:#777'>&lt;bo&gt;, cy</td><td>slot-after-newest (2)</td>") in html


def test_the_first_try_chart_shows_whole_question_labels():
    from classroom.plots import TICK_WIDTH, first_try_figure

    rows = [{"entry": "multi-head-latent-attention", "check": 1, "first_try_rate": 0.5, "first_try_right": 1,
             "learners": 2, "question": "q"}]
    fig = first_try_figure(rows, "illustrative")
    (label,) = fig.data[0].x
    assert label.replace("<br>", "") == "multi-head-latent-attention Q2"  # whole, not cut
    assert max(len(line) for line in label.split("<br>")) <= TICK_WIDTH and fig.layout.xaxis.automargin
