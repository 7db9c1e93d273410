"""The exercises a class can record, and the known mistakes each can report: what the service checks against.

    CATALOGUE["d-ring-buffer"].mistakes      # ('window-plus-one', 'slot-after-newest')
    grade_exercise(attempt, now=time.time())  # the service's record of one check, or a one-line ValueError

The exercises themselves (skeletons, references, the wrong solutions) live in `widgets.exercises`, which the
classroom may not import (it loads the model library for two of them); this table repeats their ids, titles
and mistake ids, and tests/test_exercises.py proves the two equal. An exercise check travels as an `Attempt`
whose `entry_id` is the exercise id (no concept entry has one of these names, also tested), `check_index` 0,
`correct` the verdict, `mistake` the id of the known wrong solution the check recognised (None when it
recognised none or the code passed), `response` the verdict's line and `params` the seed and number of cases.

What the service can and cannot vouch for: it re-runs nothing (a learner's code runs in their own kernel), so
pass / fail, the mistake and the verdict line are the learner kernel's claim, exactly as the check reported it.
What it does decide: who (the hub's name, not a field), when (arrival time), which attempt this is (arrival
order), that the exercise and the mistake exist and belong together, that a pass names no mistake, and the
title and catalogue version recorded with it. An instructor's grade that must not rest on a kernel's claim
comes from nbgrader (`dantinox classroom nbgrader`), whose hidden tests run the submitted code on other seeds.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

from classroom.store import Attempt

EXPECTED = "agrees with the reference on every case"  # what a passing check means, stored as `expected`
PARAMS = ("seed", "cases")  # the only parameters an exercise check carries
MAX_SEED = 2**63
MAX_LINE = 2_000  # characters of the verdict line kept (a kernel sends it cut to this)


@dataclasses.dataclass(frozen=True)
class Known:
    """One exercise as the classroom knows it."""

    title: str
    tier: str  # "core" or "challenge"
    mistakes: tuple[str, ...]  # ids of its known wrong solutions


CATALOGUE: dict[str, Known] = {
    "a-hybrid-bytes": Known("(a) The cache bytes of a hybrid config, layer by layer", "core",
                            ("every-layer-full", "keys-only")),
    "b-cache-write": Known("(b) Write one token's keys and values at the cache's fill", "core", ("no-gap-check",)),
    "c-grouped-attention": Known("(c) One new token's attention over the cache, grouped heads, masked", "core",
                                 ("unfilled-slots", "mask-after-softmax", "model-width-scale",
                                  "groups-interleaved")),
    "d-ring-buffer": Known("(d) A sliding-window ring buffer: the slot and the mask", "core",
                           ("window-plus-one", "slot-after-newest")),
    "e-page-table": Known("(e) A page table: allocate, locate, fork with copy-on-write", "core",
                          ("fork-copies", "no-copy-on-write")),
    "f-int8-scales": Known("(f) int8 per-token quantization with scales, and the bytes", "core",
                           ("no-scale-bytes", "per-tensor-scale", "truncates")),
    "g-prefix-hashes": Known("(g) Prefix caching: chained page names and the longest cached prefix", "core",
                             ("unchained", "unchained-every-hit")),
    "h-h2o-eviction": Known("(h) H2O eviction under a budget", "core", ("evicts-recent", "no-accumulation",
                                                                       "oldest-out")),
    "challenge-chunked-prefill": Known("Challenge: a chunked-prefill scheduler under a token budget", "challenge",
                                       ("prompts-first", "whole-prompts")),
    "challenge-kivi-keys": Known("Challenge: KIVI's per-channel key quantization", "challenge",
                                 ("per-token-keys",)),
}

VERSION = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()  # recorded as each check's content_version


def is_exercise(entry_id: str) -> bool:
    return entry_id in CATALOGUE


def grade_exercise(attempt: Attempt, *, now: float) -> Attempt:
    """The record the service keeps of one exercise check (see the module docstring for what it vouches for).

    Raises a one-line ValueError, naming the field, for an unknown exercise, a mistake it does not have, a
    pass that names a mistake, a check_index other than 0 or parameters other than a seed and a case count."""
    known = CATALOGUE.get(attempt.entry_id)
    if known is None:
        raise ValueError(f"entry_id: expected an exercise of this course, got {attempt.entry_id[:80]!r}")
    if attempt.check_index != 0:
        raise ValueError(f"check_index: expected 0 for an exercise, got {attempt.check_index}")
    if attempt.mistake is not None and attempt.mistake not in known.mistakes:
        allowed = ", ".join(known.mistakes)
        raise ValueError(f"mistake: expected none or one of {allowed} for {attempt.entry_id!r}, "
                         f"got {attempt.mistake[:80]!r}")
    if attempt.correct and attempt.mistake is not None:
        raise ValueError(f"mistake: expected none for a check that passed, got {attempt.mistake[:80]!r}")
    if len(attempt.response) > MAX_LINE:
        raise ValueError(f"response: expected the verdict line, at most {MAX_LINE} characters, got "
                         f"{len(attempt.response)}")
    unknown = sorted(set(attempt.params) - set(PARAMS))
    if unknown:
        raise ValueError(f"params: expected only {' and '.join(PARAMS)}, got {', '.join(unknown)[:80]}")
    for name, value in attempt.params.items():
        if not (float(value).is_integer() and 0 <= value < MAX_SEED):
            raise ValueError(f"params.{name}: expected a whole number >= 0, got {value!r}")
    return dataclasses.replace(attempt, question=known.title, expected=EXPECTED, time=now, content_version=VERSION)
