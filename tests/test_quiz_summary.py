"""The class summary the dashboard and the instructor notebook share: first tries, first choices, beliefs."""

import csv
import io

import pytest

import content
from classroom.illustrative import illustrative_attempts
from classroom.store import Attempt, new_key
from classroom.summary import belief, learner_rows, question_rows, to_csv
from widgets.quiz import summarise


@pytest.fixture(scope="module")
def entry():
    return content.load_entry("kv-cache")


def attempt(learner, check_index, response, correct, time, attempt=1, question="Q?"):
    return Attempt(key=new_key(), learner=learner, entry_id="kv-cache", check_index=check_index, question=question,
                   params={}, response=response, expected="", correct=correct, attempt=attempt, time=time,
                   content_version="ef" * 32)


def test_first_attempts_and_first_choices_per_question(entry):
    i = next(i for i, c in enumerate(entry.checks) if c.kind == "choice")
    options, key = entry.checks[i].options, entry.checks[i].answer
    wrong = (key + 1) % len(options)
    attempts = [attempt("a", i, options[wrong], False, 1.0), attempt("a", i, options[key], True, 2.0, 2),
                attempt("b", i, options[key], True, 3.0),
                # after a reset numbering restarts at 1, but a's first try is still the earliest one
                attempt("a", i, options[key], True, 4.0, 1),
                attempt("c", 0, "6", True, 5.0, question="How many MiB for 12 layers?")]
    rows = question_rows(attempts, {"kv-cache": entry})
    first, choice = rows
    assert (first["check"], first["learners"], first["first_try_rate"]) == (0, 1, 1.0)
    # from content, the check's own numbers filled in: never the text a learner's client posted
    assert first["question"] == content.render_question(entry, 0) != "How many MiB for 12 layers?"
    assert (choice["learners"], choice["attempts"], choice["first_try_right"]) == (2, 4, 1)
    counts = {o["option"]: o["first_choice"] for o in choice["options"]}
    assert counts[options[wrong]] == 1 and counts[options[key]] == 1 and sum(counts.values()) == 2
    assert [o["correct"] for o in choice["options"]] == [j == key for j in range(len(options))]
    assert summarise(attempts)[1] == {k: choice[k] for k in ("entry", "check", "learners", "attempts",
                                                             "first_try_right", "first_try_rate")}
    assert summarise([a.to_json() for a in attempts]) == summarise(attempts)


def test_wrong_options_are_named_by_the_belief_they_embody(entry):
    i = next(i for i, c in enumerate(entry.checks) if c.kind == "choice" and "num_attention_heads" in c.options[0])
    assert belief(entry, i, 0) == entry.misconception[0].claim  # "KV heads equal attention heads"
    assert belief(entry, i, entry.checks[i].answer) == ""
    assert entry.checks[i].beliefs == {0: 0}  # the author's mapping, not a guess from shared words
    unmapped = next(j for j in range(len(entry.checks[i].options)) if j not in (0, entry.checks[i].answer))
    assert belief(entry, i, unmapped) == entry.checks[i].options[unmapped]  # no documented belief: the option itself


def test_learner_progress_and_csv(entry):
    attempts = [attempt("a", 0, "6", True, 1.0), attempt("a", 0, "6", True, 2.0, 2), attempt("a", 2, "x", False, 3.0),
                attempt("b", 1, "1", False, 4.0)]
    rows = learner_rows(attempts, {"kv-cache": entry})
    assert rows == [{"learner": "a", "answered": 2, "first_try_right": 1, "entries": {"kv-cache": "2/5"}},
                    {"learner": "b", "answered": 1, "first_try_right": 0, "entries": {"kv-cache": "1/5"}}]
    table = list(csv.DictReader(io.StringIO(to_csv([{"a": 1}, {"a": 2, "b": 3}]))))
    assert table == [{"a": "1", "b": ""}, {"a": "2", "b": "3"}]


def test_illustrative_records_are_reproducible_and_valid(entry):
    one = illustrative_attempts({"kv-cache": entry}, learners=5, seed=3)
    assert one == illustrative_attempts({"kv-cache": entry}, learners=5, seed=3)
    assert one != illustrative_attempts({"kv-cache": entry}, learners=5, seed=4)
    assert {a.learner for a in one} == {f"learner-0{i}" for i in range(1, 6)}
    assert all(a.content_version == content.content_version("kv-cache") for a in one)
    for a in one:  # graded with the quiz's own rule
        check = entry.checks[a.check_index]
        if check.kind == "numeric":
            assert a.correct == content.is_correct(entry, a.check_index, float(a.response))
        else:
            assert a.correct == (a.response == check.options[check.answer])
    with pytest.raises(ValueError, match="^learners: expected a whole number from 1 to 10000, got 0$"):
        illustrative_attempts({"kv-cache": entry}, learners=0)


def test_csv_cells_that_would_start_a_formula_are_text():
    rows = [{"learner": "=HYPERLINK(\"http://x\")", "response": "-2+3", "n": -1.5, "note": "@SUM(A1)", "ok": "6"}]
    assert next(csv.reader(io.StringIO(to_csv(rows).splitlines()[1]))) == \
        ["'=HYPERLINK(\"http://x\")", "'-2+3", "-1.5", "'@SUM(A1)", "6"]


def test_the_services_grading_agrees_with_the_quiz_on_every_numeric_check():
    import dataclasses

    from classroom.grading import grade

    for entry in content.load_all().values():
        for i, check in content.iter_numeric_checks(entry):
            answer = content.check_answer(entry, i)
            for value in (answer, answer * (1 + check.tolerance * 0.9), answer * (1 + check.tolerance * 1.1),
                          answer * 0.5, -answer, 0.0):
                a = dataclasses.replace(attempt("a", i, repr(value), False, 1.0), entry_id=entry.id)
                graded = grade(entry, "ef" * 32, a, now=2.0)
                assert graded.correct == content.is_correct(entry, i, value), (entry.id, i, value)
                assert graded.expected == repr(answer) and graded.time == 2.0


def check_of(learner, exercise_id, passed, mistake, time):
    from classroom.exercise_catalogue import EXPECTED, VERSION

    return Attempt(key=new_key(), learner=learner, entry_id=exercise_id, check_index=0, question="t",
                   params={"seed": 1}, response="a verdict line", expected=EXPECTED, correct=passed, attempt=1,
                   time=time, content_version=VERSION, mistake=mistake)


def test_per_exercise_who_passed_and_the_commonest_mistake_by_learners(entry):
    from classroom.summary import exercise_rows

    checks = [check_of("ann", "d-ring-buffer", False, "slot-after-newest", 1.0),
              check_of("ann", "d-ring-buffer", False, "slot-after-newest", 2.0),  # one learner, counted once
              check_of("ann", "d-ring-buffer", True, None, 3.0),
              check_of("bo", "d-ring-buffer", False, "window-plus-one", 4.0),
              check_of("cy", "d-ring-buffer", False, "window-plus-one", 5.0),
              check_of("cy", "d-ring-buffer", False, None, 6.0),  # wrong in a way no known mistake explains
              check_of("bo", "a-hybrid-bytes", True, None, 7.0)]
    quiz = attempt("dee", 0, "6", True, 8.0)
    rows = exercise_rows([*checks, quiz])
    assert [r["exercise"] for r in rows] == ["a-hybrid-bytes", "d-ring-buffer"]  # catalogue order, tried only
    ring = rows[1]
    assert (ring["learners"], ring["checks"], ring["passed"], ring["passed_by"], ring["not_yet"]) == \
        (3, 6, 1, ["ann"], ["bo", "cy"])
    assert (ring["commonest_mistake"], ring["commonest_mistake_learners"]) == ("window-plus-one", 2)
    assert rows[0]["commonest_mistake"] == "" and rows[0]["passed_by"] == ["bo"]
    assert [(r["entry"], r["attempts"]) for r in question_rows([*checks, quiz])] == [("kv-cache", 1)]  # apart
    assert [r["learner"] for r in learner_rows([*checks, quiz])] == ["dee"]
    from classroom.dashboard import class_summary

    summary = class_summary([*checks, quiz], {"kv-cache": entry})
    assert summary["exercises"] == rows and summary["learner_count"] == 4 and summary["attempts"] == 8
