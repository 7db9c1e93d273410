"""A plot in words: a one-sentence summary and its data as tables, for a screen reader or a learner without a mouse.

    sentence, tables = describe(fig)   # "Plot: KV cache vs tokens. 4 series of KV cache (MiB) against ..."

Every FigureWidget (widgets._figure) keeps both current and shows them under the plot: the sentence always, the
tables behind a "show data" toggle. They are computed from the figure's own data and layout, so what a screen
reader reads is what the plot draws.
"""

from __future__ import annotations

import re
from typing import Any

from widgets._html import esc

MAX_ROWS = 200  # per series; a longer series is shown every n-th point, and the caption says so


def plain(text: Any) -> str:
    """Plotly's title markup as text: line breaks as ' — ', tags dropped."""
    text = re.sub(r"<br\s*/?>", " — ", str(text or ""), flags=re.I)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", text)).strip(" —")


def _axis_title(fig, name: str, letter: str) -> str:
    """The title of a trace's axis ('x', 'x2' -> layout.xaxis, layout.xaxis2)."""
    key = f"{letter}axis{name[1:] if name and len(name) > 1 else ''}"
    try:
        return plain(fig.layout[key].title.text) or letter
    except (KeyError, AttributeError, ValueError):
        return letter


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.6g}" if abs(value) < 1e6 else f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return plain(value)


def _points(trace) -> int:
    """How many points a trace draws (a heatmap: its rows)."""
    return max((len(v) for v in (getattr(trace, a, None) for a in ("x", "y", "z")) if v is not None), default=0)


def _table(fig, trace, index: int) -> str:
    name = plain(trace.name) or f"series {index + 1}"
    z = getattr(trace, "z", None)
    if z is not None:  # a heatmap: one row per y, one column per x
        rows = [list(r) for r in z]
        xs = list(trace.x) if trace.x is not None else list(range(len(rows[0]) if rows else 0))
        ys = list(trace.y) if trace.y is not None else list(range(len(rows)))
        head = "".join(f"<th scope='col'>{esc(_cell(v))}</th>" for v in xs)
        body = "".join(f"<tr><th scope='row'>{esc(_cell(ys[i]))}</th>"
                       + "".join(f"<td>{esc(_cell(v))}</td>" for v in row) + "</tr>"
                       for i, row in enumerate(rows[:MAX_ROWS]))
        return (f"<table><caption>{esc(name)} (values; rows {esc(_axis_title(fig, trace.yaxis, 'y'))}, columns "
                f"{esc(_axis_title(fig, trace.xaxis, 'x'))})</caption><tr><th></th>{head}</tr>{body}</table>")
    x = list(trace.x) if trace.x is not None else []
    y = list(trace.y) if trace.y is not None else []
    n = max(len(x), len(y))
    if not n:
        return ""
    every = -(-n // MAX_ROWS)
    x_title, y_title = _axis_title(fig, trace.xaxis, "x"), _axis_title(fig, trace.yaxis, "y")
    body = "".join(f"<tr><td>{esc(_cell(x[i]) if i < len(x) else '')}</td>"
                   f"<td>{esc(_cell(y[i]) if i < len(y) else '')}</td></tr>" for i in range(0, n, every))
    note = f", every {every}th of {n:,} points" if every > 1 else ""
    return (f"<table><caption>{esc(name)}{note}</caption><tr><th scope='col'>{esc(x_title)}</th>"
            f"<th scope='col'>{esc(y_title)}</th></tr>{body}</table>")


def summary(fig) -> str:
    """One sentence: the plot's title, how many series of what against what, and their names."""
    title = plain(fig.layout.title.text) or "untitled plot"
    traces = [t for t in fig.data if _points(t)]
    if not traces:
        return f"Plot: {title}. No data yet."
    first = traces[0]
    what = (f"{_axis_title(fig, first.yaxis, 'y')} against {_axis_title(fig, first.xaxis, 'x')}"
            if getattr(first, "z", None) is None else "a grid of values")
    names = [plain(t.name) for t in traces if plain(t.name)]
    named = f": {'; '.join(names)}" if names else ""
    count = f"{len(traces)} series" if len(traces) != 1 else "One series"
    return f"Plot: {title}. {count} of {what}{named}."


def describe(fig) -> tuple[str, str]:
    """The figure's summary sentence and its data as HTML tables (one per series, headed by the axis titles)."""
    tables = "".join(_table(fig, t, i) for i, t in enumerate(fig.data))
    return summary(fig), tables
