"""The quiz writes every attempt to the answer store: resume, reset, classroom delivery, and the export command."""

import csv
import io
import json
import sys
import types

import pytest

import content
from classroom.store import AnswerStore
from dantinox_labs.cli import main
from widgets.quiz import Quiz


@pytest.fixture(scope="module")
def entry():
    return content.load_entry("kv-cache")


@pytest.fixture
def store(tmp_path):
    return AnswerStore(tmp_path / "answers.sqlite")


def choice_index(entry):
    return next(i for i, c in enumerate(entry.checks) if c.kind == "choice")


def test_every_attempt_is_written_as_it_happens(entry, monkeypatch, tmp_path):
    monkeypatch.setenv("JUPYTERHUB_USER", "ada")
    quiz = Quiz(entry)  # the default store: $DANTINOX_ANSWERS_DB, a fresh file per test
    i = choice_index(entry)
    check = entry.checks[i]
    quiz.answer(0, "6,291,456")
    quiz.answer(0, 6.0)
    quiz.answer(i, (check.answer + 1) % len(check.options))
    first, second, chosen = AnswerStore().attempts()
    assert AnswerStore().path == tmp_path / "answers.sqlite"
    assert (first.learner, first.entry_id, first.check_index, first.attempt, first.correct) == \
        ("ada", "kv-cache", 0, 1, False)
    assert first.response == "6,291,456" and float(first.expected) == content.check_answer(entry, 0)
    assert first.question == content.render_question(entry, 0) and first.params == dict(entry.checks[0].params)
    assert first.content_version == content.content_version("kv-cache")
    assert (second.attempt, second.correct, second.response) == (2, True, "6.0")
    assert chosen.response == check.options[(check.answer + 1) % len(check.options)]
    assert chosen.expected == check.options[check.answer] and chosen.params == {}
    assert first.time <= second.time <= chosen.time


def test_reopening_the_lab_resumes_answers_and_score(entry, store):
    i = choice_index(entry)
    quiz = Quiz(entry, learner="ada", store=store)
    quiz.answer(0, 6.0)
    quiz.answer(i, entry.checks[i].answer)
    again = Quiz(entry, learner="ada", store=store)
    assert again.score == 2 and "Score: 2 / 5" in again.score_html.value
    assert "Your earlier answer" in again.feedback[0].value and "Correct: 6 MiB" in again.feedback[0].value
    assert "Your earlier answer" in again.feedback[i].value and again.feedback[1].value == ""
    again.answer(0, 1.0)  # numbering continues where the first session stopped
    assert store.attempts("ada")[-1].attempt == 2 and again.score == 2
    other = Quiz(entry, learner="bo", store=store)
    assert other.score == 0 and other.attempts == []


def test_reset_starts_the_entry_over_but_keeps_the_rows(entry, store):
    quiz = Quiz(entry, learner="ada", store=store)
    quiz.answer(0, 6.0)
    quiz.inputs[1].value = "1"
    quiz.reset_button.click()
    assert quiz.score == 0 and quiz.feedback[0].value == "" and quiz.inputs[1].value == ""
    assert Quiz(entry, learner="ada", store=store).attempts == []
    quiz.answer(0, 1.0)
    assert store.attempts("ada")[-1].attempt == 1 and store.count() == 2


class FakeClient:
    """Stands in for classroom.client: records calls, delivers unless told the service is down."""

    def __init__(self):
        self.calls, self.down = 0, False

    def deliver_pending(self, store):
        self.calls += 1
        if self.down == "raise":  # the real client never raises, but nothing it could raise may reach the learner
            raise ConnectionError("service unreachable")
        if self.down == "report":
            return types.SimpleNamespace(delivered=0, pending=len(store.pending()), error="HTTP 503 unavailable")
        store.mark_delivered(a.key for a in store.pending())
        return types.SimpleNamespace(delivered=1, pending=0, error=None)


@pytest.fixture
def client(monkeypatch):
    fake = FakeClient()
    module = types.ModuleType("classroom.client")
    module.deliver_pending = fake.deliver_pending
    monkeypatch.setitem(sys.modules, "classroom.client", module)
    return fake


def test_in_a_hub_each_attempt_goes_through_the_outbox(entry, store, client, monkeypatch):
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "secret")
    monkeypatch.setenv("DANTINOX_CLASSROOM_URL", "http://127.0.0.1:1/services/classroom/")
    quiz = Quiz(entry, learner="ada", store=store)
    client.down = "report"
    quiz.answer(0, 6.0)
    assert len(store.pending()) == 1 and "not yet sent to the classroom service (HTTP 503" in quiz.status.value
    assert "Correct" in quiz.feedback[0].value  # the learner still gets feedback
    client.down = False
    quiz.answer(0, 6.0)  # the next answer sends the queue, the earlier one included
    assert store.pending() == [] and quiz.status.value == "" and client.calls == 2
    client.down = "raise"
    quiz.answer(0, 5.0)
    assert len(store.pending()) == 1 and "ConnectionError: service unreachable" in quiz.status.value
    client.down = False
    Quiz(entry, learner="ada", store=store)  # reopening the lab retries what is still queued
    assert store.pending() == [] and client.calls == 4


def test_self_paced_needs_no_service(entry, store, client, monkeypatch):
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    monkeypatch.delenv("DANTINOX_CLASSROOM_URL", raising=False)
    Quiz(entry, learner="ada", store=store).answer(0, 6.0)
    assert client.calls == 0 and store.pending() == [] and store.count() == 1


def test_an_unusable_store_is_shown_and_the_quiz_still_grades(entry, tmp_path, monkeypatch):
    monkeypatch.setenv("DANTINOX_ANSWERS_DB", str(tmp_path))  # a directory, not a file
    quiz = Quiz(entry, learner="ada")
    assert "expected a file path" in quiz.status.value and "this session only" in quiz.status.value
    assert quiz.answer(0, 6.0) is True and quiz.score == 1


def test_answers_export_writes_the_learners_own_records(entry, store, tmp_path, capsys):
    Quiz(entry, learner="ada", store=store).answer(0, 6.0)
    Quiz(entry, learner="bo", store=store).answer(0, 1.0)
    store.reset("ada", "kv-cache")
    Quiz(entry, learner="ada", store=store).answer(0, 5.0)
    db = str(store.path)
    assert main(["answers", "export", "--db", db, "--learner", "ada"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["response"], r["reset"], r["attempt"]) for r in rows] == [("6.0", True, 1), ("5.0", False, 1)]
    assert rows[0]["params"] == dict(entry.checks[0].params)
    out = tmp_path / "mine.csv"
    assert main(["answers", "export", "--db", db, "--learner", "bo", "--format", "csv", "--out", str(out)]) == 0
    (row,) = csv.DictReader(io.StringIO(out.read_text()))
    assert row["learner"] == "bo" and row["correct"] == "False" and json.loads(row["params"])["L"] == 12


def test_answers_export_refuses_bad_input_in_one_line(tmp_path, capsys):
    assert main(["answers", "export", "--db", str(tmp_path / "missing.sqlite")]) == 2
    err = capsys.readouterr().err
    assert err == f"dantinox answers export: error: --db: expected an existing answer store file, got " \
                  f"{tmp_path / 'missing.sqlite'}\n"
    assert main(["answers", "export", "--out", str(tmp_path / "no" / "dir.json")]) == 2
    assert "--out: expected a file in an existing directory" in capsys.readouterr().err
    junk = tmp_path / "junk.sqlite"
    junk.write_text("not sqlite" * 100)
    assert main(["answers", "export", "--db", str(junk)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert main(["answers", "export", "--format", "csv"]) == 0  # nothing answered yet: a header, no file made
    assert capsys.readouterr().out.startswith("key,learner,entry_id,check_index,")


def test_with_the_real_client_an_unreachable_service_leaves_the_attempt_queued(entry, store, monkeypatch):
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "secret")
    monkeypatch.setenv("DANTINOX_CLASSROOM_URL", "http://127.0.0.1:9/services/classroom")  # nothing listens
    quiz = Quiz(entry, learner="ada", store=store)
    assert quiz.answer(0, 6.0) is True
    assert len(store.pending()) == 1 and "classroom service unreachable" in quiz.status.value
