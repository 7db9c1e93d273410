"""Cache bytes vs tokens: derived lines for attention variants, measured dots where the learner has been.

    plot = CachePlot(lab)        # follows lab.reading; the figure is updated in place, never rebuilt

Works with any lab whose `reading` trait holds a `widgets.readings.CacheSize` and whose `derived_bytes(cfg,
B, T)` evaluates its content formula: the cache lab, and the MLA lab (which shows one inside itself).
Lines come from that formula (derived); dots are the lab's measurements (real arrays, or shapes above the
allocation budget), collected as the learner moves the sliders.
"""

from __future__ import annotations

from collections.abc import Callable

import ipywidgets as widgets
import numpy as np
import plotly.graph_objects as go

import dantinox
from widgets._figure import FigureWidget
from widgets.readings import CacheSize, peer_configs, variant_label

GRID_POINTS = 65
MAX_DOTS = 200
BYTE_UNITS = (("B", 1), ("KiB", 2**10), ("MiB", 2**20), ("GiB", 2**30), ("TiB", 2**40))


def byte_unit(largest: float) -> tuple[str, int]:
    """The binary unit an axis reaching `largest` bytes reads best in: its values stay below 1,024."""
    for name, factor in BYTE_UNITS:
        if largest < 1024 * factor or name == BYTE_UNITS[-1][0]:
            return name, factor
    raise AssertionError("unreachable")


def attention_variants(reading: CacheSize) -> list[dantinox.ModelConfig]:
    """MHA, GQA and MQA of the reading's model: GQA at the lab's K if it is GQA, else the first choice."""
    return peer_configs(reading.cfg)


class CachePlot(widgets.VBox):
    """A plotly FigureWidget that follows a lab's reading; `variants` picks the derived overlays."""

    def __init__(self, lab: widgets.Widget,
                 variants: Callable[[CacheSize], list[dantinox.ModelConfig]] = attention_variants):
        self.lab = lab
        self.variants = variants
        self._lines_key = None
        self._dots: dict[int, tuple[int, str]] = {}  # T -> (bytes, source) for the current (cfg, B)
        self._dots_key = None
        self.unit = BYTE_UNITS[2]  # (name, bytes) of the y axis, chosen from the largest line of the model
        self.figure = FigureWidget(layout=dict(
            height=400, width=820, margin=dict(l=60, r=20, t=60, b=50), hovermode="closest",
            xaxis=dict(title="tokens held per sequence (T)"), yaxis=dict(title="KV cache (MiB)"),
            legend=dict(orientation="h", y=-0.2)))
        super().__init__([self.figure])
        lab.observe(self._on_reading, names="reading")
        if lab.reading is not None:
            self.update(lab.reading)

    def _on_reading(self, change) -> None:
        if change["new"] is not None:
            self.update(change["new"])

    def _lines(self, reading: CacheSize) -> list[dict]:
        """One derived trace per variant: the content formula over a grid of token counts."""
        grid = np.unique(np.linspace(1, reading.cfg.max_context, GRID_POINTS).round().astype(int))
        lines = [(cfg, [self.lab.derived_bytes(cfg, reading.batch, int(t)) for t in grid])
                 for cfg in self.variants(reading)]
        self.unit = byte_unit(max(max(y) for _, y in lines))
        traces = []
        for cfg, y_bytes in lines:
            label = variant_label(cfg)
            current = cfg == reading.cfg
            traces.append(dict(
                x=grid.tolist(), y=[b / self.unit[1] for b in y_bytes], customdata=y_bytes, mode="lines",
                name=f"{label}, derived" + (" (current)" if current else ""),
                line=dict(width=3.5 if current else 1.5, dash="solid" if current else "dash"),
                hovertemplate=f"{label}<br>T=%{{x}}<br>%{{customdata:,}} B (derived)<extra></extra>"))
        return traces

    def update(self, reading: CacheSize) -> None:
        """Redraw for a new reading: lines only when the model or B changed, dots always."""
        key = (reading.cfg, reading.batch)
        if key != self._dots_key:
            self._dots, self._dots_key = {}, key
        self._dots[reading.tokens] = (reading.measured_bytes, reading.source)
        if len(self._dots) > MAX_DOTS:
            self._dots.pop(next(iter(self._dots)))
        lines = self._lines(reading) if key != self._lines_key else None
        self._lines_key = key
        dot_traces = []
        for source, name, symbol in (("arrays", "real arrays, measured", "circle"),
                                     ("shapes", "eval_shape sizes, measured (not allocated)", "x")):
            pts = sorted((t, b) for t, (b, s) in self._dots.items() if s == source)
            dot_traces.append(dict(
                x=[t for t, _ in pts], y=[b / self.unit[1] for _, b in pts], customdata=[b for _, b in pts],
                mode="markers", name=name, marker=dict(size=9, symbol=symbol, color="black"),
                hovertemplate=f"T=%{{x}}<br>%{{customdata:,}} B ({name})<extra></extra>"))
        current = dict(x=[reading.tokens], y=[reading.measured_bytes / self.unit[1]], mode="markers",
                       name="current setting", marker=dict(size=16, color="rgba(0,0,0,0)",
                                                           line=dict(width=2.5, color="crimson")),
                       hoverinfo="skip")
        fig = self.figure
        if lines is not None and len(fig.data) != len(lines) + 3:
            fig.data = []  # first draw, or a model with a different number of variants: new traces
            fig.add_traces([go.Scatter(**t) for t in [*lines, *dot_traces, current]])
        traces = [*dot_traces, current] if lines is None else [*lines, *dot_traces, current]
        with fig.batch_update():
            for old, new in zip(fig.data[-len(traces):], traces, strict=True):
                old.update(new)
            cfg = reading.cfg
            fig.layout.yaxis.title.text = f"KV cache ({self.unit[0]})"
            fig.layout.title.text = (
                f"KV cache vs tokens — {cfg.n_layers} layers, head size {cfg.head_size}, "
                f"B={reading.batch}, {cfg.cache_dtype}<br><sup>lines: derived from the content formula · "
                f"dots: measured ({'real arrays' if reading.source == 'arrays' else 'eval_shape, not allocated'}"
                f" now)</sup>")
