"""Loading and validating concept entries, and the Python API the labs and widgets use.

Every problem is a `Problem` (file, line, field path, what was expected); the API raises `ContentError`
(a ValueError) whose message is the first problem on one line. Nothing in content is executed: compute
expressions go through `dantinox.content.expr`.
"""

from __future__ import annotations

import difflib
import math
import re
import string
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dantinox.content import expr
from dantinox.content.schema import FIELD_NAMES, ID_PATTERN, ChoiceCheck, Entry, NumericCheck, Science, Spec
from dantinox.content.yamlio import FieldPath, YamlProblem, _dotted, read_yaml

CONTENT_DIR = Path(__file__).resolve().parents[2] / "content"

# A numeric check may ask for its answer in a scaled form of the science item's unit.
UNIT_FAMILIES: tuple[dict[str, float], ...] = (
    {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
     "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12},
    {"s": 1, "ms": 1e-3, "us": 1e-6},
    {"B/s": 1, "KB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12},
    {"params": 1, "thousand params": 1e3, "million params": 1e6, "billion params": 1e9},
)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one entry file."""

    file: str
    line: int | None
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.field}: {self.message}"


class ContentError(ValueError):
    """Invalid content, or a bad argument to the content API. `problems` lists every problem found."""

    def __init__(self, problems: list[Problem] | str):
        if isinstance(problems, str):  # a bad argument to the API, not a problem in a file
            self.problems: list[Problem] = []
            super().__init__(problems)
            return
        self.problems = problems
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        super().__init__(f"{problems[0]}{more}")


@dataclass
class _Record:
    """One file as read: its entry when the file itself is valid, its problems, its line map."""

    path: Path
    label: str
    entry: Entry | None = None
    lines: dict[FieldPath, int] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    def problem(self, loc: FieldPath | str, message: str, line: int | None = None) -> None:
        if isinstance(loc, str):
            self.problems.append(Problem(self.label, line, loc, message))
            return
        self.problems.append(Problem(self.label, line or _line_of(self.lines, loc), _dotted(loc) or "entry", message))


def _line_of(lines: dict[FieldPath, int], loc: FieldPath) -> int | None:
    """The line of the field, or of the nearest enclosing field that has one."""
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None


# ----------------------------------------------------------------------------------------- schema errors

def _yaml_type(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"true/false ({str(value).lower()})"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the text {value[:60]!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _clean_loc(loc: tuple, data: Any) -> FieldPath:
    """Pydantic's error location as a path through the YAML data (drops union tags such as 'numeric')."""
    out: list[str | int] = []
    node = data
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif not last:
            continue  # a tag pydantic inserts, not a key in the file
        out.append(part)
    return tuple(out)


def _schema_message(err: dict) -> str:
    kind, ctx, got = err["type"], err.get("ctx", {}), err.get("input")
    if kind == "missing":
        return "expected this required field, got nothing"
    if kind == "extra_forbidden":
        name = str(err["loc"][-1])
        close = difflib.get_close_matches(name, FIELD_NAMES, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return f"expected a known field{hint}, got unknown key '{name}'"
    expected = {
        "string_type": "text", "int_type": "a whole number", "float_type": "a number",
        "list_type": "a list", "dict_type": "a mapping", "model_type": "a mapping",
        "model_attributes_type": "a mapping", "bool_type": "true or false",
    }
    if kind in expected:
        return f"expected {expected[kind]}, got {_yaml_type(got)}"
    if kind == "literal_error":
        return f"expected {ctx.get('expected')}, got {_yaml_type(got)}"
    if kind == "too_short":
        return f"expected at least {ctx.get('min_length')} item(s), got {ctx.get('actual_length')}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        relation = {"greater_than": "greater than", "greater_than_equal": "at least",
                    "less_than": "less than", "less_than_equal": "at most"}[kind]
        bound = next(iter(ctx.values()))
        return f"expected a number {relation} {bound}, got {_yaml_type(got)}"
    if kind == "union_tag_invalid":
        return f"expected kind {ctx.get('expected_tags')}, got {ctx.get('tag')!r}"
    if kind == "union_tag_not_found":
        return "expected a `kind` field ('choice' or 'numeric'), got none"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    return f"expected valid input ({err['msg']}), got {_yaml_type(got)}"


def _schema_problems(errors: list[dict], data: Any) -> list[tuple[FieldPath, str]]:
    """(path, message) per schema error; a misspelled key is one problem, not 'unknown' plus 'missing'."""
    located = [(_clean_loc(e["loc"], data), e) for e in errors]
    missing = {loc for loc, e in located if e["type"] == "missing"}
    typos: dict[FieldPath, str] = {}  # path of the missing field -> the misspelled key found instead
    for loc, e in located:
        if e["type"] == "extra_forbidden":
            siblings = [m[-1] for m in missing if m[:-1] == loc[:-1]]
            close = difflib.get_close_matches(str(loc[-1]), siblings, n=1)
            if close:
                typos[(*loc[:-1], close[0])] = str(loc[-1])
    out = []
    for loc, e in located:
        if e["type"] == "missing" and loc in typos:
            continue
        if e["type"] == "extra_forbidden" and str(loc[-1]) in typos.values():
            right = next(k[-1] for k, v in typos.items() if v == loc[-1] and k[:-1] == loc[:-1])
            out.append((loc, f"expected the field '{right}', got misspelled key '{loc[-1]}'"))
            continue
        out.append((loc, _schema_message(e)))
    return out


# ----------------------------------------------------------------------------------------- one entry

def _unit_factor(target: str, base: str) -> float | None:
    """How many `base` units make one `target` unit; None if they are not the same kind of quantity."""
    if target == base:
        return 1.0
    for family in UNIT_FAMILIES:
        if target in family and base in family:
            return family[target] / family[base]
    return None


def _format_value(value: float, fmt: str, unit: str) -> str:
    if fmt == "bytes":
        from dantinox.memory import format_bytes

        return format_bytes(value)
    if fmt == "times":
        return f"{_number_text(value)}×"
    if fmt == "percent":
        return f"{_number_text(100 * value)}%"
    if fmt == "seconds":
        for scale, name in ((1, "s"), (1e-3, "ms"), (1e-6, "µs")):
            if abs(value) >= scale or name == "µs":
                return f"{_number_text(value / scale)} {name}"
    return f"{_number_text(value)} {unit}".strip()


def _number_text(value: float) -> str:
    """4096 -> '4,096'; 2.25 -> '2.25'; 0.01757 -> '0.0176' (three significant decimals at most)."""
    if float(value).is_integer() and abs(value) < 2**53:
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.1f}".rstrip("0").rstrip(".")
    return f"{value:.3g}" if abs(value) < 1 else f"{value:,.3f}".rstrip("0").rstrip(".")


def _check_science(rec: _Record, entry: Entry) -> dict[str, Any]:
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


def _inputs_problem(item: Science, given: dict[str, Any]) -> tuple[str | None, str | None]:
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


def _usable_science(rec: _Record, loc: FieldPath, entry: Entry, title: str, inputs: dict[str, Any],
                    inputs_field: str, parsed: dict[str, Any]) -> Science | None:
    """The science item `title` names, if it exists, parses and gets exactly its variables; else report why."""
    item = _lookup(entry, title)
    if item is None:
        rec.problem((*loc, "science"), f"expected the title of one of this entry's science items "
                    f"({_science_titles(entry)}), got {title!r}")
        return None
    if item.title not in parsed:
        return None  # its compute is already reported
    name, message = _inputs_problem(item, inputs)
    if message:
        rec.problem((*loc, inputs_field, name) if name else (*loc, inputs_field), message)
        return None
    return item


def _check_specs(rec: _Record, entry: Entry, parsed: dict[str, Any]) -> None:
    for i, spec in enumerate(entry.specs):
        if spec.compute is None:
            continue
        loc = ("specs", i, "compute")
        item = _usable_science(rec, loc, entry, spec.compute.science, spec.compute.with_, "with", parsed)
        if item is None:
            continue
        try:
            result = expr.evaluate(parsed[item.title], spec.compute.with_)
        except expr.ExpressionError as err:
            rec.problem((*loc, "with"), str(err))
            continue
        if spec.compute.format == "number" and spec.compute.unit:
            factor = _unit_factor(spec.compute.unit, item.unit)
            if factor is None:
                rec.problem((*loc, "unit"), f"expected {item.unit!r} (the unit of {item.title!r}) or a scaled "
                            f"form of it, got {spec.compute.unit!r}")
                continue
            result /= factor
        spec.value = _format_value(result, spec.compute.format, spec.compute.unit)


def _check_checks(rec: _Record, entry: Entry, parsed: dict[str, Any]) -> None:
    if not any(isinstance(c, NumericCheck) for c in entry.checks):
        rec.problem(("checks",), "expected at least one numeric check (kind: numeric), got only choice checks")
    for i, check in enumerate(entry.checks):
        loc = ("checks", i)
        if isinstance(check, ChoiceCheck):
            _check_choice(rec, loc, check)
        else:
            _check_numeric(rec, loc, entry, check, parsed)


def _check_choice(rec: _Record, loc: FieldPath, check: ChoiceCheck) -> None:
    n = len(check.options)
    if not 0 <= check.answer < n:
        rec.problem((*loc, "answer"), f"expected an option index from 0 to {n - 1}, got {check.answer}")
    if len(set(check.options)) != n:
        rec.problem((*loc, "options"), "expected distinct options, got the same text twice")
    if check.feedback is not None and len(check.feedback) != n:
        rec.problem((*loc, "feedback"), f"expected one feedback line per option ({n}), got {len(check.feedback)}")


def _placeholders(question: str) -> list[str]:
    try:
        return [f for _, f, _, _ in string.Formatter().parse(question) if f is not None]
    except ValueError as err:
        raise expr.ExpressionError(f"expected {{name}} placeholders and doubled braces, got: {err}") from None


def _check_numeric(rec: _Record, loc: FieldPath, entry: Entry, check: NumericCheck,
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
    if _unit_factor(check.unit, item.unit) is None:
        rec.problem((*loc, "unit"), f"expected {item.unit!r} (the unit of {item.title!r}) or a scaled form "
                    f"of it, got {check.unit!r}")
        return
    try:
        expr.evaluate(parsed[item.title], check.params)
    except expr.ExpressionError as err:
        rec.problem((*loc, "params"), str(err))


def _check_lists(rec: _Record, entry: Entry) -> None:
    for name in ("related", "prerequisites"):
        ids = getattr(entry, name)
        for i, other in enumerate(ids):
            if other == entry.id:
                rec.problem((name, i), f"expected ids of other entries, got this entry's own id {other!r}")
            elif other in ids[:i]:
                rec.problem((name, i), f"expected each id once, got {other!r} again")


def read_entry(path: Path, label: str | None = None) -> _Record:
    """Read and check one file on its own (cross-entry rules are applied by `validate`)."""
    rec = _Record(path, label or str(path))
    try:
        data, rec.lines = read_yaml(path)
    except YamlProblem as err:
        rec.problem(err.field, err.message, err.line)
        return rec
    if not isinstance(data, dict):
        rec.problem("entry", f"expected a mapping of entry fields, got {_yaml_type(data)}", rec.lines.get(()))
        return rec
    try:
        entry = Entry.model_validate(data)
    except ValidationError as err:
        for loc, message in _schema_problems(err.errors(), data):
            rec.problem(loc, message)
        return rec
    if entry.id != path.stem:
        rec.problem(("id",), f"expected the file name without .yaml ({path.stem!r}), got {entry.id!r}")
    parsed = _check_science(rec, entry)
    _check_specs(rec, entry, parsed)
    _check_checks(rec, entry, parsed)
    _check_lists(rec, entry)
    if not rec.problems:
        rec.entry = entry
    return rec


# ----------------------------------------------------------------------------------------- many entries

def _find_cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """One prerequisite cycle as [a, b, ..., a], or None. Iterative depth-first search."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(graph.get(start, []))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt) and nxt in graph:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(graph[nxt]))
    return None


def validate(records: list[_Record], known_ids: Iterable[str] = ()) -> list[Problem]:
    """Cross-entry rules over files read with `read_entry`; returns every problem, the files' own first."""
    valid = [r for r in records if r.entry is not None]
    by_id: dict[str, _Record] = {}
    for rec in valid:
        if rec.entry.id in by_id:
            rec.problem(("id",), f"expected ids unique across the files checked, got {rec.entry.id!r} "
                        f"also in {by_id[rec.entry.id].label}")
        else:
            by_id[rec.entry.id] = rec
    # ids that failed validation still exist: do not report references to them as missing
    known = set(known_ids) | {r.path.stem for r in records} | set(by_id)
    for rec in valid:
        for name in ("related", "prerequisites"):
            for i, other in enumerate(getattr(rec.entry, name)):
                if other not in known and other != rec.entry.id:
                    close = difflib.get_close_matches(other, sorted(known), n=1)
                    hint = f" such as {close[0]!r}" if close else ""
                    rec.problem((name, i), f"expected the id of an existing entry{hint}, got {other!r}")
    graph = prerequisite_graph({i: r.entry for i, r in by_id.items()})
    reported: set[str] = set()
    while (cycle := _find_cycle({k: v for k, v in graph.items() if k not in reported})) is not None:
        first = cycle[0]
        rec = by_id[first]
        rec.problem(("prerequisites", rec.entry.prerequisites.index(cycle[1])),
                    f"expected no prerequisite cycle, got {' -> '.join(cycle)}")
        reported.update(cycle)
    problems = [p for r in records for p in r.problems]
    return sorted(problems, key=lambda p: (p.file, p.line or 0))


def entry_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())


def validate_files(paths: Iterable[str | Path]) -> tuple[list[Entry], list[Problem]]:
    """Validate entry files and directories together, as `dantinox content check` does.

    Ids in `related` and `prerequisites` resolve against the entries checked and the repository's content/.
    Returns the valid entries and every problem (files as named in `paths`).
    """
    records: list[_Record] = []
    problems: list[Problem] = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            files = entry_files(path)
            if not files:
                problems.append(Problem(str(name), None, "path",
                                        "expected a directory with .yaml entry files, got none"))
            records += [read_entry(f, str(path / f.name)) for f in files]
        elif path.is_file():
            records.append(read_entry(path, str(name)))
        else:
            problems.append(Problem(str(name), None, "path",
                                    "expected an entry file or a directory, got nothing there"))
    known = [p.stem for p in entry_files(CONTENT_DIR)] if CONTENT_DIR.is_dir() else []
    problems += validate(records, known)
    return [r.entry for r in records if r.entry is not None and not r.problems], problems


# ----------------------------------------------------------------------------------------- public API

def _root(root: str | Path | None) -> Path:
    return CONTENT_DIR if root is None else Path(root)


def load_all(root: str | Path | None = None) -> dict[str, Entry]:
    """Every entry in `root` (default: the repository's content/), validated together, keyed by id."""
    directory = _root(root)
    if not directory.is_dir():
        raise ContentError(f"root: expected a directory of entry files, got {str(directory)!r}")
    records = [read_entry(p) for p in entry_files(directory)]
    problems = validate(records)
    if problems:
        raise ContentError(problems)
    return {r.entry.id: r.entry for r in records}


def load_entry(id: str, root: str | Path | None = None) -> Entry:
    """One entry by id, validated together with the entries it depends on (its prerequisites, transitively)."""
    directory = _root(root)
    if not isinstance(id, str) or not re.fullmatch(ID_PATTERN, id):
        raise ContentError(f"id: expected an entry id like 'kv-cache', got {id!r}")
    if not (directory / f"{id}.yaml").is_file():
        have = ", ".join(p.stem for p in entry_files(directory)) if directory.is_dir() else "none"
        raise ContentError(f"id: expected one of the entries in {directory} ({have}), got {id!r}")
    known = [p.stem for p in entry_files(directory)]
    records: dict[str, _Record] = {}
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


def prerequisite_graph(entries: dict[str, Entry] | Iterable[Entry]) -> dict[str, list[str]]:
    """id -> the ids it lists as prerequisites (edges point from a concept to what it builds on)."""
    items = entries.values() if isinstance(entries, dict) else entries
    return {e.id: list(e.prerequisites) for e in items}


def _science(entry: Entry, key: str | int) -> Science:
    try:
        return entry.science_item(key)
    except ValueError as err:
        raise ContentError(str(err)) from None


def evaluate(entry: Entry, science: str | int, **variables: float) -> float:
    """Evaluate a science item (by title or index) for the given variable values, all of them required."""
    item = _science(entry, science)
    name, message = _inputs_problem(item, variables)
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
    return value / _unit_factor(check.unit, item.unit)


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
    return abs(response - answer) <= check.tolerance * abs(answer)


def _no_params(entry: Entry, check_index: int, params: dict[str, float] | None) -> None:
    if params:
        raise ContentError(f"params: checks[{check_index}] of {entry.id!r} is a choice check and takes "
                           f"no params, got {', '.join(params)}")


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def _param_text(value: float) -> str:
    """How a parameter reads in a question: 4,096; 0.9; 4.8 × 10¹² for very large or small values."""
    if value and (abs(value) >= 1e7 or abs(value) < 1e-3):
        exponent = math.floor(math.log10(abs(value)))
        mantissa = f"{value / 10**exponent:.4g}"
        return f"{mantissa} × 10{str(exponent).translate(_SUPERSCRIPT)}"
    return _number_text(value) if float(value).is_integer() else f"{value:g}"


def render_question(entry: Entry, check_index: int, params: dict[str, float] | None = None) -> str:
    """The question text; for a numeric check, with its parameter values (or `params`) filled in."""
    check = _check_at(entry, check_index)
    if isinstance(check, ChoiceCheck):
        _no_params(entry, check_index, params)
        return check.question
    values = _params(check, params)
    return check.question.format_map({k: _param_text(v) for k, v in values.items()})


def iter_numeric_checks(entry: Entry) -> Iterator[tuple[int, NumericCheck]]:
    return ((i, c) for i, c in enumerate(entry.checks) if isinstance(c, NumericCheck))


__all__ = ["CONTENT_DIR", "ContentError", "Entry", "Problem", "Spec", "check_answer", "evaluate", "is_correct",
           "iter_numeric_checks", "load_all", "load_entry", "prerequisite_graph", "read_entry", "render_question",
           "validate", "validate_files"]
