"""Validating entry files: each file on its own (`read_entry`: the schema, then content.entry_checks), then
the rules across entries (`validate`).

Nothing in content is executed: compute expressions go through `content.expr`. Validation only reads an
entry; rendered values (spec numbers, questions) are computed on demand by `content.api`.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
from collections.abc import Iterable
from pathlib import Path

from pydantic import ValidationError

from content.entry_checks import check_entry
from content.problems import Problem, Record, schema_problems, yaml_type
from content.schema import Entry
from content.yamlio import MAX_BYTES, YamlProblem, read_yaml

CONTENT_DIR = Path(__file__).resolve().parent / "entries"


# Checking a file evaluates every equation over its declared ranges (about 30 ms a file here), and a lab's kernel
# or a test process reads the same files again and again (each widget loads its entry; tests copy the entries
# into folders of their own): a file whose name and bytes were read before is not checked again. What is kept
# depends on nothing else (the label only names the file in problems); each caller gets its own copy.
_READ: dict[tuple[str, bytes], Record] = {}
_READ_MAX = 512


def _bytes_key(path: Path) -> tuple[str, bytes] | None:
    try:
        if path.stat().st_size > MAX_BYTES:
            return None  # read_yaml refuses it: nothing worth keeping
        return path.stem, hashlib.sha256(path.read_bytes()).digest()
    except OSError:
        return None


def read_entry(path: Path, label: str | None = None) -> Record:
    """Read and check one file on its own (cross-entry rules are applied by `validate`)."""
    label = label or str(path)
    key = _bytes_key(path)
    if key is not None and key in _READ:
        kept = copy.deepcopy(_READ[key])
        return dataclasses.replace(kept, path=path, label=label,
                                   problems=[dataclasses.replace(p, file=label) for p in kept.problems])
    rec = _check_file(path, label)
    if key is not None and _bytes_key(path) == key:  # the file did not change while it was read
        if len(_READ) >= _READ_MAX:
            del _READ[next(iter(_READ))]
        _READ[key] = copy.deepcopy(rec)
    return rec


def _check_file(path: Path, label: str) -> Record:
    rec = Record(path, label)
    try:
        data, rec.lines = read_yaml(path)
    except YamlProblem as err:
        rec.problem(err.field, err.message, err.line)
        return rec
    if not isinstance(data, dict):
        rec.problem("entry", f"expected a mapping of entry fields, got {yaml_type(data)}", rec.lines.get(()))
        return rec
    try:
        entry = Entry.model_validate(data)
    except ValidationError as err:
        for loc, message in schema_problems(err.errors(), data):
            rec.problem(loc, message)
        return rec
    if entry.id != path.stem:
        rec.problem(("id",), f"expected the file name without .yaml ({path.stem!r}), got {entry.id!r}")
    check_entry(rec, entry)
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


def validate(records: list[Record], known_ids: Iterable[str] = ()) -> list[Problem]:
    """Cross-entry rules over files read with `read_entry`; returns every problem, the files' own first."""
    valid = [r for r in records if r.entry is not None]
    by_id: dict[str, Record] = {}
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

    Ids in `related` and `prerequisites` resolve against the entries checked and the repository's content/entries/.
    Returns the valid entries and every problem (files as named in `paths`).
    """
    records: list[Record] = []
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


def prerequisite_graph(entries: dict[str, Entry] | Iterable[Entry]) -> dict[str, list[str]]:
    """id -> the ids it lists as prerequisites (edges point from a concept to what it builds on)."""
    items = entries.values() if isinstance(entries, dict) else entries
    return {e.id: list(e.prerequisites) for e in items}
