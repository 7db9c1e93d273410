"""Each exercise check, recorded like a quiz answer: in the learner's answer store and, in a class, sent on.

    recorder = ExerciseRecorder()              # $DANTINOX_ANSWERS_DB, else the user's data directory
    attempt = recorder.record("d-ring-buffer", verdict, seed)
    recorder.problem                           # one line when the store or the service has trouble, else None

A check becomes a `classroom.store.Attempt` whose entry_id is the exercise id, `correct` the verdict,
`mistake` the known wrong solution recognised, `response` the verdict's line and `params` the seed and the
number of cases (`classroom.exercise_catalogue` says what the service keeps and vouches for). Inside a
classroom hub the attempt goes to the store's outbox and the kernel's background sender delivers it, as it
does quiz answers; a store that cannot be opened or written never stops a check: the attempt is then posted
straight to the service (in a class) or kept in memory only. In the browser site there is no SQLite file
(the kernel runs in the page), so checks are kept for the session.
"""

from __future__ import annotations

import os
import sys
import time

from classroom.exercise_catalogue import CATALOGUE, EXPECTED, MAX_LINE, VERSION
from classroom.store import AnswerStore, Attempt, current_learner, new_key
from widgets.exercises.framework import Verdict


def in_class() -> bool:
    """Inside a hub user's server (which holds a hub token) whose hub runs the classroom service."""
    return bool(os.environ.get("JUPYTERHUB_API_TOKEN") and os.environ.get("DANTINOX_CLASSROOM_URL"))


class ExerciseRecorder:
    """Turns verdicts into attempts and keeps them: the store (default: the learner's), else memory."""

    def __init__(self, store: AnswerStore | None = None, learner: str | None = None):
        self.learner = learner or current_learner()
        self.problem: str | None = None
        self.attempts: list[Attempt] = []  # this session's, whatever the store did
        self.store = store
        if store is None and sys.platform != "emscripten":
            try:
                self.store = AnswerStore()
            except ValueError as err:
                self.problem = f"{err}; checks are kept for this session only"

    def record(self, exercise_id: str, verdict: Verdict, seed: int) -> Attempt:
        """Store one check (and queue it for the classroom service in a class); returns the attempt."""
        attempt = Attempt(key=new_key(), learner=self.learner, entry_id=exercise_id, check_index=0,
                          question=CATALOGUE[exercise_id].title, params={"seed": seed, "cases": verdict.cases},
                          response=verdict.message[:MAX_LINE], expected=EXPECTED, correct=verdict.passed,
                          attempt=self._next(exercise_id), time=time.time(), content_version=VERSION,
                          mistake=verdict.mistake if not verdict.passed else None)
        self.attempts.append(attempt)
        class_ = in_class()
        saved = False
        if self.store is not None:
            try:
                self.store.add(attempt, outbox=class_)
                saved, self.problem = True, None
            except Exception as err:  # noqa: BLE001 - a full disk or a locked file must not lose the verdict
                self.problem = f"answer store {self.store.path}: could not save this check ({err})"
        if class_:
            from classroom.client import background_delivery

            sender = background_delivery(self.store)
            if saved:
                sender.kick()
            else:  # in no store: post it straight to the service, from memory
                sender.send_direct(attempt)
        return attempt

    def _next(self, exercise_id: str) -> int:
        if self.store is not None:
            try:
                return self.store.next_attempt(self.learner, exercise_id, 0)
            except Exception:  # noqa: BLE001, S110 - an unreadable store: count this session's checks instead
                pass
        return sum(a.entry_id == exercise_id for a in self.attempts) + 1


_shared: ExerciseRecorder | None = None


def shared_recorder() -> ExerciseRecorder:
    """The one recorder of this kernel (every exercise of a notebook shares its store)."""
    global _shared
    if _shared is None:
        _shared = ExerciseRecorder()
    return _shared
