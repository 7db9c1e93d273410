"""`dantinox content check [PATH ...]`: validate entry files and directories, one line per problem."""

from __future__ import annotations

import sys
from pathlib import Path

from dantinox.content.loader import CONTENT_DIR, Problem, entry_files, read_entry, validate


def run(paths: list[str]) -> int:
    """Validate the files and directories in `paths`; print problems (or one OK line); return 0 or 1.

    Ids in `related` and `prerequisites` resolve against the entries checked and the repository's content/.
    """
    records, problems = [], []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            files = entry_files(path)
            if not files:
                problems.append(Problem(name, None, "path", "expected a directory with .yaml entry files, got none"))
            records += [read_entry(f, str(Path(name) / f.name)) for f in files]
        elif path.is_file():
            records.append(read_entry(path, name))
        else:
            problems.append(Problem(name, None, "path", "expected an entry file or a directory, got nothing there"))
    known = [p.stem for p in entry_files(CONTENT_DIR)] if CONTENT_DIR.is_dir() else []
    problems += validate(records, known)
    for problem in problems:
        print(problem)
    if problems:
        return 1
    entries = [r.entry for r in records]
    checks = sum(len(e.checks) for e in entries)
    science = sum(len(e.science) for e in entries)
    print(f"OK: {len(entries)} entries valid ({checks} checks, {science} science items)")
    sys.stdout.flush()
    return 0
