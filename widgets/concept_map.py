"""The concept map: every entry as a node, arrows from prerequisite to concept, and the selected entry's pages.

    concept_map = ConceptMap(content.load_all())
    concept_map.path                     # a suggested learning order (prerequisites first)
    concept_map.select("paged-attention")   # what clicking its node does
    concept_map.card, concept_map.explorer, concept_map.quiz   # the selected entry's card, formulas and quiz

Nothing here names an entry: nodes, edges, the path, lab links and the pages all come from the entries'
`prerequisites`, `related`, `level`, `learning_objective` and `lab_id` fields, so a new YAML file appears
on the map with no code change.
"""

from __future__ import annotations

import heapq
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go
import traitlets

from content.schema import LEVELS
from dantinox_labs import shipped
from widgets._a11y import Aria
from widgets._figure import FigureWidget
from widgets._html import badge, esc
from widgets.card import ConceptCard
from widgets.formula_explorer import FormulaExplorer
from widgets.quiz import Quiz

LABS_DIR = shipped.LABS  # a lab is <lab_id>.ipynb in this folder
LEVEL_COLOURS = {"foundation": "#2e7d32", "intermediate": "#1565c0", "advanced": "#6a1b9a"}


def _by_id(entries: dict[str, Any] | Iterable[Any]) -> dict[str, Any]:
    items = list(entries.values()) if isinstance(entries, dict) else list(entries)
    if not items:
        raise ValueError("entries: expected at least one concept entry, got none")
    return {e.id: e for e in items}


def learning_path(entries: dict[str, Any] | Iterable[Any]) -> list[str]:
    """Entry ids in an order where every prerequisite comes first; ties go to the easier level, then by id.

    Prerequisites outside `entries` are ignored (the map may show a subset); `content.load_all` has already
    refused cycles, and a cycle here raises ValueError naming its entries.
    """
    by_id = _by_id(entries)
    needs = {i: {p for p in e.prerequisites if p in by_id} for i, e in by_id.items()}
    unlocks: dict[str, list[str]] = {i: [] for i in by_id}
    for i, prereqs in needs.items():
        for p in prereqs:
            unlocks[p].append(i)
    def rank(i: str) -> tuple[int, str]:
        return (LEVELS.index(by_id[i].level), i)
    ready = [rank(i) for i, p in needs.items() if not p]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        _, current = heapq.heappop(ready)
        order.append(current)
        for nxt in unlocks[current]:
            needs[nxt].discard(current)
            if not needs[nxt]:
                heapq.heappush(ready, rank(nxt))
    if len(order) != len(by_id):
        stuck = sorted(set(by_id) - set(order))
        raise ValueError(f"prerequisites: expected no cycle, got one among {', '.join(stuck)}")
    return order


def depths(entries: dict[str, Any] | Iterable[Any]) -> dict[str, int]:
    """Length of the longest prerequisite chain below each entry (0: needs nothing): the map's columns."""
    by_id = _by_id(entries)
    depth: dict[str, int] = {}
    for i in learning_path(by_id):
        depth[i] = max((depth[p] + 1 for p in by_id[i].prerequisites if p in depth), default=0)
    return depth


def lab_notebook(entry: Any, labs_dir: Path = LABS_DIR) -> str | None:
    """The entry's dedicated lab notebook (labs/<lab_id>.ipynb) if it has one and the file is there."""
    if entry.lab_id and (labs_dir / f"{entry.lab_id}.ipynb").is_file():
        return f"{entry.lab_id}.ipynb"
    return None


def entry_summary_html(entry: Any, labs_dir: Path = LABS_DIR) -> str:
    """Name, level, objective and lab link of one entry, escaped (the header of the selected entry)."""
    lab = lab_notebook(entry, labs_dir)
    if lab:
        where = f"Dedicated lab: <a href='{esc(lab)}' target='_blank'>labs/{esc(lab)}</a>"
    elif entry.lab_id and sys.platform == "emscripten":  # the browser site carries only the labs without a model
        where = (f"Dedicated lab <code>labs/{esc(entry.lab_id)}.ipynb</code>: it runs a real model, so it needs the "
                 f"full install (<code>python3 dev.py lab</code>, see the note at the top of this notebook).")
    elif entry.lab_id:
        where = f"Dedicated lab <code>{esc(entry.lab_id)}</code> is not in this checkout's labs/ folder."
    else:
        where = "No dedicated lab yet: its formulas and quiz are below."
    prereqs = ", ".join(esc(p) for p in entry.prerequisites) or "none"
    return (f"<h3 style='margin:6px 0 2px 0'>{esc(entry.name)}</h3>"
            f"<div style='color:{LEVEL_COLOURS.get(entry.level, '#444')}'>{esc(entry.level)} · {esc(entry.kind)}"
            f" · builds on: {prereqs}</div>"
            f"<p style='margin:4px 0'><i>After this entry you can:</i> {esc(entry.learning_objective)}</p>"
            f"<p style='margin:2px 0'>{where}</p>")


class ConceptMap(widgets.VBox):
    """A plotly map of the entries (click a node to select it), a learning path, and the selected entry's
    card, formula explorer and quiz (built on first selection and kept, so quiz answers survive)."""

    selected = traitlets.Unicode("")

    def __init__(self, entries: dict[str, Any] | Iterable[Any], selected: str | None = None,
                 labs_dir: Path = LABS_DIR):
        self.entries = _by_id(entries)
        self.labs_dir = Path(labs_dir)
        self.path = learning_path(self.entries)
        self._pages: dict[str, tuple[ConceptCard, FormulaExplorer, Quiz]] = {}
        self.figure = self._figure()
        self.figure.data[-1].on_click(self._on_click)
        self.picker = widgets.Dropdown(options=[(self.entries[i].name, i) for i in self.path],
                                       description="entry", layout=widgets.Layout(width="420px"))
        self.picker.observe(lambda change: self.select(change["new"]), names="value")
        self.path_html = widgets.HTML(self._path_html())
        self.header_html = widgets.HTML()
        self.tabs = widgets.Tab()
        super().__init__([self.figure, self.path_html, self.picker, self.header_html, self.tabs, Aria()])
        self.select(selected or self.path[0])

    # Map -----------------------------------------------------------------------------------------
    def _positions(self) -> dict[str, tuple[float, float]]:
        depth = depths(self.entries)
        columns: dict[int, list[str]] = {}
        for i in self.path:
            columns.setdefault(depth[i], []).append(i)
        tallest = max(len(c) for c in columns.values())
        return {i: (d, (tallest - 1) / 2 - row) for d, ids in columns.items() for row, i in enumerate(ids)}

    def _figure(self) -> FigureWidget:
        pos = self._positions()
        self.positions = pos
        related_x: list[float | None] = []
        related_y: list[float | None] = []
        for i, e in self.entries.items():
            for other in e.related:
                pair_is_prereq = other in e.prerequisites or i in getattr(self.entries.get(other), "prerequisites", [])
                if other in pos and i < other and not pair_is_prereq:
                    related_x += [pos[i][0], pos[other][0], None]
                    related_y += [pos[i][1], pos[other][1], None]
        arrows = [dict(x=pos[i][0], y=pos[i][1], ax=pos[p][0], ay=pos[p][1], xref="x", yref="y", axref="x",
                       ayref="y", showarrow=True, arrowhead=3, arrowsize=1.2, arrowwidth=1.5, arrowcolor="#555",
                       standoff=14, startstandoff=14, text="")
                  for i, e in self.entries.items() for p in e.prerequisites if p in pos]
        ids = list(self.path)
        # names as annotations on a white box, drawn after the arrows: as scatter text they sat under the arrows
        labels = [dict(x=pos[i][0], y=pos[i][1], yshift=20, text=esc(self.entries[i].short_name), showarrow=False,
                       xref="x", yref="y", bgcolor="rgba(255,255,255,0.92)", borderpad=1, font=dict(size=12))
                  for i in self.path]
        nodes = go.Scatter(
            x=[pos[i][0] for i in ids], y=[pos[i][1] for i in ids], mode="markers", customdata=ids,
            text=[esc(self.entries[i].short_name) for i in ids],
            hovertext=[f"<b>{esc(self.entries[i].name)}</b> ({esc(self.entries[i].level)})" for i in ids],
            hoverinfo="text", name="entries",
            marker=dict(size=22, color=[LEVEL_COLOURS.get(self.entries[i].level, "#444") for i in ids],
                        line=dict(width=[1] * len(ids), color="crimson")))
        related = go.Scatter(x=related_x, y=related_y, mode="lines", hoverinfo="skip", name="related",
                             line=dict(width=1, dash="dot", color="#bbb"))
        columns = max(x for x, _ in pos.values())
        rows = max(abs(y) for _, y in pos.values())
        return FigureWidget(data=[related, nodes], layout=dict(
            height=max(320, 90 * (2 * rows + 1) + 80), width=860, showlegend=False, annotations=[*arrows, *labels],
            margin=dict(l=20, r=20, t=60, b=20), hovermode="closest", plot_bgcolor="white",
            xaxis=dict(visible=False, range=[-0.5, columns + 0.5]),
            yaxis=dict(visible=False, range=[-rows - 0.7, rows + 0.7]),
            title=dict(text="Concept map: arrows point from a prerequisite to the concept that builds on it; "
                            "dotted: related<br><sup>click a node · colour: green foundation, blue "
                            "intermediate, purple advanced (illustrative layout)</sup>")))

    def _on_click(self, trace, points, _selector) -> None:
        if points.point_inds:
            self.select(trace.customdata[points.point_inds[0]])

    def _path_html(self) -> str:
        rows = "".join(f"<li><b>{esc(self.entries[i].name)}</b>: {esc(self.entries[i].learning_objective)}"
                       f"{self._lab_suffix(i)}</li>" for i in self.path)
        return (f"<h4 style='margin:8px 0 2px 0'>Suggested learning path</h4>"
                f"<div style='font-size:90%;color:#555'>Every entry comes after its prerequisites.</div>"
                f"<ol style='margin:2px 0'>{rows}</ol>")

    def _lab_suffix(self, entry_id: str) -> str:
        lab = lab_notebook(self.entries[entry_id], self.labs_dir)
        return f" (lab: <a href='{esc(lab)}' target='_blank'>{esc(lab)}</a>)" if lab else ""

    # Selection -----------------------------------------------------------------------------------
    def select(self, entry_id: str) -> None:
        """Select an entry by id (what clicking its node does): highlight it and show its pages."""
        if entry_id not in self.entries:
            raise ValueError(f"entry_id: expected one of the entries on the map ({', '.join(self.path)}), "
                             f"got {entry_id!r}")
        if entry_id == self.selected:
            return
        entry = self.entries[entry_id]
        if entry_id not in self._pages:
            self._pages[entry_id] = (ConceptCard(entry), FormulaExplorer(entry), Quiz(entry))
        card, explorer, quiz = self._pages[entry_id]
        with self.hold_sync():
            self.selected = entry_id
            self.picker.value = entry_id
            widths = [3 if i == entry_id else 1 for i in self.figure.data[-1].customdata]
            self.figure.data[-1].marker.line.width = widths
            self.header_html.value = entry_summary_html(entry, self.labs_dir) + badge(
                "derived", "every number below comes from the entry's formulas")
            self.tabs.children = [explorer, quiz, card]
            for k, title in enumerate(("Formula explorer", "Quiz", "Concept card")):
                self.tabs.set_title(k, title)

    @property
    def card(self) -> ConceptCard:
        return self._pages[self.selected][0]

    @property
    def explorer(self) -> FormulaExplorer:
        return self._pages[self.selected][1]

    @property
    def quiz(self) -> Quiz:
        return self._pages[self.selected][2]
