"""How the quiz writes answers out: numbers, the accepted range of a numeric check, and the table of attempts."""

from __future__ import annotations

import time
from typing import Any

from classroom.store import Attempt
from content.units import tolerance_text
from widgets._html import esc

RIGHT, WRONG = "#1b5e20", "#b71c1c"
# "show my answers" on the desktop; a store that keeps answers elsewhere (the browser site's) has its own
DESKTOP_EXPORT_HINT = "<code>dantinox answers export</code> writes them as JSON"


def number_text(value: float) -> str:
    """A number as the quiz writes it: six significant digits with thousands separators (whole past a million)."""
    return f"{value:,.6g}" if abs(value) < 1e6 else f"{value:,.0f}"


def accepted_text(value: float, tolerance: float, unit: str) -> str:
    """'answers from 98.85 to 99.65 MiB are accepted (±0.4 %)': what `content.is_correct` accepts, in words."""
    lo, hi = sorted((value * (1 - tolerance), value * (1 + tolerance)))
    return (f"answers from {number_text(lo)} to {number_text(hi)} {unit} are accepted "
            f"({tolerance_text(tolerance)} of the formula's value)")


def answers_table(entry: Any, attempts: list[Attempt], export_hint: str = DESKTOP_EXPORT_HINT) -> str:
    """Attempts at `entry`'s checks as an HTML table a learner reads, with how to export them as JSON."""
    if not attempts:
        return "<i>No answers yet.</i>"
    head = "".join(f"<th style='text-align:left;padding:2px 8px'>{h}</th>" for h in
                   ("question", "attempt", "your answer", "the formula's answer", "result", "when"))
    rows = []
    for a in attempts:
        check = entry.checks[a.check_index] if a.check_index < len(entry.checks) else None
        unit = f" {check.unit}" if check is not None and check.kind == "numeric" else ""
        expected = a.expected
        if unit:
            try:
                expected = number_text(float(a.expected))
            except ValueError:
                pass
        cells = (f"Q{a.check_index + 1}", str(a.attempt), f"{a.response}{unit}", f"{expected}{unit}",
                 "right" if a.correct else "wrong", time.strftime("%Y-%m-%d %H:%M", time.localtime(a.time)))
        colour = RIGHT if a.correct else WRONG
        rows.append("<tr style='border-top:1px solid #eee'>" + "".join(
            f"<td style='padding:2px 8px{';color:' + colour if k == 4 else ''}'>{esc(c)}</td>"
            for k, c in enumerate(cells)) + "</tr>")
    return (f"<table style='border-collapse:collapse;font-size:90%'><tr>{head}</tr>{''.join(rows)}</table>"
            f"<div style='color:#555;font-size:90%'>{len(attempts)} answer(s) to {esc(entry.name)}; "
            f"{export_hint}.</div>")
