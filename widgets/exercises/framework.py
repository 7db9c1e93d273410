"""What every exercise shares: a reference, random visible cases, a one-line verdict, known wrong solutions.

    verdict = exercise.check(my_function, seed=3)   # runs the cases, compares with the reference
    verdict.passed, verdict.message, verdict.mistake

A check runs the learner's function and the reference on the same random cases and stops at the first case
whose output differs; the verdict names that case, the first wrong element and what was expected. When the
learner's outputs equal, on every case, those of a known wrong solution (`Mistake`), the verdict also gives the
misconception that solution embodies, read from its concept entry (claim and correction), so the message is
the cited belief, never text typed here. Standard library, NumPy and `content` only: the same checks run in
the browser (Pyodide).
"""

from __future__ import annotations

import copy
import dataclasses
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

SHOWN = 60  # characters of a value shown in a verdict


class Refused(Exception):  # noqa: N818 - a marker value as much as an exception
    """What a call that raised ValueError gives instead of a value: a refusal is part of some exercises' answer."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Refused)

    __hash__ = Exception.__hash__


@dataclasses.dataclass(frozen=True)
class Case:
    """One visible case: the arguments and how the verdict names them."""

    args: tuple
    text: str


@dataclasses.dataclass(frozen=True)
class Mistake:
    """A known wrong solution and what it embodies: a misconception of a concept entry, or a one-line note."""

    id: str
    wrong: Callable  # same signature as the reference
    entry: str | None = None  # concept entry whose misconception this is
    belief: int | None = None  # index into that entry's misconception list
    note: str = ""  # said when no entry holds the belief

    def message(self) -> str:
        if self.entry is None:
            return self.note
        import content

        m = content.load_entry(self.entry).misconception[self.belief]
        return f"that is the belief \u201c{m.claim.strip()}\u201d ({self.entry}): {m.correction.strip()}"


@dataclasses.dataclass(frozen=True)
class Verdict:
    passed: bool
    message: str  # one line
    mistake: str | None = None  # id of the known wrong solution recognised, if any
    cases: int = 0  # cases run


@dataclasses.dataclass(frozen=True)
class Exercise:
    """One exercise: the learner writes `skeleton`; `check` compares it with `reference` on random cases."""

    id: str  # 'a-hybrid-bytes'
    title: str
    tier: str  # "core" or "challenge"
    entry: str  # the concept entry it belongs to
    lab: str | None  # the lab notebook it belongs to
    skeleton: str  # source the learner starts from (raises NotImplementedError)
    hints: tuple[str, ...]  # progressive: each says a little more, none gives the code
    reference: Callable
    cases: Callable[[random.Random], list[Case]]
    compare: Callable[[Any, Any], str | None]  # first wrong element of `got` against `want`, or None
    mistakes: tuple[Mistake, ...] = ()
    model_free: bool = True  # pure Python + NumPy: runs in the browser site
    run: Callable[[Callable, tuple], Any] = staticmethod(lambda fn, args: fn(*args))
    name: str = "solution"  # the function (or class) name the skeleton defines

    def outputs(self, fn: Callable, cases: Sequence[Case]) -> list[Any]:
        return [call(self.run, fn, case.args) for case in cases]

    def check(self, fn: Callable, seed: int | None = None, cases: list[Case] | None = None) -> Verdict:
        """Run `fn` on the visible cases (random with `seed`, or `cases`) against the reference; one line back."""
        if not callable(fn):
            return Verdict(False, f"{self.id}: expected your function {self.name}, got {type(fn).__name__}")
        cases = self.cases(random.Random(seed)) if cases is None else cases
        got = []
        for i, case in enumerate(cases):
            try:
                got.append(call(self.run, fn, case.args))
            except NotImplementedError:
                return Verdict(False, f"{self.id}: {self.name} is still the skeleton (it raises NotImplementedError)",
                               None, i + 1)
            except Exception as err:  # noqa: BLE001 - the learner's code: its fault is the verdict
                return Verdict(False, f"{self.id}: case {i + 1} ({case.text}): your {self.name} raised "
                                      f"{type(err).__name__}: {shorten(str(err))}", None, i + 1)
        want = self.outputs(self.reference, cases)
        for i, (case, g, w) in enumerate(zip(cases, got, want, strict=True)):
            problem = self.compare(g, w)
            if problem:
                line = f"{self.id}: case {i + 1} of {len(cases)} ({case.text}): {problem}"
                mistake = self.recognise(got, cases)
                if mistake is not None:
                    line += f"; {mistake.message()}"
                return Verdict(False, line, mistake.id if mistake else None, i + 1)
        return Verdict(True, f"{self.id}: all {len(cases)} cases agree with the reference", None, len(cases))

    def recognise(self, got: list[Any], cases: Sequence[Case]) -> Mistake | None:
        """The known wrong solution whose outputs equal the learner's on every case, if any."""
        for mistake in self.mistakes:
            try:
                theirs = self.outputs(mistake.wrong, cases)
            except Exception:  # noqa: BLE001, S112 - a wrong solution may fail where the learner's did not
                continue
            if all(self.compare(g, t) is None for g, t in zip(got, theirs, strict=True)):
                return mistake
        return None


def call(run: Callable, fn: Callable, args: tuple) -> Any:
    """`run(fn, args)` on a copy of the arguments (a function that writes into its input changes no other
    call's case), with a ValueError turned into a Refused value (a refusal can be the right answer)."""
    try:
        return run(fn, copy.deepcopy(args))
    except ValueError as err:
        return Refused(str(err))


def shorten(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= SHOWN else text[:SHOWN - 1] + "\u2026"


def shown(value: Any) -> str:
    if isinstance(value, Refused):
        return "a refusal (ValueError)"
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, tuple) and any(isinstance(v, np.ndarray) for v in value):
        return "(" + ", ".join(f"an array of shape {v.shape}" if isinstance(v, np.ndarray) else shown(v)
                               for v in value) + ")"
    if isinstance(value, bytes):
        return value.hex()[:12] + "\u2026"
    return shorten(repr(value))


def compare_value(got: Any, want: Any, name: str) -> str | None:
    """A scalar, a refusal or a short list compared exactly (floats to 1e-6 relative)."""
    if isinstance(want, Refused) or isinstance(got, Refused):
        if isinstance(want, Refused) and isinstance(got, Refused):
            return None
        return f"{name}: expected {shown(want)}, got {shown(got)}"
    if isinstance(want, float):
        try:
            ok = abs(float(got) - want) <= 1e-6 * max(1.0, abs(want))
        except (TypeError, ValueError):
            ok = False
        return None if ok else f"{name}: expected {shown(want)}, got {shown(got)}"
    return None if _same(got, want) else f"{name}: expected {shown(want)}, got {shown(got)}"


def _same(got: Any, want: Any) -> bool:
    try:
        return bool(got == want) if not isinstance(got, np.ndarray) else False
    except Exception:  # noqa: BLE001 - an object that cannot be compared is not equal
        return False


def compare_array(got: Any, want: np.ndarray, name: str, rtol: float = 0.0, atol: float = 0.0) -> str | None:
    """The first element of `got` that differs from `want` (after np.asarray), with its index."""
    if isinstance(got, Refused):
        return f"{name}: expected an array, got {shown(got)}"
    try:
        g = np.asarray(got)
    except Exception:  # noqa: BLE001
        return f"{name}: expected an array of shape {want.shape}, got {type(got).__name__}"
    if g.shape != want.shape:
        return f"{name}: expected shape {want.shape}, got {g.shape}"
    if g.dtype == object:
        return f"{name}: expected numbers, got objects ({shown(got)})"
    if want.dtype.kind == "f":
        bad = ~np.isclose(g.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True)
    else:
        bad = g != want
    if not np.any(bad):
        return None
    at = tuple(int(i) for i in np.argwhere(bad)[0])
    where = ", ".join(map(str, at))
    return f"{name}[{where}]: expected {shown(want[at])}, got {shown(g[at])}"


def compare_fields(names: Sequence[str], comparers: Sequence[Callable[[Any, Any, str], str | None]]):
    """A compare for outputs that are tuples of named parts, each with its own comparer."""
    def compare(got: Any, want: Any) -> str | None:
        if isinstance(want, Refused) or isinstance(got, Refused):
            return compare_value(got, want, "the result")
        if not isinstance(got, tuple | list) or len(got) != len(names):
            return f"expected a tuple ({', '.join(names)}), got {shown(got)}"
        for name, cmp, g, w in zip(names, comparers, got, want, strict=True):
            problem = cmp(g, w, name)
            if problem:
                return problem
        return None
    return compare
