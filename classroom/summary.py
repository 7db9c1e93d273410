"""What a class answered, per question and per learner: pure functions over attempts.

    rows = question_rows(store.attempts(), entries)   # entries: {id: content Entry}, for options and beliefs
    learner_rows(store.attempts(), entries); exercise_rows(store.attempts()); to_csv(rows)

The instructor notebook and the classroom dashboard both call these, so they show the same numbers.
A learner's *first* attempt at a check is what counts: the first-try rate, and for choice questions which
option each learner picked first (what they believed before any feedback). Attempts may be `Attempt`
objects or their JSON dicts. Entries are read by attribute; question text comes from `content`.
Exercise checks (attempts at an exercise of `classroom.exercise_catalogue`) are counted apart, by
`exercise_rows`: who passed each exercise and the commonest known mistake; the question and learner tables
leave them out.
"""

from __future__ import annotations

import csv
import io
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from classroom.exercise_catalogue import CATALOGUE, is_exercise
from classroom.store import Attempt


def _as_attempt(a: Attempt | Mapping[str, Any]) -> Attempt:
    return a if isinstance(a, Attempt) else Attempt.from_json(dict(a))


def first_attempts(attempts: Iterable[Attempt | Mapping[str, Any]]) -> dict[tuple[str, str, int], Attempt]:
    """(learner, entry_id, check_index) -> that learner's earliest attempt at the check."""
    return Tally(attempts).firsts


def belief(entry: Any, check_index: int, option: int) -> str:
    """The belief a wrong option embodies: the documented misconception the entry's author mapped it to
    (`beliefs` on the choice check), else the option itself read as a claim. "" for the key."""
    check = entry.checks[check_index]
    if option == check.answer:
        return ""
    mapped = getattr(check, "beliefs", {}).get(option)
    return entry.misconception[mapped].claim if mapped is not None else check.options[option]


def _question_text(entry: Any, check_index: int) -> str:
    """The question as content words it, a numeric check's own numbers filled in."""
    import content  # no jax: the service and the instructor notebook both have it

    return content.render_question(entry, check_index)


class Tally:
    """What the summary needs, kept up to date one attempt at a time: attempts per check and each learner's
    first attempt at each check. The service adds attempts as they arrive, so a dashboard's poll costs the
    size of the class, not the number of attempts. `add` attempts in time order (arrival order in a service)."""

    def __init__(self, attempts: Iterable[Attempt | Mapping[str, Any]] = ()):
        self.total = 0
        self.per_check: Counter = Counter()  # (entry_id, check_index) -> attempts
        self.firsts: dict[tuple[str, str, int], Attempt] = {}
        self.checks: Counter = Counter()  # exercise id -> checks run
        self.passed: dict[str, set[str]] = defaultdict(set)  # exercise id -> learners with a passing check
        self.tried: dict[str, set[str]] = defaultdict(set)  # exercise id -> learners with any check
        self.mistakes: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))  # id -> mistake -> who
        for a in sorted(map(_as_attempt, attempts), key=lambda a: a.time):
            self.add(a)

    def add(self, a: Attempt) -> None:
        self.total += 1
        if is_exercise(a.entry_id):
            self.checks[a.entry_id] += 1
            self.tried[a.entry_id].add(a.learner)
            if a.correct:
                self.passed[a.entry_id].add(a.learner)
            elif a.mistake is not None:
                self.mistakes[a.entry_id][a.mistake].add(a.learner)
            return
        self.per_check[a.entry_id, a.check_index] += 1
        self.firsts.setdefault((a.learner, a.entry_id, a.check_index), a)

    @property
    def learners(self) -> set[str]:
        return {learner for learner, _, _ in self.firsts}.union(*self.tried.values())


def _tally(attempts: Tally | Iterable[Attempt | Mapping[str, Any]]) -> Tally:
    return attempts if isinstance(attempts, Tally) else Tally(attempts)


def question_rows(attempts: Tally | Iterable[Attempt | Mapping[str, Any]],
                  entries: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Per check answered at least once: learners, attempts, first-try right and rate; with `entries`, also
    the question, its kind, and for choice checks each option's first-choice count and belief."""
    tally = _tally(attempts)
    rows: dict[tuple[str, int], dict[str, Any]] = {
        key: {"entry": key[0], "check": key[1], "learners": 0, "attempts": n, "first_try_right": 0}
        for key, n in tally.per_check.items()}
    picked: dict[tuple[str, int], Counter] = defaultdict(Counter)
    for (_, entry_id, check_index), a in tally.firsts.items():
        row = rows[(entry_id, check_index)]
        row["learners"] += 1
        row["first_try_right"] += a.correct
        picked[entry_id, check_index][a.response] += 1
    out = []
    for key in sorted(rows):
        row = rows[key]
        row["first_try_rate"] = row["first_try_right"] / row["learners"]
        entry = (entries or {}).get(key[0])
        if entry is not None and key[1] < len(entry.checks):
            check = entry.checks[key[1]]
            row["kind"] = check.kind
            row["question"] = _question_text(entry, key[1])  # from content, never from what learners posted
            if check.kind == "choice":
                row["options"] = [{"option": text, "correct": j == check.answer, "first_choice": picked[key][text],
                                   "belief": belief(entry, key[1], j),
                                   "feedback": check.feedback[j] if check.feedback else ""}
                                  for j, text in enumerate(check.options)]
        out.append(row)
    return out


def learner_rows(attempts: Tally | Iterable[Attempt | Mapping[str, Any]],
                 entries: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Per learner: checks answered, right on the first try, and per entry how far they got
    ("answered/total" when `entries` gives the entry's number of checks)."""
    firsts = _tally(attempts).firsts
    rows: dict[str, dict[str, Any]] = {}
    for (learner, entry_id, _), a in sorted(firsts.items()):
        row = rows.setdefault(learner, {"learner": learner, "answered": 0, "first_try_right": 0, "entries": {}})
        row["answered"] += 1
        row["first_try_right"] += a.correct
        row["entries"][entry_id] = row["entries"].get(entry_id, 0) + 1
    for row in rows.values():
        for entry_id, n in row["entries"].items():
            entry = (entries or {}).get(entry_id)
            row["entries"][entry_id] = f"{n}/{len(entry.checks)}" if entry is not None else f"{n}"
    return [rows[k] for k in sorted(rows)]


def exercise_rows(attempts: Tally | Iterable[Attempt | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per exercise checked at least once, in catalogue order: who passed (at least one passing check) and who
    has not yet, the checks run, and the commonest known mistake by the number of learners whose code made it
    (ties: the mistake listed first for the exercise). Pass / fail is each learner kernel's report (see
    `classroom.exercise_catalogue`)."""
    tally = _tally(attempts)
    out = []
    for exercise_id, known in CATALOGUE.items():
        if exercise_id not in tally.tried:
            continue
        passed, tried = tally.passed[exercise_id], tally.tried[exercise_id]
        made = tally.mistakes.get(exercise_id, {})
        ranked = sorted(made, key=lambda m: (-len(made[m]), known.mistakes.index(m)))
        commonest = ranked[0] if ranked else ""
        out.append({"exercise": exercise_id, "title": known.title, "tier": known.tier, "learners": len(tried),
                    "checks": tally.checks[exercise_id], "passed": len(passed), "passed_by": sorted(passed),
                    "not_yet": sorted(tried - passed), "commonest_mistake": commonest,
                    "commonest_mistake_learners": len(made[commonest]) if commonest else 0})
    return out


def attempt_table(attempts: Iterable[Attempt | Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Attempts as flat rows (params as JSON text), ready for CSV."""
    import json

    out = []
    for a in map(_as_attempt, attempts):
        row = a.to_json()
        row["params"] = json.dumps(row["params"], sort_keys=True)
        out.append(row)
    return out


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # what a spreadsheet reads as the start of a formula


def csv_cell(value: Any) -> Any:
    """A cell a spreadsheet shows as text: text that would start a formula gets a leading apostrophe."""
    if not isinstance(value, str | list | dict):
        return value
    text = value if isinstance(value, str) else repr(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def to_csv(rows: list[dict[str, Any]], fieldnames: list[str] | None = None) -> str:
    """CSV text of flat rows; nested values (option lists, per-entry progress) are written as their repr.

    Text cells are neutralised against formula injection (`csv_cell`): a question, a response or a hub user
    name such as `=HYPERLINK(...)` opens as the text it is. Numbers stay numbers."""
    buffer = io.StringIO()
    names = fieldnames or list(dict.fromkeys(k for row in rows for k in row))  # every column, first-seen order
    if names:
        # RFC 4180's line ending: a cell holding a bare carriage return is quoted too (with "\n" alone it was
        # written bare, and a spreadsheet split the row there)
        writer = csv.DictWriter(buffer, fieldnames=names, lineterminator="\r\n")
        writer.writeheader()
        writer.writerows({k: csv_cell(v) for k, v in row.items()} for row in rows)
    return buffer.getvalue()
