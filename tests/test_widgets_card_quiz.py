"""The concept card (escaping, links, LaTeX) and the quiz (grading, tolerance, score, records)."""

import json

import ipywidgets as widgets
import pytest

import content
from widgets import CacheLab, ConceptCard, Quiz, summarise


@pytest.fixture(scope="module")
def entry():
    return content.load_entry("kv-cache")


def test_card_shows_every_part_of_the_entry(entry):
    card = ConceptCard(entry)
    html = card.html
    for text in (entry.role[:40], entry.mechanism[0][:40], entry.tradeoff[:40], entry.misconception[0].claim[:40],
                 entry.history[0].title, entry.sources[0].title[:30]):
        assert content_escaped(text) in html
    assert isinstance(card.sections["equations"], widgets.HTMLMath)
    assert f"$${entry.science[0].equation}$$" in card.sections["equations"].value
    assert f"href='{entry.sources[0].url}'" in html
    assert "6 MiB" in card.sections["specs"].value  # the spec is computed by content, not typed


def content_escaped(text):
    import html

    return html.escape(text, quote=True)


def test_card_escapes_yaml_text_and_refuses_non_http_links(entry):
    evil = entry.model_copy(update={
        "description": "<script>alert('x')</script>",
        "mechanism": ["<img src=x onerror=alert(1)>", "second"],
        "sources": [entry.sources[0].model_copy(update={"title": "bad", "url": "javascript:alert(1)"})],
    })
    html = ConceptCard(evil).html
    assert "<script>" not in html and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "href='javascript" not in html and "(javascript:alert(1))" in html


def test_quiz_grades_choice_checks_with_feedback_and_explanation(entry):
    quiz = Quiz(entry)
    i = next(i for i, c in enumerate(entry.checks) if c.kind == "choice")
    check = entry.checks[i]
    wrong = (check.answer + 1) % len(check.options)
    assert quiz.answer(i, wrong) is False
    assert check.feedback[wrong][:30] in quiz.feedback[i].value and "Not quite" in quiz.feedback[i].value
    assert quiz.answer(i, check.answer) is True
    assert "Correct" in quiz.feedback[i].value and check.explanation[:30] in quiz.feedback[i].value
    assert quiz.feedback[i].value.count("Correct.") == 1  # the option's own "Correct." is not repeated
    assert quiz.score == 0  # the first attempt counts
    assert "Score: 0 / 5" in quiz.score_html.value and "1 of 5 answered" in quiz.score_html.value


def test_quiz_numeric_checks_use_the_entry_tolerance(entry):
    quiz = Quiz(entry)
    expected = content.check_answer(entry, 0)  # 12 layers, 8 KV heads, head 32, bf16, 512 tokens: 6 MiB
    assert expected == 6.0
    tol = entry.checks[0].tolerance
    assert quiz.answer(0, expected * (1 + tol / 2)) is True
    assert quiz.answer(0, expected * (1 + 2 * tol)) is False
    assert quiz.answer(0, 0.375) is False  # the copied-table trap
    assert quiz.answer(0, "6 MiB") is True and quiz.answer(0, "6,291,456") is False
    assert "the formula gives 6 MiB" in quiz.feedback[0].value or "Correct: 6 MiB" in quiz.feedback[0].value
    assert quiz.score == 1
    with pytest.raises(ValueError, match=r"answer: expected a number in MiB \(such as 4,096 or 1/8\), got 'six'"):
        quiz.answer(0, "six")
    quiz.inputs[0].value = "six"
    quiz._submit(0)
    assert "expected a number in MiB" in quiz.feedback[0].value


def test_quiz_numeric_checks_can_take_the_lab_settings(entry):
    lab = CacheLab(entry, preset="test", tokens=64, batch=3, attention="mqa", cache_dtype="float32")
    quiz = Quiz(entry, params=lab.formula_params, lab_checks=[0])
    quiz.use_params(lab.formula_params())
    assert "2 layers and 1 KV heads of size 8" in quiz.questions[0].value and "64 tokens" in quiz.questions[0].value
    assert "Llama-3-8B has 32 layers" in quiz.questions[1].value  # a named model keeps its numbers
    mib = lab.reading.formula_bytes / 2**20
    assert quiz.answer(0, mib) is True and float(quiz.records[-1]["expected"]) == pytest.approx(mib)
    quiz.answer(1, 1.0)  # Llama-3-8B per token is 128 KiB: wrong, with feedback
    quiz.use_params(lab.formula_params())  # new lab numbers: only the lab check's feedback is stale
    assert quiz.feedback[0].value == "" and "Not quite" in quiz.feedback[1].value
    with pytest.raises(ValueError, match="lab_checks"):
        Quiz(entry, params=lab.formula_params, lab_checks=[2])  # a choice check


def test_quiz_records_export_and_summary(entry):
    a, b = Quiz(entry, learner="a"), Quiz(entry, learner="b")
    a.answer(4, 1)
    b.answer(4, 0)
    b.answer(4, 1)
    records = json.loads(a.to_json()) + json.loads(b.to_json())
    assert [r["attempt"] for r in records] == [1, 1, 2]
    assert {r["learner"] for r in records} == {"a", "b"}
    (row,) = summarise(records)
    assert row == {"entry": "kv-cache", "check": 4, "learners": 2, "attempts": 3, "first_try_right": 1,
                   "first_try_rate": 0.5}
    a._show_export()
    table = a.export_area.value
    assert table.startswith("<table") and "{" not in table  # a table to read, not JSON
    assert table.count("<tr style=") == len(a.attempts) and "Q5" in table and "right" in table


def test_quiz_escapes_question_text(entry):
    evil = entry.model_copy(update={"checks": [entry.checks[0], entry.checks[2].model_copy(
        update={"question": "<script>x</script>?"})]})
    quiz = Quiz(evil)
    assert "<script>" not in quiz.questions[1].value and "&lt;script&gt;" in quiz.questions[1].value


def test_numeric_questions_say_what_their_grading_accepts_and_take_fractions(entry):
    quiz = Quiz(entry, learner="fractions")
    numeric = [i for i, c in enumerate(entry.checks) if c.kind == "numeric"]
    for i in numeric:
        check, value = entry.checks[i], content.check_answer(entry, i)
        assert "Graded: answers from " in quiz.questions[i].value and "±0 %" not in quiz.questions[i].value
        lo, hi = value * (1 - check.tolerance), value * (1 + check.tolerance)
        for inside in (lo * (1 + 1e-9), hi * (1 - 1e-9)):  # what the wording accepts, the grading accepts
            assert content.is_correct(entry, i, inside)
        for outside in (lo * (1 - 1e-6), hi * (1 + 1e-6)):
            assert not content.is_correct(entry, i, outside)
    i = numeric[0]
    value = content.check_answer(entry, i)
    quiz.inputs[i].value = f"{value * 8:.12g}/8"
    quiz._submit(i)
    assert "Correct:" in quiz.feedback[i].value and "are accepted" in quiz.feedback[i].value


def test_an_empty_answer_names_what_the_question_wants(entry):
    quiz = Quiz(entry, learner="empty")
    numeric = next(i for i, c in enumerate(entry.checks) if c.kind == "numeric")
    choice = next(i for i, c in enumerate(entry.checks) if c.kind == "choice")
    quiz._submit(numeric)
    assert f"answer: type a number in {entry.checks[numeric].unit} first" in quiz.feedback[numeric].value
    assert "option" not in quiz.feedback[numeric].value
    quiz._submit(choice)
    assert "answer: choose an option first" in quiz.feedback[choice].value


def test_a_decimal_comma_is_refused_in_one_line_never_read_as_thousands(entry):
    quiz = Quiz(entry)
    with pytest.raises(ValueError, match=r"got '2,91'.*write a decimal with a point \(2\.91\)"):
        quiz.answer(0, "2,91")  # was read as 291
    assert not quiz.records  # refused: nothing graded
    quiz.inputs[0].value = "6,0"
    quiz._submit(0)
    assert "a comma only groups thousands" in quiz.feedback[0].value
    assert quiz.answer(0, "6.0") is True and quiz.answer(0, "6,291,456") is False  # grouped thousands still read
