"""What is wrong with an entry file: `Problem` (file, line, field, expected), `ContentError`, and the
translation of schema errors into one-line messages."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from content.schema import FIELD_NAMES, Entry
from content.yamlio import FieldPath, dotted


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
class Record:
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
        self.problems.append(Problem(self.label, line or _line_of(self.lines, loc), dotted(loc) or "entry", message))


def _line_of(lines: dict[FieldPath, int], loc: FieldPath) -> int | None:
    """The line of the field, or of the nearest enclosing field that has one."""
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None


# ----------------------------------------------------------------------------------------- schema errors

def yaml_type(value: Any) -> str:
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


# What a missing field should hold, where "this required field" would not tell an author enough.
MISSING_HINTS = {
    "appears_in": "the URL of a page where the belief is stated",
    "corrected_by": "the URL of a primary source that corrects the belief (paper, official docs, config or code)",
    "precision": "the significant figures the question grades at (1 to 6)",
}


def _schema_message(err: dict) -> str:
    kind, ctx, got = err["type"], err.get("ctx", {}), err.get("input")
    if kind == "missing":
        return f"expected {MISSING_HINTS.get(str(err['loc'][-1]), 'this required field')}, got nothing"
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
        return f"expected {expected[kind]}, got {yaml_type(got)}"
    if kind == "literal_error":
        return f"expected {ctx.get('expected')}, got {yaml_type(got)}"
    if kind == "too_short":
        return f"expected at least {ctx.get('min_length')} item(s), got {ctx.get('actual_length')}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        relation = {"greater_than": "greater than", "greater_than_equal": "at least",
                    "less_than": "less than", "less_than_equal": "at most"}[kind]
        bound = next(iter(ctx.values()))
        return f"expected a number {relation} {bound}, got {yaml_type(got)}"
    if kind == "union_tag_invalid":
        return f"expected kind {ctx.get('expected_tags')}, got {ctx.get('tag')!r}"
    if kind == "union_tag_not_found":
        return "expected a `kind` field ('choice' or 'numeric'), got none"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    return f"expected valid input ({err['msg']}), got {yaml_type(got)}"


def schema_problems(errors: list[dict], data: Any) -> list[tuple[FieldPath, str]]:
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
