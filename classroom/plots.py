"""Plots and tables of a class summary (`classroom.summary` rows), for the instructor notebook.

Every title carries `label`: say where the records came from ("measured: this class's attempts",
"illustrative records"), as every figure in the project does.
"""

from __future__ import annotations

import html
import string
import textwrap
from typing import Any

import plotly.graph_objects as go

RIGHT, WRONG, NEUTRAL = "#2e7d32", "#c62828", "#90a4ae"


def _wrap(text: str, width: int = 60) -> str:
    return "<br>".join(textwrap.wrap(text, width)) or text


TICK_WIDTH = 18  # characters per line of a question's axis label ("multi-head-latent-attention Q2" on three)


def question_label(row: dict[str, Any]) -> str:
    """'kv-cache Q3': the entry and the 1-based question number the learner saw."""
    return f"{row['entry']} Q{row['check'] + 1}"


def first_try_figure(rows: list[dict[str, Any]], label: str) -> go.Figure:
    """First-try success rate per question, with how many learners answered it."""
    fig = go.Figure(go.Bar(
        x=[_wrap(question_label(r), TICK_WIDTH) for r in rows], y=[r["first_try_rate"] for r in rows],
        text=[f"{r['first_try_right']}/{r['learners']}" for r in rows], textposition="outside",
        marker_color=[RIGHT if r["first_try_rate"] >= 0.5 else WRONG for r in rows],
        hovertext=[_wrap(r.get("question", "")) for r in rows], hoverinfo="text+y"))
    fig.update_layout(title=f"First-try success per question ({label})", yaxis_title="learners right first time",
                      yaxis_tickformat=".0%", yaxis_range=[0, 1.15], height=360, margin=dict(t=50))
    fig.update_xaxes(automargin=True, tickangle=0)  # labels wrapped at hyphens, the margin grows to hold them
    return fig


def options_figure(row: dict[str, Any], label: str) -> go.Figure:
    """A choice question: how many learners chose each option first, each wrong option named by its belief."""
    options = row["options"]
    names = [f"{string.ascii_uppercase[j]}. " + _wrap(o["belief"] or o["option"] + " (the key)", 70)
             for j, o in enumerate(options)]
    fig = go.Figure(go.Bar(y=names[::-1], x=[o["first_choice"] for o in options][::-1], orientation="h",
                           marker_color=[RIGHT if o["correct"] else WRONG for o in options][::-1],
                           text=[o["first_choice"] for o in options][::-1], textposition="outside"))
    fig.update_layout(title=_wrap(f"{question_label(row)}: first choices ({label}). {row.get('question', '')}", 110),
                      xaxis_title="learners whose first answer it was", height=140 + 70 * len(options),
                      margin=dict(l=20, t=80 + 14 * (len(row.get("question", "")) // 110)))
    fig.update_yaxes(automargin=True)
    return fig


def progress_figure(learner_rows: list[dict[str, Any]], entries: dict[str, Any], label: str) -> go.Figure:
    """Per learner and entry: the share of the entry's checks answered."""
    ids = sorted(entries)
    learners = [r["learner"] for r in learner_rows]

    def share(row: dict[str, Any], entry_id: str) -> float:
        done = row["entries"].get(entry_id, "0").split("/")[0]
        return int(done) / len(entries[entry_id].checks)

    z = [[share(r, e) for e in ids] for r in learner_rows]
    fig = go.Figure(go.Heatmap(z=z, x=ids, y=learners, zmin=0, zmax=1, colorscale="Blues",
                               colorbar=dict(title="answered", tickformat=".0%")))
    fig.update_layout(title=f"Progress per learner ({label})", height=160 + 18 * len(learners),
                      yaxis_autorange="reversed")
    return fig


def question_table_html(rows: list[dict[str, Any]]) -> str:
    """The per-question table the dashboard shows: answered, first-try rate, options with beliefs."""
    esc = html.escape
    out = ["<table style='border-collapse:collapse'><tr><th align=left>question</th><th>learners</th>"
           "<th>attempts</th><th>first try right</th><th align=left>first choices (belief each wrong option "
           "embodies)</th></tr>"]
    for r in rows:
        picks = "".join(
            f"<div style='color:{RIGHT if o['correct'] else '#333'}'>{o['first_choice']} × "
            f"{esc(string.ascii_uppercase[j])}{' (key)' if o['correct'] else ': ' + esc(o['belief'])}</div>"
            for j, o in enumerate(r.get("options", [])))
        out.append(f"<tr style='border-top:1px solid #ddd'><td style='max-width:28em'><b>{esc(question_label(r))}"
                   f"</b> {esc(r.get('question', ''))}</td><td align=right>{r['learners']}</td>"
                   f"<td align=right>{r['attempts']}</td><td align=right>{r['first_try_rate']:.0%}</td>"
                   f"<td style='max-width:34em'>{picks}</td></tr>")
    return "".join(out) + "</table>"
