"""The rules one entry must follow on its own, once its fields have the schema's types.

`check_entry` runs them all: every science item's expression parses and uses only its variables, specs and
quiz checks compute from the entry's own formulas, numeric questions state their precision once and grade at
it, misconceptions cite a primary source apart from where the belief appears, device capacities are named
rather than typed, history items are not dated before their arXiv source, no prose orders two works by a
relative time ("days later"), and the ranges are finite (content.ranges). Rules across entries are content.validate's.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from content import expr, ranges
from content.devices import DeviceMemory, typed_capacity
from content.problems import Record
from content.schema import ChoiceCheck, Entry, NumericCheck, Science, round_significant
from content.units import number_text, unit_factor
from content.yamlio import FieldPath


def check_entry(rec: Record, entry: Entry) -> None:
    """Record in `rec` every problem of `entry` on its own."""
    parsed = _check_science(rec, entry)
    _check_specs(rec, entry, parsed)
    _check_checks(rec, entry, parsed)
    _check_lists(rec, entry)
    _check_misconceptions(rec, entry)
    _check_pull_requests(rec, entry)
    _check_capacities(rec, entry)
    _check_history_years(rec, entry)
    _check_relative_timing(rec, entry)
    ranges.check(rec, entry, parsed)


def _check_science(rec: Record, entry: Entry) -> dict[str, Any]:
    """Vet every compute expression; returns title -> parsed expression for the ones that are valid."""
    parsed: dict[str, Any] = {}
    seen: set[str] = set()
    for i, item in enumerate(entry.science):
        if item.title in seen:
            rec.problem(("science", i, "title"), f"expected a title used once per entry, got {item.title!r} again")
        seen.add(item.title)
        declared = set(item.variables)
        try:
            tree = expr.parse(item.compute, declared)
        except expr.ExpressionError as err:
            rec.problem(("science", i, "compute"), str(err))
            continue
        unused = sorted(declared - expr.free_names(tree))
        if unused:
            rec.problem(("science", i, "variables", unused[0]),
                        f"expected every declared variable to appear in compute, got unused '{unused[0]}'")
            continue
        parsed[item.title] = tree
    return parsed


def inputs_problem(item: Science, given: dict[str, Any]) -> tuple[str | None, str | None]:
    """(offending name, message) when `given` does not name exactly the variables of `item`."""
    extra = sorted(set(given) - set(item.variables))
    if extra:
        return extra[0], (f"expected only the variables of {item.title!r} ({', '.join(item.variables)}), "
                          f"got unknown '{extra[0]}'")
    missing = [v for v in item.variables if v not in given]
    if missing:
        return None, f"expected a value for every variable of {item.title!r}, got none for {', '.join(missing)}"
    return None, None


def _lookup(entry: Entry, title: str) -> Science | None:
    return next((s for s in entry.science if s.title == title), None)


def _science_titles(entry: Entry) -> str:
    return ", ".join(repr(s.title) for s in entry.science) or "none"


def _usable_science(rec: Record, loc: FieldPath, entry: Entry, title: str, inputs: dict[str, Any],
                    inputs_field: str, parsed: dict[str, Any]) -> Science | None:
    """The science item `title` names, if it exists, parses and gets exactly its variables; else report why."""
    item = _lookup(entry, title)
    if item is None:
        rec.problem((*loc, "science"), f"expected the title of one of this entry's science items "
                    f"({_science_titles(entry)}), got {title!r}")
        return None
    if item.title not in parsed:
        return None  # its compute is already reported
    name, message = inputs_problem(item, inputs)
    if message:
        rec.problem((*loc, inputs_field, name) if name else (*loc, inputs_field), message)
        return None
    return item


def _check_specs(rec: Record, entry: Entry, parsed: dict[str, Any]) -> None:
    for i, spec in enumerate(entry.specs):
        if spec.compute is None:
            continue
        loc = ("specs", i, "compute")
        item = _usable_science(rec, loc, entry, spec.compute.science, spec.compute.with_, "with", parsed)
        if item is None:
            continue
        try:
            expr.evaluate(parsed[item.title], spec.compute.with_)
        except expr.ExpressionError as err:
            rec.problem((*loc, "with"), str(err))
            continue
        if spec.compute.format == "number" and spec.compute.unit and unit_factor(spec.compute.unit, item.unit) is None:
            rec.problem((*loc, "unit"), f"expected {item.unit!r} (the unit of {item.title!r}) or a scaled "
                        f"form of it, got {spec.compute.unit!r}")


def _check_checks(rec: Record, entry: Entry, parsed: dict[str, Any]) -> None:
    if not any(isinstance(c, NumericCheck) for c in entry.checks):
        rec.problem(("checks",), "expected at least one numeric check (kind: numeric), got only choice checks")
    for i, check in enumerate(entry.checks):
        loc = ("checks", i)
        if isinstance(check, ChoiceCheck):
            _check_choice(rec, loc, check, len(entry.misconception))
        else:
            _check_numeric(rec, loc, entry, check, parsed)


def _check_choice(rec: Record, loc: FieldPath, check: ChoiceCheck, n_misconceptions: int) -> None:
    n = len(check.options)
    if not 0 <= check.answer < n:
        rec.problem((*loc, "answer"), f"expected an option index from 0 to {n - 1}, got {check.answer}")
    if len(set(check.options)) != n:
        rec.problem((*loc, "options"), "expected distinct options, got the same text twice")
    if check.feedback is not None and len(check.feedback) != n:
        rec.problem((*loc, "feedback"), f"expected one feedback line per option ({n}), got {len(check.feedback)}")
    for option, belief in check.beliefs.items():
        if not 0 <= option < n or option == check.answer:
            rec.problem((*loc, "beliefs", option), f"expected the index of a wrong option (0 to {n - 1}, not the "
                        f"answer {check.answer}), got {option}")
        elif not 0 <= belief < n_misconceptions:
            rec.problem((*loc, "beliefs", option), f"expected an index into this entry's misconception list "
                        f"(0 to {n_misconceptions - 1}), got {belief}")


def _placeholders(question: str) -> list[str]:
    try:
        return [f for _, f, _, _ in string.Formatter().parse(question) if f is not None]
    except ValueError as err:
        raise expr.ExpressionError(f"expected {{name}} placeholders and doubled braces, got: {err}") from None


def _check_numeric(rec: Record, loc: FieldPath, entry: Entry, check: NumericCheck,
                   parsed: dict[str, Any]) -> None:
    item = _usable_science(rec, loc, entry, check.science, check.params, "params", parsed)
    if item is None:
        return
    try:
        fields = _placeholders(check.question)
    except expr.ExpressionError as err:
        rec.problem((*loc, "question"), str(err))
        return
    unknown = [f for f in fields if f not in check.params]
    if unknown:
        rec.problem((*loc, "question"), f"expected placeholders naming params ({', '.join(check.params)}), "
                    f"got {{{unknown[0]}}}")
        return
    unshown = [p for p in check.params if p not in fields]
    if unshown:
        rec.problem((*loc, "question"), f"expected every param to appear as a placeholder so learners see "
                    f"its value, got no {{{unshown[0]}}}")
        return
    if unit_factor(check.unit, item.unit) is None:
        rec.problem((*loc, "unit"), f"expected {item.unit!r} (the unit of {item.title!r}) or a scaled form "
                    f"of it, got {check.unit!r}")
        return
    try:
        answer = expr.evaluate(parsed[item.title], check.params) / unit_factor(check.unit, item.unit)
    except expr.ExpressionError as err:
        rec.problem((*loc, "params"), str(err))
        return
    _check_precision(rec, loc, check, answer)


PRECISION_WORDS = ("significant figure", "decimal place", "to the nearest")


def _check_precision(rec: Record, loc: FieldPath, check: NumericCheck, answer: float) -> None:
    """The question states its precision once (from `precision`), and the tolerance grades at that precision."""
    stated = next((w for w in PRECISION_WORDS if w in check.question.lower()), None)
    if stated:
        rec.problem((*loc, "question"), f"expected the precision only in `precision` (the rendered question "
                    f"states it), got {stated!r} in the question text")
        return
    if answer == 0:
        return
    rounded = round_significant(answer, check.precision)
    if abs(rounded - answer) > check.tolerance * abs(answer):
        rec.problem((*loc, "tolerance"), f"expected a tolerance that accepts the answer rounded as the question "
                    f"asks ({rounded:g} is {abs(rounded - answer) / abs(answer):.1%} off {answer:.4g}), "
                    f"got {check.tolerance:g}")
        return
    if check.precision == 1:
        return
    coarse = round_significant(answer, check.precision - 1)
    off = abs(coarse - answer) / abs(answer)
    if coarse != round_significant(answer, check.precision) and off <= check.tolerance:
        figures = f"{check.precision - 1} significant figure" + ("s" if check.precision > 2 else "")
        rec.problem((*loc, "tolerance"), f"expected a tolerance that refuses the answer rounded to {figures} "
                    f"({coarse:g} is {off:.1%} off {answer:.4g}), got {check.tolerance:g}")


def _same_url(a: str, b: str) -> bool:
    """Equal up to scheme, letter case of the host, a leading www., a trailing slash and a #fragment."""
    def norm(url: str) -> tuple[str, str, str]:
        parts = urlsplit(url)
        return (parts.netloc.lower().removeprefix("www."), parts.path.rstrip("/"), parts.query)
    return norm(a) == norm(b)


def _check_misconceptions(rec: Record, entry: Entry) -> None:
    for i, item in enumerate(entry.misconception):
        if _same_url(item.appears_in, item.corrected_by):
            rec.problem(("misconception", i, "corrected_by"), "expected a primary source that corrects the "
                        f"belief, not the page where it appears (appears_in), got the same URL {item.corrected_by!r}")


# A pull request's own page changes as commits land and may show the fix rather than the belief; one of its
# commits (…/pull/N/commits/<sha>) is a fixed state. A file at a commit is written …/blob/<sha>/<path>.
PULL_REQUEST = re.compile(r"^/[^/]+/[^/]+/pull/\d+(?P<rest>[^?#]*)")
PULL_AT_COMMIT = re.compile(r"^/(commits|changes|files)/[0-9a-f]{7,40}(\.\.[0-9a-f]{7,40})?/?$")


def pull_request_problem(url: str, shows: str) -> str | None:
    """Why `url` cannot be an appears_in link (a GitHub pull request at no particular state), or None."""
    parts = urlsplit(url)
    match = PULL_REQUEST.match(parts.path) if (parts.hostname or "").lower() in ("github.com", "www.github.com") \
        else None
    if match is None or shows == "fix" or PULL_AT_COMMIT.match(match["rest"]):
        return None
    return (f"expected a pull request at a commit (.../pull/N/commits/<sha>) or the file before the fix "
            f"(.../blob/<sha>/<path>#L<line>), or `shows: fix` when the link is the fix of this belief, got {url!r}")


def _check_pull_requests(rec: Record, entry: Entry) -> None:
    for i, item in enumerate(entry.misconception):
        problem = pull_request_problem(item.appears_in, item.shows)
        if problem:
            rec.problem(("misconception", i, "appears_in"), problem)


def _capacity_problem(value: float, unit: str) -> str | None:
    """Why a typed input must name a device instead, or why a device's memory does not fit this variable."""
    factor = unit_factor(unit, "B")
    if isinstance(value, DeviceMemory):
        return None if factor == 1 else (f"expected a device's memory only for a variable in B, got "
                                         f"{{device_memory: {value.device}}} for one in {unit!r}")
    found = typed_capacity(value * factor) if factor is not None else []
    if not found:
        return None
    names = " or ".join(dict.fromkeys(device for device, _ in found))
    which = "; ".join(f"the {device}'s {form}" for device, form in found)
    return (f"expected {{device_memory: <device>}} naming {names} (capacities come from content/devices.yaml), "
            f"got the typed number {number_text(value)}: {which}")


def _check_capacities(rec: Record, entry: Entry) -> None:
    """Every value in bytes that is a known device's capacity names the device; none is typed."""
    inputs: list[tuple[tuple, Science | None, dict[str, float]]] = []
    for i, spec in enumerate(entry.specs):
        if spec.compute is not None:
            inputs.append((("specs", i, "compute", "with"), _lookup(entry, spec.compute.science), spec.compute.with_))
    for i, check in enumerate(entry.checks):
        if isinstance(check, NumericCheck):
            inputs.append((("checks", i, "params"), _lookup(entry, check.science), check.params))
    for loc, item, values in inputs:
        for name, value in values.items():
            if item is not None and name in item.variables:
                problem = _capacity_problem(value, item.variables[name].unit)
                if problem:
                    rec.problem((*loc, name), problem)
    for i, item in enumerate(entry.science):
        for name, variable in item.variables.items():
            if variable.default is not None:
                problem = _capacity_problem(variable.default, variable.unit)
                if problem:
                    rec.problem(("science", i, "variables", name, "default"), problem)


def _check_lists(rec: Record, entry: Entry) -> None:
    for name in ("related", "prerequisites"):
        ids = getattr(entry, name)
        for i, other in enumerate(ids):
            if other == entry.id:
                rec.problem((name, i), f"expected ids of other entries, got this entry's own id {other!r}")
            elif other in ids[:i]:
                rec.problem((name, i), f"expected each id once, got {other!r} again")


# A new-style arXiv identifier starts with the year and month of its first version: 2403.02310 is March 2024.
ARXIV_PATH = re.compile(r"^/(?:abs|pdf|html)/(?P<id>(?P<yy>\d{2})(?P<mm>\d{2})\.\d{4,5})")


def arxiv_first_year(url: str) -> tuple[int, str] | None:
    """(year of the first version, identifier) of an arxiv.org abstract, PDF or HTML link, or None."""
    parts = urlsplit(url)
    if (parts.hostname or "").lower() not in ("arxiv.org", "www.arxiv.org"):
        return None
    match = ARXIV_PATH.match(parts.path)
    if match is None or not 1 <= int(match["mm"]) <= 12:
        return None
    return 2000 + int(match["yy"]), match["id"]


def _check_history_years(rec: Record, entry: Entry) -> None:
    """A history item cannot precede the first version of the paper it cites (a later venue year is fine)."""
    for i, item in enumerate(entry.history):
        first = arxiv_first_year(item.source)
        if first is not None and item.year < first[0]:
            rec.problem(("history", i, "year"), f"expected a year no earlier than the first arXiv version of its "
                        f"source ({first[0]}, from the identifier {first[1]}), got {item.year}: credit the "
                        f"earlier work with its own item and source")


# Which of two works came first depends on which versions are counted (a preprint elsewhere, arXiv, a venue),
# so the order is stated with dates and places, never as a relative time between them.
RELATIVE_TIMING = re.compile(r"\b(?:days|weeks|months) (?:later|earlier|before|after)\b", re.IGNORECASE)


def _text_fields(value: Any, loc: FieldPath = ()) -> Iterator[tuple[FieldPath, str]]:
    if isinstance(value, str):
        yield loc, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _text_fields(item, (*loc, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _text_fields(item, (*loc, i))


def _check_relative_timing(rec: Record, entry: Entry) -> None:
    for loc, text in _text_fields(entry.model_dump(by_alias=True, exclude_none=True)):
        match = RELATIVE_TIMING.search(text)
        if match:
            rec.problem(loc, f"expected the dates and places of the versions being ordered (which came first "
                        f"depends on the versions counted), got a relative time {match[0]!r}")
