"""The serving lab: one trace, one KV-cache budget, static vs Orca-style vs paged batching, measured bytes.

    lab = ServingLab()                        # tiny model geometry (runs/tiny), ShareGPT-shaped trace
    lab.update(page_size=8, budget_mib=4)    # any control, as a learner would move it
    lab.reading.results["paged"].shares()     # what the stacked bar shows
    read_serving(cfg, "sharegpt", 0.5, 100, 8 << 20, 16, 1)   # the same numbers without a widget

`read_serving` runs dantinox.engine.simulator.serve for every policy in POLICY_RUNS and caches the result per
setting, so returning to a setting is instant. Its bytes are measured from the allocators' state (page
tables, reserved regions) times the bytes of one cached token taken from the cache arrays' shapes; the
lengths come from a seeded trace, not from running the model (benchmarks/serving.py times the model).
"""

from __future__ import annotations

import dataclasses
import functools
import time

import ipywidgets as widgets
import numpy as np
import traitlets
from plotly.subplots import make_subplots

import dantinox
from dantinox.engine.simulator import LENGTHS, ServeResult, make_trace, serve
from widgets._controls import Lab
from widgets._figure import FigureWidget
from widgets._html import badge, esc, note_box
from widgets.number_input import NumberInput

# label -> (policy, reservation), in the order of the paper's Fig. 2: baselines first, paging last
POLICY_RUNS = {
    "static batching, max reservation": ("static", "max"),
    "Orca-style, max reservation": ("contiguous", "max"),
    "Orca-style, pow2 reservation": ("contiguous", "pow2"),
    "Orca-style, oracle reservation": ("contiguous", "oracle"),
    "paged + continuous": ("paged", "max"),
}
CATEGORIES = {"token states": "#2e7d32", "reservation": "#f9a825", "internal fragmentation": "#e65100",
              "external fragmentation": "#6a1b9a"}
PAGE_SIZES = (1, 8, 16, 32, 64)  # the paged-attention entry's page-size values a lab can reach
PAPER_FIG2 = "arXiv 2309.06180 Fig. 2: token states 20.4–38.2 % in the Orca baselines, 96.3 % in vLLM"


@dataclasses.dataclass(frozen=True)
class ServingReading:
    """Every policy's run of one trace under one budget, and the settings that produced them."""

    cfg: dantinox.ModelConfig
    lengths: str
    rate: float
    n_requests: int
    budget_bytes: int
    page_size: int
    n: int
    mean_length: float  # mean prompt + output tokens of the trace
    results: dict[str, ServeResult]
    seconds: float  # wall time of the simulations for this setting (0 when it came from the cache)


@functools.lru_cache(maxsize=256)
def _runs(cfg, lengths, rate, n_requests, budget_bytes, page_size, n):
    trace = make_trace(n_requests, rate, lengths, cfg.max_context, seed=0)
    results = {label: serve(trace, policy, budget_bytes, cfg, page_size=page_size, n=n, reservation=res)
               for label, (policy, res) in POLICY_RUNS.items()}
    return float(np.mean([r.prompt + r.output for r in trace])), results


def read_serving(cfg: dantinox.ModelConfig, lengths: str, rate: float, n_requests: int, budget_bytes: int,
                 page_size: int, n: int) -> ServingReading:
    """Serve one seeded trace with every policy of POLICY_RUNS (cached per setting)."""
    start, hits = time.perf_counter(), _runs.cache_info().hits
    mean_length, results = _runs(cfg, lengths, float(rate), n_requests, budget_bytes, page_size, n)
    seconds = 0.0 if _runs.cache_info().hits > hits else time.perf_counter() - start
    return ServingReading(cfg, lengths, float(rate), n_requests, budget_bytes, page_size, n, mean_length,
                          results, seconds)


def page_table_html(tables: dict, shared: set | frozenset, page_size: int, fill=None, rows: int = 6) -> str:
    """A few sequences' page tables: one cell per logical page naming its physical page; shared ones marked."""
    lines = []
    for seq, table in list(tables.items())[:rows]:
        cells = []
        for m, page in enumerate(table):
            colour = "#ffe082" if page in shared else "#e3f2fd"
            held = "" if fill is None else f"{int(fill[page])}/{page_size}"
            cells.append(f"<td title='logical page {m}: tokens {m * page_size}..{(m + 1) * page_size - 1}' "
                         f"style='background:{colour};border:1px solid #90a4ae;padding:1px 4px;text-align:center;"
                         f"font-family:monospace'>{page}<div style='font-size:70%;color:#555'>{held}</div></td>")
        lines.append(f"<tr><td style='padding-right:6px'>seq {esc(seq)}</td>{''.join(cells)}</tr>")
    more = len(tables) - rows
    tail = f"<div style='color:#666'>… and {more} more sequence(s)</div>" if more > 0 else ""
    return (f"<div><span style='background:#ffe082;padding:0 4px'>yellow</span>: a physical page held by more "
            f"than one sequence (reference count &gt; 1). Numbers are physical page ids; below, slots filled."
            f"</div><table style='border-collapse:collapse'>{''.join(lines)}</table>{tail}")


POLICY_COLOURS = ("#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#2ca02c")  # one per policy, both panels


def policy_table(r: ServingReading) -> str:
    """One row per policy, one column per measure: a table that wraps instead of one long line per policy."""
    head = ("policy", "KV memory holding token states", "most sequences at once", "tokens / step", "steps",
            "mean latency (steps)", "preemptions")
    rows = []
    for label, res in r.results.items():
        cells = (label, f"{res.shares()['token states']:.1%}", f"{res.running.max()}", f"{res.tokens_per_step:.2f}",
                 f"{res.steps}", f"{res.latency_steps.mean():.0f}",
                 f"{res.preemptions}" if res.policy == "paged" else "—")
        rows.append("<tr>" + "".join(f"<td style='padding:2px 8px;{'' if i == 0 else 'text-align:right'}'>"
                                     f"{esc(c)}</td>" for i, c in enumerate(cells)) + "</tr>")
    header = "".join(f"<th style='padding:2px 8px;text-align:{'left' if i == 0 else 'right'}'>{esc(h)}</th>"
                     for i, h in enumerate(head))
    return (f"<table style='border-collapse:collapse;max-width:100%'><tr style='border-bottom:1px solid #ccc'>"
            f"{header}</tr>{''.join(rows)}</table>")


def _page_size(value: int) -> None:
    if value not in PAGE_SIZES:
        raise ValueError(f"page_size: expected one of {', '.join(map(str, PAGE_SIZES))} (the page sizes the "
                         f"paged-attention entry's formulas take), got {value}")


class ServingLab(Lab):
    """Sliders for page size, budget, request rate, length distribution and samples; bars, lines, tables."""

    CONTROLS = ("page_size", "budget_mib", "rate", "lengths", "n")
    reading = traitlets.Instance(ServingReading, allow_none=True)

    def __init__(self, cfg: dantinox.ModelConfig | None = None, *, n_requests: int = 100, page_size: int = 16,
                 budget_mib: int = 8, rate: float = 0.5, lengths: str = "sharegpt", n: int = 1):
        self.cfg = dantinox.ModelConfig.preset("tiny") if cfg is None else cfg
        self.n_requests = n_requests
        style, layout = {"description_width": "170px"}, widgets.Layout(width="520px")
        self.page_size = NumberInput(value=16, min=PAGE_SIZES[0], max=PAGE_SIZES[-1], grid=PAGE_SIZES,
                                     description="page size (tokens)", unit="tokens", check=_page_size,
                                     style=style, layout=layout)
        self.budget_mib = NumberInput(value=8, min=2, max=32, description="KV memory budget (MiB)", unit="MiB",
                                      style=style, layout=layout)
        self.rate = NumberInput(value=0.5, min=0.1, max=2.0, step=0.1, integer=False,
                                description="requests per step", unit="requests", style=style, layout=layout)
        self.lengths = widgets.Dropdown(options=list(LENGTHS), description="length distribution", style=style,
                                        layout=layout)
        self.n = NumberInput(value=1, min=1, max=4, description="samples per request n", unit="samples",
                             style=style, layout=layout)
        self.lengths_html, self.readout_html, self.tables_html = widgets.HTML(), widgets.HTML(), widgets.HTML()
        self.bars = FigureWidget(layout=dict(  # legend above the bars: the policy names need the room below
            barmode="stack", height=420, width=760, margin=dict(l=60, r=40, t=110, b=70),
            yaxis=dict(title="share of KV memory (%)", range=[0, 100]), xaxis=dict(tickangle=0),
            legend=dict(orientation="h", x=0, y=1.02, xanchor="left", yanchor="bottom")))
        self.lines = FigureWidget(make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08))
        self.lines.update_layout(height=560, width=760, margin=dict(l=60, r=40, t=50, b=50),
                                 legend=dict(orientation="h", x=0, y=-0.12, xanchor="left", yanchor="top"))
        status = widgets.HTML()
        super().__init__([self.page_size, self.budget_mib, self.rate, self.lengths, self.n, status,
                          self.lengths_html, self.readout_html, self.bars, self.lines, self.tables_html], status)
        self.observe_controls(self.page_size, self.budget_mib, self.rate, self.lengths, self.n)
        self.update(page_size=page_size, budget_mib=budget_mib, rate=rate, lengths=lengths, n=n)

    def formula_params(self) -> dict[str, float]:
        """The paged-attention entry's T (the trace's mean sequence length, rounded) and P (page size)."""
        return {"T": round(self.reading.mean_length), "P": self.page_size.value}

    def _read(self) -> ServingReading:
        self.status_html.value = "<i>running the five policies on this setting…</i>"
        try:
            return read_serving(self.cfg, self.lengths.value, round(self.rate.value, 3), self.n_requests,
                                self.budget_mib.value << 20, self.page_size.value, self.n.value)
        except ValueError as err:  # the simulator names its argument; the learner sees the slider's name
            prefix = "budget_bytes: "
            if str(err).startswith(prefix):
                raise ValueError(f"KV memory budget ({self.budget_mib.value} MiB) too small: "
                                 f"{str(err)[len(prefix):]}") from None
            raise

    def _render(self, r: ServingReading) -> None:
        how = "allocator state × bytes per token from the cache arrays"
        self.status_html.value = (f"<span style='color:#666'>{len(r.results)} policies simulated in "
                                  f"{r.seconds * 1e3:.0f} ms{' (cached)' if r.seconds == 0 else ''}</span>")
        self.lengths_html.value = (f"<div>Trace: {r.n_requests} requests, seed 0, Poisson arrivals at {r.rate:g} "
                                   f"per step; lengths: {esc(LENGTHS[r.lengths])}. Mean prompt + output: "
                                   f"{r.mean_length:.1f} tokens {badge('measured', 'from the trace')}</div>")
        self.readout_html.value = policy_table(r) + f"<div>{badge('measured', how)}</div>" + note_box(esc(
            f"Compare with {PAPER_FIG2} (their workload and models; the shape is what carries over)."))
        labels = list(r.results)
        with self.bars.batch_update():
            self.bars.layout.xaxis.update(tickvals=labels, ticktext=[x.replace(", ", ",<br>") for x in labels])
            self.bars.data = ()
            for cat, colour in CATEGORIES.items():
                self.bars.add_bar(x=labels, y=[100 * res.shares()[cat] for res in r.results.values()], name=cat,
                                  marker_color=colour)
            self.bars.layout.title = dict(text=f"Where the KV memory goes, summed over the run<br><sup>measured · "
                                               f"page {r.page_size}, {r.budget_bytes >> 20} MiB, n={r.n}</sup>",
                                          x=0, xref="paper", xanchor="left")
        most = max(int(res.running.max()) for res in r.results.values())
        with self.lines.batch_update():
            self.lines.data = ()
            for k, (label, res) in enumerate(r.results.items()):
                used = (res.token_states + res.reserved + res.internal) / r.budget_bytes * 100
                util = np.divide(res.token_states, res.token_states + res.reserved + res.internal,
                                 out=np.zeros(res.steps), where=used > 0) * 100
                colour = POLICY_COLOURS[k % len(POLICY_COLOURS)]
                self.lines.add_scatter(y=util, name=label, mode="lines", legendgroup=label, line=dict(color=colour),
                                       row=1, col=1)
                self.lines.add_scatter(y=res.running, name=label, mode="lines", legendgroup=label, showlegend=False,
                                       line=dict(color=colour), row=2, col=1)
            self.lines.update_yaxes(title_text="token states /<br>allocated (%)", range=[0, 100], row=1, col=1)
            self.lines.update_yaxes(title_text="sequences<br>running", range=[0, most * 1.05 + 1], row=2, col=1)
            self.lines.update_xaxes(title_text="decode step", row=2, col=1)
            self.lines.layout.title = dict(text="Utilisation and concurrency over time (measured; click a policy "
                                                "to hide it)", x=0, xref="paper", xanchor="left")
        paged = r.results["paged + continuous"]
        self.tables_html.value = (f"<b>Page tables at the busiest step of the paged run</b> "
                                  f"{badge('measured', 'from the PageManager')}"
                                  + page_table_html(paged.peak_tables, paged.peak_shared, r.page_size))
