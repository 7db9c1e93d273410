"""Grading an attempt from its concept entry, as the classroom service does: the client's verdict is not trusted.

    graded = grade(entry, version, attempt, now=time.time())

A learner's kernel sends what they answered (entry, check, response, the question's parameters); everything
that decides a grade is recomputed here from the entry: whether it is correct, the keyed answer, the question
text. The time is the service's arrival time, and the attempt number is given by the store in arrival order.
Imports `content` (no jax, no dantinox).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import content
import content.units
from classroom.store import Attempt

MAX_RESPONSE = 2_000  # characters: an option's text or a typed number, never a document


def parse_number(text: str, unit: str) -> float:
    """A learner's typed number: commas, the unit and fractions are allowed ('6,291,456 B', '1/8')."""
    cleaned = text.strip()
    if unit and cleaned.endswith(unit):
        cleaned = cleaned[: -len(unit)].strip()
    try:
        return content.units.parse_number(cleaned)
    except ValueError:
        raise ValueError(f"answer: expected a number in {unit} (such as 4,096 or 1/8), got {text[:40]!r}") from None


def grade(entry: Any, version: str, attempt: Attempt, *, now: float) -> Attempt:
    """`attempt` with question, expected, correct, time and content_version
    taken from `entry` and the service; a response or parameters the entry cannot grade raise ValueError."""
    i = attempt.check_index
    if not 0 <= i < len(entry.checks):
        raise ValueError(f"check_index: expected 0 to {len(entry.checks) - 1} for {entry.id!r}, got {i}")
    check = entry.checks[i]
    if len(attempt.response) > MAX_RESPONSE:
        raise ValueError(f"response: expected at most {MAX_RESPONSE} characters, got {len(attempt.response)}")
    try:
        if check.kind == "choice":
            if attempt.response not in check.options:
                raise ValueError(f"response: expected one of the options of {entry.id!r} check {i}, "
                                 f"got {attempt.response[:40]!r}")
            option = check.options.index(attempt.response)
            correct = content.is_correct(entry, i, option, attempt.params or None)
            question, expected = check.question, check.options[check.answer]
        else:
            _check_params(entry, i, attempt.params)
            params = attempt.params or None
            value = parse_number(attempt.response, check.unit)
            if not math.isfinite(value):
                raise ValueError(f"response: expected a finite number, got {attempt.response[:40]!r}")
            answer = _answer(entry, i, params)
            if not math.isfinite(answer):
                raise ValueError(f"params: the answer of {entry.id!r} check {i} is not finite with these values")
            correct = within(check, value, answer)
            question = content.render_question(entry, i, params)
            expected = repr(answer)
    except (content.ContentError, content.ExpressionError, ArithmeticError) as err:
        raise ValueError(str(err).splitlines()[0]) from None
    return dataclasses.replace(attempt, question=question, expected=expected, correct=bool(correct), time=now,
                               content_version=version)


_ANSWERS: dict[tuple, float] = {}  # (entry id, check, params) -> answer: a class asks the same few questions
MAX_CACHED = 10_000


def _answer(entry: Any, i: int, params: dict | None) -> float:
    """`content.check_answer`, remembered: parsing the entry's expression costs more than the rest of a request."""
    key = (entry.id, id(entry), i, tuple(sorted((params or {}).items())))
    if key not in _ANSWERS:
        if len(_ANSWERS) >= MAX_CACHED:
            _ANSWERS.clear()
        _ANSWERS[key] = content.check_answer(entry, i, params)
    return _ANSWERS[key]


def within(check: Any, value: float, answer: float) -> bool:
    """content.is_correct's rule for a numeric check, given the answer: within the relative tolerance, or the
    answer rounded to the significant figures the question asks for."""
    from content.schema import round_significant

    rounded = round_significant(answer, check.precision)
    return abs(value - answer) <= check.tolerance * abs(answer) or math.isclose(value, rounded, rel_tol=1e-9)


def _check_params(entry: Any, i: int, params: dict) -> None:
    """Each parameter is the check's own value or inside the range (or among the values) a lab's slider offers."""
    check = entry.checks[i]
    variables = entry.science_item(check.science).variables
    for name, value in params.items():
        var = variables.get(name)
        if name not in check.params or var is None or value == check.params[name]:
            continue  # unknown names are refused by content with the names it expects
        inside = value in var.values if var.values is not None else \
            (var.min is None or value >= var.min) and (var.max is None or value <= var.max)
        if not inside:
            allowed = var.values if var.values is not None else f"{var.min} to {var.max}"
            raise ValueError(f"params.{name}: expected {allowed} (the lab's range), got {value!r}")
