"""The quiz writes every attempt to the answer store: resume, reset, classroom delivery, and the export command."""

import csv
import io
import json
import sqlite3
import time
import urllib.error

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


class FakeService:
    """Stands in for the classroom service behind `classroom.client.post_attempts`: records what it took."""

    def __init__(self):
        self.keys, self.calls, self.down, self.hang, self.refuse = [], 0, False, 0.0, set()

    def post_attempts(self, url, token, payload, *, timeout=10.0):
        self.calls += 1
        time.sleep(self.hang)
        if self.down:
            raise urllib.error.URLError("connection refused")
        refused = [a["key"] for a in payload if a["key"] in self.refuse]
        if refused:  # the real service refuses a body whole
            body = io.BytesIO(json.dumps({"error": "attempts[0].learner: expected 'ada2', got 'ada'"}).encode())
            raise urllib.error.HTTPError(url, 403, "Forbidden", {}, body)
        self.keys += [a["key"] for a in payload]
        return {"received": len(payload), "new": len(payload), "keys": [a["key"] for a in payload]}


@pytest.fixture
def service(monkeypatch):
    import classroom.client

    fake = FakeService()
    monkeypatch.setattr(classroom.client, "post_attempts", fake.post_attempts)
    monkeypatch.setattr(classroom.client, "BACKOFF_S", (0.05, 0.2))
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "secret")
    monkeypatch.setenv("DANTINOX_CLASSROOM_URL", "http://127.0.0.1:1/services/classroom/")
    return fake


def until(check, seconds=10.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False


def test_in_a_hub_answers_are_delivered_in_the_background_after_an_outage(entry, store, service):
    service.down = True
    quiz = Quiz(entry, learner="ada", store=store)
    quiz.answer(0, 6.0)
    assert "Correct" in quiz.feedback[0].value  # the learner gets feedback whatever the service does
    assert until(lambda: "not yet sent to the classroom service" in quiz.status.value)
    assert "retrying in the background" in quiz.status.value and len(store.pending()) == 1
    service.down = False  # the service is back; no further answer is given
    assert until(lambda: store.pending() == [] and quiz.status.value == "")
    assert service.keys == [a.key for a in store.attempts()]


def test_a_hung_service_never_blocks_a_click(entry, store, service):
    service.hang = 1.0
    quiz = Quiz(entry, learner="ada", store=store)
    start = time.perf_counter()
    quiz.answer(0, 6.0)
    quiz.answer(0, 5.0)
    assert time.perf_counter() - start < 0.5  # two answers, each would have waited 1 s on the network
    assert until(lambda: len(service.keys) == 2, 15)


def test_one_refused_answer_is_set_aside_and_the_rest_still_go(entry, store, service):
    service.down = True
    quiz = Quiz(entry, learner="ada", store=store)
    for value in (6.0, 5.0, 4.0):
        quiz.answer(0, value)
    poisoned = store.attempts()[1].key
    service.refuse, service.down = {poisoned}, False
    assert until(lambda: store.pending() == [] and "refused" in quiz.status.value)
    assert sorted(service.keys) == sorted(a.key for a in store.attempts() if a.key != poisoned)
    assert [(a.key, why.split(":")[0]) for a, why in store.refused()] == [(poisoned, "HTTP 403 attempts[0].learner")]
    assert "1 answer(s) refused by the classroom service" in quiz.status.value and "instructor" in quiz.status.value
    quiz.answer(0, 6.0)  # later answers are delivered; the refused one is not sent again
    assert until(lambda: len(service.keys) == 3) and store.refused()[0][0].key == poisoned


def test_an_answer_the_store_cannot_save_is_posted_directly(entry, store, service, monkeypatch):
    quiz = Quiz(entry, learner="ada", store=store)
    real_add = store.add

    def full_disk(attempt, **kw):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(store, "add", full_disk)
    quiz.answer(0, 6.0)
    assert "could not save this answer (database or disk is full)" in quiz.status.value
    assert "sent straight to the classroom service" in quiz.status.value
    assert until(lambda: len(service.keys) == 1) and store.count() == 0
    monkeypatch.setattr(store, "add", real_add)
    quiz.answer(0, 5.0)  # saved again: the old line goes
    assert until(lambda: len(service.keys) == 2) and "could not save" not in quiz.status.value


def test_self_paced_needs_no_service(entry, store, service, monkeypatch):
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    monkeypatch.delenv("DANTINOX_CLASSROOM_URL", raising=False)
    Quiz(entry, learner="ada", store=store).answer(0, 6.0)
    time.sleep(0.2)
    assert service.calls == 0 and store.pending() == [] and store.count() == 1


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
    import classroom.client

    monkeypatch.setattr(classroom.client, "BACKOFF_S", (0.05, 0.2))
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "secret")
    monkeypatch.setenv("DANTINOX_CLASSROOM_URL", "http://127.0.0.1:9/services/classroom")  # nothing listens
    quiz = Quiz(entry, learner="ada", store=store)
    assert quiz.answer(0, 6.0) is True
    assert until(lambda: "classroom service unreachable" in quiz.status.value)
    assert len(store.pending()) == 1


def damaged_store(tmp_path, entry):
    """A store whose header is intact and whose data pages are overwritten (a disk fault, a bad copy)."""
    path = tmp_path / "damaged.sqlite"
    store = AnswerStore(path)
    quiz = Quiz(entry, learner="ada", store=store)
    for i in range(300):
        quiz.answer(0, float(i))
    store.close()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    data[4096 * 2:] = b"\xff" * (len(data) - 4096 * 2)  # every page after the first two
    path.write_bytes(bytes(data))
    return path


def test_a_damaged_store_is_one_line_and_the_quiz_still_opens(entry, tmp_path, capsys):
    path = damaged_store(tmp_path, entry)
    assert main(["answers", "export", "--db", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "answers export: error:" in err
    quiz = Quiz(entry, learner="ada", store=AnswerStore(path))  # no traceback: the quiz is shown and says why
    assert "could not read earlier answers (database disk image is malformed)" in quiz.status.value
    assert quiz.answer(0, 6.0) is True


def test_export_out_that_cannot_be_written_leaves_no_file(entry, store, tmp_path, capsys):
    Quiz(entry, learner="ada", store=store).answer(0, 6.0)
    target = tmp_path / "taken"
    target.mkdir()  # a directory where the file should go: the write fails like a full disk would
    assert main(["answers", "export", "--db", str(store.path), "--learner", "ada", "--out", str(target)]) == 2
    assert capsys.readouterr().err.startswith("dantinox answers export: error: --out: cannot write")
    assert target.is_dir() and not (tmp_path / "taken.part").exists()


def test_a_store_that_cannot_be_written_still_shows_earlier_answers(entry, tmp_path, monkeypatch, capsys):
    import errno

    import classroom.store

    path = tmp_path / "answers.sqlite"
    Quiz(entry, learner="ada", store=AnswerStore(path)).answer(0, 6.0)
    monkeypatch.setenv("DANTINOX_ANSWERS_DB", str(path))

    def read_only_disk(p):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(classroom.store, "_private_file", read_only_disk)
    quiz = Quiz(entry, learner="ada")
    assert quiz.store.readonly and "Read-only file system" in quiz.status.value
    assert quiz.score == 1 and "Your earlier answer" in quiz.feedback[0].value  # resumed from the file
    quiz.answer(0, 5.0)
    assert "could not save this answer" in quiz.status.value and "this session only" in quiz.status.value
    assert main(["answers", "export", "--db", str(path), "--learner", "ada"]) == 0  # exported read-only
    assert len(json.loads(capsys.readouterr().out)) == 1


@pytest.mark.parametrize("code", [401, 404, 429, 502, 503])
def test_a_proxy_restart_or_a_busy_service_is_not_a_refusal(entry, store, service, monkeypatch, code):
    import classroom.client

    def unavailable(url, token, payload, *, timeout=10.0):
        raise urllib.error.HTTPError(url, code, "unavailable", {}, io.BytesIO(b"<html>proxy</html>"))

    monkeypatch.setattr(classroom.client, "post_attempts", unavailable)
    quiz = Quiz(entry, learner="ada", store=store)
    quiz.answer(0, 6.0)
    assert until(lambda: f"HTTP {code}" in quiz.status.value)
    assert len(store.pending()) == 1 and store.refused() == []  # kept for the next round, not set aside
    assert "refused" not in quiz.status.value
