"""The serving engine, iteration by iteration: what each request did, the page tables, hits, drafts.

    run = run_engine(model, prompts, news, arrivals, num_pages=12, chunk_tokens=4, speculate=3)
    HTML(steps_html(run))                  # one row per iteration: each request's state, budget, hits, drafts
    HTML(tables_html(run, step=3))         # the page tables after iteration 3, shared prefix pages marked
    run.matches_generate                   # every request's tokens equal dantinox.generate of it alone

Everything shown is measured from the engine's own StepReports (dantinox.engine); nothing is simulated.
"""

from __future__ import annotations

import dataclasses

import numpy as np

import dantinox
from widgets._html import esc
from widgets.serving_lab import page_table_html

KIND_COLOURS = {"prefill": "#bbdefb", "decode": "#c8e6c9", "verify": "#ffe0b2"}


@dataclasses.dataclass(frozen=True)
class EngineRun:
    """One trace served by the engine: the reports of every iteration and the final numbers."""

    engine: dantinox.Engine
    reports: tuple
    prompts: tuple
    outputs: dict  # rid -> generated ids
    alone: dict  # rid -> generate() of that request alone
    stats: dict

    @property
    def matches_generate(self) -> bool:
        return self.outputs == self.alone


def run_engine(model, prompts, news, arrivals, **engine_kw) -> EngineRun:
    """Serve the requests with dantinox.Engine (fixed shapes), step by step; decode each alone to compare."""
    engine = dantinox.Engine(model, fixed_shapes=True, **engine_kw)
    rids = [engine.add(p, n, arrival_step=a) for p, n, a in zip(prompts, news, arrivals, strict=True)]
    reports = []
    while not engine.finished:
        reports.append(engine.step())
    ref = dantinox.generate(model, [list(p) for p in prompts], max(news))
    alone = {r: list(np.asarray(row)[len(p):len(p) + n]) for r, row, p, n in zip(rids, ref, prompts, news, strict=True)}
    return EngineRun(engine, tuple(reports), tuple(prompts), engine.outputs(), alone, engine.stats())


def _cell(text: str, colour: str = "") -> str:
    style = f"background:{colour};" if colour else ""
    return f"<td style='{style}border:1px solid #cfd8dc;padding:1px 5px;font-family:monospace'>{text}</td>"


def steps_html(run: EngineRun, first: int = 0, count: int = 40) -> str:
    """A table of iterations: per request its part (prefill chunk, decode, verify with accepted/drafted)."""
    rids = sorted(run.engine.requests)
    head = "".join(f"<th>req {r}</th>" for r in rids)
    lines = []
    for rep in run.reports[first:first + count]:
        by = {row.rid: row for row in rep.rows}
        cells = []
        for r in rids:
            row = by.get(r)
            if row is None:
                state = "waiting" if r in rep.waiting else ""
                cells.append(_cell(state, "#f5f5f5" if state else ""))
                continue
            text = f"{row.kind} {row.tokens}"
            if row.kind == "verify":
                text = f"verify {row.accepted}/{row.drafts}"
            if r in rep.hits and rep.hits[r]:
                text += f" hit {rep.hits[r]}"
            cells.append(_cell(esc(text), KIND_COLOURS[row.kind]))
        budget = "∞" if rep.budget is None else str(rep.budget)
        events = ", ".join([f"preempted {p}" for p in rep.preempted] + [f"done {f}" for f in rep.finished])
        lines.append(f"<tr>{_cell(str(rep.step))}{''.join(cells)}{_cell(f'{rep.fed}/{budget}')}"
                     f"{_cell(str(rep.free))}{_cell(esc(events))}</tr>")
    legend = " ".join(f"<span style='background:{c};padding:0 4px'>{k}</span>" for k, c in KIND_COLOURS.items())
    return (f"<div>Measured, one row per iteration. {legend}: tokens fed; verify a/k: a of k drafts accepted; "
            f"hit n: prompt tokens found in the prefix cache. Budget: tokens fed / chunk_tokens.</div>"
            f"<table style='border-collapse:collapse'><tr><th>step</th>{head}<th>budget</th><th>free pages</th>"
            f"<th>events</th></tr>{''.join(lines)}</table>")


def tables_html(run: EngineRun, step: int) -> str:
    """The running requests' page tables after iteration `step`; pages shared by a common prefix in yellow."""
    rep = run.reports[step]
    tables = {f"req {r}": list(t) for r, t in rep.tables.items()}
    return page_table_html(tables, rep.shared, run.engine.page_size, rows=len(tables))


def busiest_sharing_step(run: EngineRun) -> int:
    """The iteration whose running requests share the most pages (the one worth drawing)."""
    return max(range(len(run.reports)), key=lambda i: (len(run.reports[i].shared), -i))


def first_hits(run: EngineRun) -> dict[int, int]:
    """Prompt tokens each request found in the prefix cache when it was first admitted (recomputes excluded)."""
    hits: dict[int, int] = {}
    for rep in run.reports:
        for rid, n in rep.hits.items():
            hits.setdefault(rid, n)
    return hits
