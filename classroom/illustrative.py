"""Illustrative class records: generated attempts for trying the summaries without a class.

    attempts = illustrative_attempts({e.id: e for e in entries}, learners=24, seed=0)
    checks = illustrative_checks(learner_names(24), seed=0)   # exercise checks, as a learner's kernel reports

Not measured and not a model of real learners: each check gets a made-up first-try success rate, wrong
choice answers lean towards one wrong option so the per-option view has a belief to show, and a learner
retries until right (at most three attempts). Exercises likewise: a made-up pass rate, failed checks leaning
towards one of the exercise's known mistakes, a learner checking until the code passes or stopping. The same
seed gives the same records, keys included.
"""

from __future__ import annotations

import random
import string
from collections.abc import Mapping
from typing import Any

import content
from classroom.exercise_catalogue import CATALOGUE, EXPECTED, VERSION
from classroom.store import Attempt

START = 1_767_000_000.0  # a fixed clock, so generated records (and the notebook showing them) are reproducible


def _wrong_number(rng: random.Random, expected: float) -> float:
    # slips learners make with a size formula: a factor of two, a unit prefix, a dropped factor of layers
    return expected * rng.choice([2.0, 0.5, 1024.0, 1 / 1024, 1 / 12])


def learner_names(learners: int) -> list[str]:
    """The generated learners' names, 'learner-01' on."""
    if isinstance(learners, bool) or not isinstance(learners, int) or not 1 <= learners <= 10_000:
        raise ValueError(f"learners: expected a whole number from 1 to 10000, got {learners!r}")
    return [f"learner-{i + 1:02d}" for i in range(learners)]


def _key(rng: random.Random) -> str:
    return "".join(rng.choice(string.hexdigits[:16]) for _ in range(32))


def illustrative_attempts(entries: Mapping[str, Any], learners: int = 24, seed: int = 0) -> list[Attempt]:
    """Attempts of `learners` generated learners at every check of `entries`, in time order."""
    names = learner_names(learners)
    rng = random.Random(seed)
    plan = {}  # (entry, check) -> (first-try success rate, the wrong option most learners pick)
    for entry_id, entry in entries.items():
        for i, check in enumerate(entry.checks):
            wrong = [j for j in range(len(check.options)) if j != check.answer] if check.kind == "choice" else []
            plan[entry_id, i] = (rng.uniform(0.25, 0.9), rng.choice(wrong) if wrong else None)
    out, clock = [], START
    for learner in names:
        for entry_id, entry in entries.items():
            version = content.content_version(entry_id)
            reached = rng.randint(max(1, len(entry.checks) - 2), len(entry.checks))  # some stop early
            for i, check in enumerate(entry.checks[:reached]):
                rate, popular = plan[entry_id, i]
                for attempt in range(1, 4):
                    right = attempt == 3 or rng.random() < (rate if attempt == 1 else 0.7)
                    if check.kind == "choice":
                        others = [j for j in range(len(check.options)) if j != check.answer]
                        pick = check.answer if right else (popular if rng.random() < 0.6 else rng.choice(others))
                        question, params = check.question, {}
                        response, expected = check.options[pick], check.options[check.answer]
                    else:
                        value = content.check_answer(entry, i)
                        question, params = content.render_question(entry, i), dict(check.params)
                        response = f"{value if right else _wrong_number(rng, value):.4g}"
                        expected = repr(value)
                        right = content.is_correct(entry, i, float(response))
                    clock += rng.uniform(5, 90)
                    out.append(Attempt(key=_key(rng), learner=learner, entry_id=entry_id, check_index=i,
                                       question=question, params=params, response=response, expected=expected,
                                       correct=right, attempt=attempt, time=clock, content_version=version))
                    if right:
                        break
    return sorted(out, key=lambda a: a.time)


def illustrative_checks(names: list[str], seed: int = 0) -> list[Attempt]:
    """Exercise checks of the learners `names` at every exercise of the catalogue, in time order, recorded as
    `widgets.exercises.record` records a kernel's check (the verdict line here says it is made up)."""
    rng = random.Random(f"{seed}:exercises")  # its own stream: the quiz attempts above stay as they were
    plan = {x: (rng.uniform(0.2, 0.7), rng.choice(k.mistakes)) for x, k in CATALOGUE.items()}
    out, clock = [], START
    for learner in names:
        for exercise_id, known in CATALOGUE.items():
            if rng.random() < (0.15 if known.tier == "core" else 0.6):
                continue  # never opened it
            rate, popular = plan[exercise_id]
            for attempt in range(1, 5):
                right = rng.random() < (rate if attempt == 1 else 0.5)
                mistake = None
                if not right and rng.random() < 0.7:  # the rest failed in no known way
                    mistake = popular if rng.random() < 0.6 else rng.choice(known.mistakes)
                verdict = "passed" if right else f"failed ({mistake or 'no known mistake'})"
                clock += rng.uniform(20, 240)
                out.append(Attempt(key=_key(rng), learner=learner, entry_id=exercise_id, check_index=0,
                                   question=known.title, params={"seed": rng.randrange(10**6)},
                                   response=f"illustrative check: {verdict}", expected=EXPECTED,
                                   correct=right, attempt=attempt, time=clock, content_version=VERSION,
                                   mistake=mistake))
                if right or rng.random() < 0.25:  # passed, or stopped for now
                    break
    return sorted(out, key=lambda a: a.time)
