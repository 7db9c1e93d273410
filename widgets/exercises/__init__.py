"""Exercises where the learner writes the cache's code: a skeleton, a one-line check, progressive hints.

    from widgets.exercises import EXERCISES, check
    check("d-ring-buffer", ring_view)        # -> Verdict(passed, message, mistake, cases)
    EXERCISES["d-ring-buffer"].skeleton       # what the learner starts from

The model-free exercises (NumPy only) load without JAX and run in the browser site; (b) and (c) are checked
against dantinox itself and can drive a real decode (`check_decode`: SmolLM2-135M when its wheel is installed,
else the tiny GQA run), so they import it on first use (the module itself imports no JAX).
"""

from __future__ import annotations

from typing import Any

from widgets.exercises.framework import Exercise, Mistake, Refused, Verdict
from widgets.exercises.model_bound import MODEL_BOUND, check_decode, check_in_model, decode_target, decode_with
from widgets.exercises.model_free import MODEL_FREE, page_name

EXERCISES: dict[str, Exercise] = {e.id: e for e in sorted((*MODEL_FREE, *MODEL_BOUND),
                                                           key=lambda e: (e.tier != "core", e.id))}
MODEL_FREE_IDS = tuple(e.id for e in MODEL_FREE)  # these run in the browser site


def check(exercise_id: str, fn: Any, seed: int | None = None) -> Verdict:
    """Check `fn` for the exercise `exercise_id` on random visible cases; returns the one-line verdict."""
    if exercise_id not in EXERCISES:
        raise ValueError(f"exercise: expected one of {', '.join(EXERCISES)}, got {exercise_id!r}")
    return EXERCISES[exercise_id].check(fn, seed)


__all__ = ["EXERCISES", "MODEL_FREE_IDS", "Exercise", "Mistake", "Refused", "Verdict", "check",
           "check_decode", "check_in_model", "decode_target", "decode_with", "page_name"]
