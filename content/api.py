"""The content API the labs, widgets and tests use: load entries, evaluate science items, grade checks."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path

from content import expr
from content.devices import DeviceMemory
from content.entry_checks import inputs_problem
from content.problems import ContentError, Record
from content.schema import ID_PATTERN, ChoiceCheck, Entry, NumericCheck, Science, Spec, round_significant
from content.units import format_value, number_text, param_text, unit_factor
from content.validate import CONTENT_DIR, entry_files, read_entry, validate


def _root(root: str | Path | None) -> Path:
    return CONTENT_DIR if root is None else Path(root)


def load_all(root: str | Path | None = None) -> dict[str, Entry]:
    """Every entry in `root` (default: the repository's content/entries/), validated together, keyed by id."""
    directory = _root(root)
    if not directory.is_dir():
        raise ContentError(f"root: expected a directory of entry files, got {str(directory)!r}")
    records = [read_entry(p) for p in entry_files(directory)]
    problems = validate(records)
    if problems:
        raise ContentError(problems)
    return {r.entry.id: r.entry for r in records}


def corpus_text(root: str | Path | None = None) -> str:
    """The prose of every entry in `root` (strings over 20 characters, URLs left out), one per line.

    What `dantinox train` learns from by default: the course's own text, loaded by the strict loader.
    """
    texts: list[str] = []

    def collect(node) -> None:
        if isinstance(node, str):
            if len(node) > 20 and not node.startswith("http"):
                texts.append(" ".join(node.split()))
        elif isinstance(node, dict):
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    for entry in load_all(root).values():
        collect(entry.model_dump())
    if not texts:
        raise ContentError(f"root: no prose found in the entries of {_root(root)}")
    return "\n".join(texts)


def load_entry(id: str, root: str | Path | None = None) -> Entry:
    """One entry by id, validated together with the entries it depends on (its prerequisites, transitively)."""
    directory = _root(root)
    if not isinstance(id, str) or not re.fullmatch(ID_PATTERN, id):
        raise ContentError(f"id: expected an entry id like 'kv-cache', got {id!r}")
    if not (directory / f"{id}.yaml").is_file():
        have = ", ".join(p.stem for p in entry_files(directory)) if directory.is_dir() else "none"
        raise ContentError(f"id: expected one of the entries in {directory} ({have}), got {id!r}")
    known = [p.stem for p in entry_files(directory)]
    records: dict[str, Record] = {}
    queue = [id]
    while queue:
        current = queue.pop()
        if current in records or not (directory / f"{current}.yaml").is_file():
            continue
        rec = records[current] = read_entry(directory / f"{current}.yaml")
        if rec.entry is not None:
            queue.extend(rec.entry.prerequisites)
    problems = validate(list(records.values()), known)
    if problems:
        raise ContentError(problems)
    return records[id].entry


def _science(entry: Entry, key: str | int) -> Science:
    try:
        return entry.science_item(key)
    except ValueError as err:
        raise ContentError(str(err)) from None


def evaluate(entry: Entry, science: str | int, **variables: float) -> float:
    """Evaluate a science item (by title or index) for the given variable values, all of them required."""
    item = _science(entry, science)
    name, message = inputs_problem(item, variables)
    if message:
        raise ContentError(f"variables: {message}")
    try:
        return float(expr.evaluate(expr.parse(item.compute, set(item.variables)), variables))
    except expr.ExpressionError as err:
        raise ContentError(f"science {item.title!r}: {err}") from None


def _check_at(entry: Entry, check_index: int) -> ChoiceCheck | NumericCheck:
    if isinstance(check_index, bool) or not isinstance(check_index, int) or not \
            0 <= check_index < len(entry.checks):
        raise ContentError(f"check_index: expected 0 to {len(entry.checks) - 1} for {entry.id!r}, "
                           f"got {check_index!r}")
    return entry.checks[check_index]


def _numeric(entry: Entry, check_index: int) -> NumericCheck:
    check = _check_at(entry, check_index)
    if not isinstance(check, NumericCheck):
        raise ContentError(f"check_index: expected a numeric check, but checks[{check_index}] of {entry.id!r} "
                           f"is a {check.kind} check")
    return check


def _params(check: NumericCheck, params: dict[str, float] | None) -> dict[str, float]:
    params = dict(params or {})
    unknown = sorted(set(params) - set(check.params))
    if unknown:
        raise ContentError(f"params: expected some of {', '.join(check.params)}, got unknown {unknown[0]!r}")
    for name, value in params.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ContentError(f"params: {name}: expected a finite number, got {value!r}")
    return {**check.params, **params}


def check_answer(entry: Entry, check_index: int, params: dict[str, float] | None = None) -> float:
    """The answer of a numeric check, computed from its science item, in the check's unit.

    `params` overrides some or all of the check's own parameter values (a lab's sliders).
    """
    check = _numeric(entry, check_index)
    item = _science(entry, check.science)
    value = evaluate(entry, item.title, **_params(check, params))
    return value / unit_factor(check.unit, item.unit)


def is_correct(entry: Entry, check_index: int, response: float | int,
               params: dict[str, float] | None = None) -> bool:
    """Grade a learner's response: the option index for a choice check, a number within tolerance otherwise."""
    check = _check_at(entry, check_index)
    if isinstance(check, ChoiceCheck):
        _no_params(entry, check_index, params)
        return response == check.answer
    if isinstance(response, bool) or not isinstance(response, int | float) or not math.isfinite(response):
        raise ContentError(f"response: expected a finite number for checks[{check_index}], got {response!r}")
    answer = check_answer(entry, check_index, params)
    # the question asks for `precision` significant figures, so that rounding is right whatever the tolerance
    rounded = round_significant(answer, check.precision)
    return abs(response - answer) <= check.tolerance * abs(answer) or math.isclose(response, rounded, rel_tol=1e-9)


def _no_params(entry: Entry, check_index: int, params: dict[str, float] | None) -> None:
    if params:
        raise ContentError(f"params: checks[{check_index}] of {entry.id!r} is a choice check and takes "
                           f"no params, got {', '.join(params)}")


def render_question(entry: Entry, check_index: int, params: dict[str, float] | None = None) -> str:
    """The question text; for a numeric check, with its parameter values (or `params`) filled in."""
    check = _check_at(entry, check_index)
    if isinstance(check, ChoiceCheck):
        _no_params(entry, check_index, params)
        return check.question
    values = _params(check, params)
    text = check.question.format_map({k: param_text(v) for k, v in values.items()})
    return f"{text} {check.precision_note}"


def iter_numeric_checks(entry: Entry) -> Iterator[tuple[int, NumericCheck]]:
    return ((i, c) for i, c in enumerate(entry.checks) if isinstance(c, NumericCheck))


def spec_value(entry: Entry, spec: Spec | int) -> str:
    """A spec's value as shown: its words, or the number its `compute` gives, formatted (computed on each call)."""
    if isinstance(spec, int) and not isinstance(spec, bool):
        if not 0 <= spec < len(entry.specs):
            raise ContentError(f"spec: expected an index from 0 to {len(entry.specs) - 1}, got {spec}")
        spec = entry.specs[spec]
    if spec.compute is None:
        return spec.value
    item = _science(entry, spec.compute.science)
    result = evaluate(entry, item.title, **spec.compute.with_)
    if spec.compute.format == "number" and spec.compute.unit:
        result /= unit_factor(spec.compute.unit, item.unit)
    return format_value(result, spec.compute.format, spec.compute.unit)


def device_inputs(spec: Spec) -> str:
    """Which of a spec's inputs come from the device table, as a line for the card ('' when none)."""
    if spec.compute is None:
        return ""
    named = [f"{name} = {value.device} memory as the device reports it ({number_text(value / 2**20)} MiB)"
             for name, value in spec.compute.with_.items() if isinstance(value, DeviceMemory)]
    return f"From content/devices.yaml: {'; '.join(named)}." if named else ""


def content_version(entry_id: str, root: str | Path | None = None) -> str:
    """sha256 of the entry's YAML file: which text a learner's answer was given against."""
    import hashlib

    path = _root(root) / f"{entry_id}.yaml"
    if not path.is_file():
        raise ContentError(f"entry_id: expected an entry file {path}, got none")
    return hashlib.sha256(path.read_bytes()).hexdigest()
