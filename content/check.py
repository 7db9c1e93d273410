"""`dantinox content check [PATH ...]`: validate entry files and directories, one line per problem."""

from __future__ import annotations

from content.validate import validate_files


def run(paths: list[str]) -> int:
    """Validate the files and directories in `paths`; print each problem (or one OK line); return 0 or 1."""
    entries, problems = validate_files(paths)
    for problem in problems:
        print(problem)
    if problems:
        return 1
    checks = sum(len(e.checks) for e in entries)
    science = sum(len(e.science) for e in entries)
    noun = "entry" if len(entries) == 1 else "entries"
    print(f"OK: {len(entries)} {noun} valid ({checks} checks, {science} science items)")
    return 0
