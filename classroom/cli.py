"""`dantinox answers export` and `dantinox classroom nbgrader`: what the commands do once parsed.

Bad input ends in one line on stderr and exit status 2; the store is only read (never created) by export.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
from pathlib import Path

from classroom.store import AnswerStore, Attempt, current_learner, default_path
from classroom.summary import attempt_table, to_csv

EXPORT_FIELDS = [*Attempt.__dataclass_fields__, "reset"]


def _fail(command: str, message: str) -> int:
    print(f"dantinox {command}: error: {message}", file=sys.stderr)
    return 2


def export_rows(store: AnswerStore, learner: str, entry_id: str | None = None) -> list[dict]:
    """A learner's attempts (reset ones included, flagged), as flat rows in time order."""
    every = store.attempts(learner, entry_id, include_reset=True)
    shown = {a.key for a in store.attempts(learner, entry_id)}
    rows = attempt_table(every)
    for row in rows:
        row["reset"] = row["key"] not in shown
    return rows


def answers_export(args: argparse.Namespace) -> int:
    """Write the learner's own attempts as JSON (a list of objects) or CSV (one row per attempt)."""
    command = "answers export"
    path = Path(args.db).expanduser() if args.db else default_path()
    if args.db and not path.is_file():
        return _fail(command, f"--db: expected an existing answer store file, got {args.db}")
    if args.out is not None and not Path(args.out).expanduser().parent.is_dir():
        return _fail(command, f"--out: expected a file in an existing directory, got {args.out}")
    if args.entry is not None:
        from content import CONTENT_DIR

        known = sorted(p.stem for p in CONTENT_DIR.glob("*.yaml"))
        if args.entry not in known:
            return _fail(command, f"--entry: expected one of the entry ids ({', '.join(known)}), got {args.entry!r}")
    learner = args.learner or current_learner()
    if path.is_file():
        try:
            with AnswerStore(path, readonly=True) as store:  # exports even from a read-only file or a full disk
                rows = export_rows(store, learner, args.entry)
        except ValueError as err:
            return _fail(command, str(err))
        except sqlite3.DatabaseError as err:  # pages damaged behind an intact header
            return _fail(command, f"answer store {path}: cannot be read ({err})")
    else:  # nothing answered on this machine yet: an empty export, and no file created
        rows = []
    if args.format == "json":
        for row in rows:
            row["params"] = json.loads(row["params"])
        text = json.dumps(rows, indent=1) + "\n"
    else:
        text = to_csv(rows) if rows else ",".join(EXPORT_FIELDS) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        out = Path(args.out).expanduser()
        part = out.with_name(out.name + ".part")
        try:  # written whole, then renamed: a full disk leaves the earlier file, never a truncated one
            part.write_text(text, encoding="utf-8")
            os.replace(part, out)
        except OSError as err:
            part.unlink(missing_ok=True)
            return _fail(command, f"--out: cannot write {args.out} ({err.strerror or err})")
        print(f"wrote {len(rows)} attempt(s) of {learner} to {args.out}", file=sys.stderr)
    return 0


def nbgrader(args: argparse.Namespace) -> int:
    """Write an nbgrader source assignment (one notebook per entry) into --out."""
    from classroom.nbgrader_export import write_assignment

    try:
        written = write_assignment(args.entries, args.out, points=args.points)
    except ValueError as err:
        first = str(err).splitlines()[0]
        return _fail("classroom nbgrader", first)
    for path in written:
        print(f"wrote {path}")
    return 0
