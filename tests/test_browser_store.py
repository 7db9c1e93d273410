"""The quiz's store on the browser site, headless: the page's half is played by the test (what it would send
from localStorage, and what it is told to write). Under Pyodide the quiz picks this store by itself."""

from __future__ import annotations

import sys

import pytest

import content
from widgets import Quiz
from widgets import browser_store as bs

ENTRY = content.load_all()["attention"]
CHOICE = next(i for i, c in enumerate(ENTRY.checks) if c.kind == "choice")


@pytest.fixture
def page(monkeypatch):
    """A fresh store, as the site's kernel gets it; `sent` holds what it told the page to write."""
    monkeypatch.setattr(sys, "platform", "emscripten")
    monkeypatch.setattr(bs, "_STORE", None)
    sent: list[dict] = []
    monkeypatch.setattr(bs.BrowserAnswerStore, "send", lambda self, msg, buffers=None: sent.append(msg))
    return sent


def test_an_answer_is_written_to_the_page_and_comes_back_in_the_next_kernel(page, monkeypatch):
    quiz = Quiz(ENTRY)
    assert isinstance(quiz.store, bs.BrowserAnswerStore)
    right = quiz.answer(CHOICE, 0)
    assert [m["add"]["entry_id"] for m in page] == ["attention"]
    stored = [{**page[0]["add"], "hidden": False}]  # what the page's localStorage now holds

    monkeypatch.setattr(bs, "_STORE", None)  # a reload: a new kernel, the same page storage
    again = Quiz(ENTRY)
    assert again.attempts == []  # the page has not answered yet
    again.store.stored = stored  # it does, just after the cell has run
    assert [a.key for a in again.attempts] == [page[0]["add"]["key"]]
    assert "Your earlier answer" in again.feedback[CHOICE].value
    assert again.score == int(right)


def test_a_reset_hides_the_answers_in_the_page_too_and_unreadable_rows_are_skipped(page):
    quiz = Quiz(ENTRY)
    quiz.answer(CHOICE, 1)
    assert quiz.reset() == 1
    assert page[-1] == {"reset": {"learner": quiz.learner, "entry_id": "attention"}}
    quiz.store.stored = [{**page[0]["add"], "hidden": True}, {"key": "broken"}]
    assert quiz.store.attempts(quiz.learner, "attention") == []
    assert Quiz(ENTRY).attempts == []


def test_a_write_the_page_refuses_is_shown_under_the_quiz(page):
    quiz = Quiz(ENTRY)
    quiz.store.error = "QuotaExceededError"
    assert "QuotaExceededError" in quiz.status.value and "this session only" in quiz.status.value


def test_show_my_answers_points_to_what_the_browser_has_not_to_a_command_line(page):
    quiz = Quiz(ENTRY)
    quiz.answer(CHOICE, 0)
    table = quiz.answers_html()
    assert "dantinox answers export" not in table  # no command line on the site
    assert "browser's storage" in table and "to_json()" in table
    assert quiz.to_json().count('"entry_id": "attention"') == 1


def test_show_my_answers_on_the_desktop_names_the_export_command(tmp_path):
    from classroom.store import AnswerStore

    quiz = Quiz(ENTRY, store=AnswerStore(tmp_path / "answers.sqlite"))
    quiz.answer(CHOICE, 0)
    assert "dantinox answers export" in quiz.answers_html()
