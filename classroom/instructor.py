"""What the instructor notebook reads and prints: a class's records, and the per-learner table.

    records = class_records()      # $DANTINOX_CLASSROOM_DB when set (the service's store), else illustrative
    learner_table_html(learner_rows(records.attempts, records.entries), records.entries)
    exercise_table_html(exercise_rows(records.attempts))   # the dashboard's per-exercise table

The notebook needs no code edit to look at a real class: start JupyterLab with DANTINOX_CLASSROOM_DB
pointing at the service's classroom.sqlite (or a copy of it).
"""

from __future__ import annotations

import dataclasses
import html
import os
import tempfile
from pathlib import Path
from typing import Any

import content
from classroom.illustrative import illustrative_attempts, illustrative_checks, learner_names
from classroom.store import AnswerStore, Attempt

ENV_VAR = "DANTINOX_CLASSROOM_DB"  # the variable the classroom service reads its store from
ILLUSTRATIVE_ENTRIES = ("kv-cache", "multi-head-latent-attention")


@dataclasses.dataclass(frozen=True)
class ClassRecords:
    attempts: list[Attempt]
    entries: dict[str, Any]  # entry id -> content entry, for every entry the attempts name that content holds
    label: str  # where the records came from, for every title and table


def class_records(learners: int = 24, seed: int = 0) -> ClassRecords:
    """The class in $DANTINOX_CLASSROOM_DB when set (one line if it is not a file), else illustrative records."""
    where = os.environ.get(ENV_VAR)
    if where:
        path = Path(where).expanduser()
        if not path.is_file():
            raise ValueError(f"${ENV_VAR}: expected a class's answer store (the service's classroom.sqlite), "
                             f"got {where}")
        try:  # read-only: an instructor's notebook never writes the class's file
            with AnswerStore(path, readonly=True) as store:
                attempts = store.attempts()
        except ValueError as err:
            if "locked" not in str(err):
                raise
            raise ValueError(f"${ENV_VAR}: {path} is held by the running classroom service; read the class on its "
                             f"dashboard or export (api/attempts?format=csv), or open a copy") from None
        known = {p.stem for p in content.CONTENT_DIR.glob("*.yaml")}
        ids = sorted({a.entry_id for a in attempts} & known)
        return ClassRecords(attempts, {e: content.load_entry(e) for e in ids}, f"measured: the records in {path}")
    entries = {e: content.load_entry(e) for e in ILLUSTRATIVE_ENTRIES}
    store = AnswerStore(Path(tempfile.mkdtemp(prefix="dantinox-illustrative-")) / "illustrative.sqlite")
    with store:
        for attempt in illustrative_attempts(entries, learners=learners, seed=seed):
            store.add(attempt)
        for attempt in illustrative_checks(learner_names(learners), seed=seed):
            store.add(attempt)
        attempts = store.attempts()
    return ClassRecords(attempts, entries, "illustrative records")


def learner_table_html(rows: list[dict[str, Any]], entries: dict[str, Any]) -> str:
    """One row per learner (`classroom.summary.learner_rows`): first-try score and progress in each entry."""
    esc = html.escape
    ids = sorted({e for r in rows for e in r["entries"]} | set(entries))
    head = "".join(f"<th>{esc(e)}<br><small>answered</small></th>" for e in ids)
    out = [f"<table style='border-collapse:collapse'><tr><th align=left>learner</th><th>right first time</th>"
           f"{head}</tr>"]
    for r in rows:
        cells = "".join(f"<td align=right>{esc(str(r['entries'].get(e, '–')))}</td>" for e in ids)
        out.append(f"<tr style='border-top:1px solid #ddd'><td>{esc(r['learner'])}</td>"
                   f"<td align=right>{r['first_try_right']}/{r['answered']}</td>{cells}</tr>")
    return "".join(out) + "</table>"


def exercise_table_html(rows: list[dict[str, Any]]) -> str:
    """One row per exercise (`classroom.summary.exercise_rows`, the rows the dashboard's "Per exercise" table
    shows): learners who checked, checks, who passed, who has not yet, the commonest known mistake."""
    esc = html.escape
    head = ("exercise", "learners", "checks", "passed", "passed by", "not yet",
            "commonest mistake (learners)")
    out = ["<table style='border-collapse:collapse'><tr>" + "".join(f"<th align=left>{h}</th>" for h in head)
           + "</tr>"]
    for r in rows:
        mistake = (f"{r['commonest_mistake']} ({r['commonest_mistake_learners']})" if r["commonest_mistake"]
                   else "–")
        out.append(f"<tr style='border-top:1px solid #ddd;vertical-align:top'><td>{esc(r['title'])}</td>"
                   f"<td align=right>{r['learners']}</td><td align=right>{r['checks']}</td>"
                   f"<td align=right>{r['passed']}</td><td>{esc(', '.join(r['passed_by']))}</td>"
                   f"<td style='color:#777'>{esc(', '.join(r['not_yet']))}</td><td>{esc(mistake)}</td></tr>")
    return "".join(out) + "</table>"
