"""The memory-savers lab: every cache-shrinking configuration on one bytes-vs-quality chart, a ring buffer, int8.

    lab = MemorySaversLab()                     # reads benchmarks/data/memory_savers.json
    lab.update(selection="MHA int8")            # highlight one configuration; lab.reading.row holds its numbers
    lab.update(window=8, written=21)            # which positions a local layer's ring buffer holds
    lab.update(head=1, token=40)                # one real key vector before and after int8

The frontier points are measured by benchmarks/memory_savers.py (bytes from the cache arrays, quality on
held-out text) and stored as JSON, so the lab neither retrains nor re-measures. The ring view follows
dantinox.cache.ring's slot rule (derived); the quantization view quantizes a key from runs/tiny's real cache
(measured) with dantinox.cache.quant.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import jax.numpy as jnp
import numpy as np
import plotly.graph_objects as go
import traitlets
from plotly.subplots import make_subplots

import dantinox
from dantinox.cache.quant import dequantize, quantize
from dantinox.cache.ring import ring_slots_held
from dantinox.generation import quality
from dantinox_labs import shipped
from widgets._controls import Lab
from widgets._figure import FigureWidget
from widgets._html import badge, esc, readout_table
from widgets.number_input import NumberInput

MEASUREMENTS = shipped.data("memory_savers.json")  # written by benchmarks/memory_savers.py, shipped with the labs
ROW_FIELDS = ("label", "family", "run", "bytes_per_token", "formula_bytes", "bytes", "bits_per_byte",
              "delta_bits_per_byte", "agreement_vs_mha", "agreement_vs_own_float", "max_logit_error")
COLORS = {"baseline": "#424242", "quantized": "#1565c0", "heads": "#2e7d32", "latent": "#6a1b9a",
          "window": "#ef6c00", "window, not retrained": "#6d4c41", "combined": "#c62828"}


def read_measurements(path: str | Path, fields: tuple[str, ...], row_fields: tuple[str, ...],
                      command: str) -> dict[str, Any]:
    """A benchmark's stored JSON with its `fields` and each row's `row_fields`: a missing file or field is one
    line naming it (and, for a missing file, the `command` that measures it)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: not found; run `{command}` to measure")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None
    for key in fields:
        if key not in data:
            raise ValueError(f"{path}: field '{key}' is missing")
    for i, row in enumerate(data["rows"]):
        missing = [f for f in row_fields if f not in row]
        if missing:
            raise ValueError(f"{path}: rows[{i}] lacks {', '.join(missing)}")
    return data


def load_measurements(path: str | Path = MEASUREMENTS) -> dict[str, Any]:
    """The benchmark's JSON, checked: a missing file or field is one line naming it."""
    return read_measurements(path, ("date", "tokens", "rows"), ROW_FIELDS, "python benchmarks/memory_savers.py")


UNTRAINED = "window, not retrained"  # a window imposed on MHA weights at inference only
# Families whose quality change is not comparable with full MHA's on this tiny model: it memorised its training
# text, so on new text every window (retrained or imposed) lowered bits per byte. Their bytes still compare.
NOT_COMPARABLE = ("window", UNTRAINED)
SYMBOLS = ("circle", "diamond", "square", "triangle-up", "cross")  # points of one family that overlap differ


def comparable(row: dict[str, Any]) -> bool:
    """Whether a row's quality may be ranked against full MHA's (False for the window runs, see NOT_COMPARABLE)."""
    return row["family"] not in NOT_COMPARABLE


def _place(row: dict[str, Any]) -> tuple[float, Any, int]:
    """Where a row sits: (x, y, subplot row); the window runs on a bytes-only strip, by family."""
    if comparable(row):
        return row["bytes_per_token"], row["delta_bits_per_byte"], 1
    return row["bytes_per_token"], _strip_label(row["family"]), 2


def _strip_label(family: str) -> str:
    return "window, retrained" if family == "window" else family


def frontier_figure(data: dict[str, Any], selected: str | None = None) -> go.Figure:
    """Cache bytes per token (log x) against the bits-per-byte change vs float MHA for the comparable runs; the
    window runs, whose quality change is not comparable here, on a bytes-only strip below; `selected` ringed."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.74, 0.26], vertical_spacing=0.1,
                        subplot_titles=("comparable runs: lower and further left is better",
                                        "not comparable here: windows on a model that memorised its text "
                                        "(bytes only)"))
    for family, color in COLORS.items():
        rows = [r for r in data["rows"] if r["family"] == family]
        if not rows:
            continue
        places = [_place(r) for r in rows]
        if comparable(rows[0]):
            hover = "%{text}<br>%{x:,.0f} B/token<br>Δ %{y:+.4f} bits/byte<extra></extra>"
            symbols = [SYMBOLS[i % len(SYMBOLS)] for i in range(len(rows))]
        else:
            hover = ("%{text}<br>%{x:,.0f} B/token<br>Δ %{customdata:+.4f} bits/byte: not comparable, see the "
                     "strip's title<extra></extra>")
            symbols = [f"{SYMBOLS[i % len(SYMBOLS)]}-open" for i in range(len(rows))]
        fig.add_trace(go.Scatter(  # labels on hover and in the table: a dozen point labels overlap
            x=[x for x, _, _ in places], y=[y for _, y, _ in places], mode="markers",
            text=[r["label"] for r in rows], customdata=[r["delta_bits_per_byte"] for r in rows],
            name=f"{family} (not comparable)" if not comparable(rows[0]) else family,
            marker=dict(size=11, color=color, symbol=symbols, line=dict(color=color, width=2.5)),
            hovertemplate=hover), row=places[0][2], col=1)
    chosen = [_place(r) for r in data["rows"] if r["label"] == selected]
    where = chosen[0][2] if chosen else 1
    fig.add_trace(go.Scatter(x=[x for x, _, _ in chosen], y=[y for _, y, _ in chosen],
                             mode="markers", name="your selection", hoverinfo="skip",
                             marker=dict(size=24, color="rgba(0,0,0,0)", line=dict(color="#d50000", width=3))),
                  row=where, col=1)
    fig.update_layout(
        title=dict(text=f"Cache bytes vs quality<br><sup>measured by benchmarks/memory_savers.py on {data['date']}"
                        f" · click a point to select it</sup>", x=0, xref="paper", xanchor="left"),
        height=600, width=820, margin=dict(l=80, r=40, t=100, b=120),
        legend=dict(orientation="h", x=0, y=-0.16, xanchor="left", yanchor="top"))
    fig.update_xaxes(type="log")
    fig.update_xaxes(title_text=f"KV cache bytes per token at {data['tokens']} tokens (log)", row=2, col=1)
    fig.update_yaxes(title_text="bits per byte − float MHA's<br>(held-out text; lower is better)", row=1, col=1)
    fig.update_yaxes(type="category", row=2, col=1)
    fig.update_annotations(font_size=12)
    return fig


def ring_table(window: int, written: int) -> str:
    """HTML: the W slots of a local layer after `written` tokens, each with the position it holds (derived)."""
    held = ring_slots_held(window, written)
    newest = (written - 1) % window if written else None
    cells = []
    for slot, pos in enumerate(held):
        style = "background:#ffe0b2;font-weight:bold" if slot == newest else "background:#f5f5f5"
        cells.append(f"<td style='{style};border:1px solid #bbb;padding:4px 8px;text-align:center'>"
                     f"slot {slot}<br>{'empty' if pos is None else f'pos {pos}'}</td>")
    sees = f"positions {max(0, written - window)}–{written - 1}" if written else "nothing yet"
    return (f"<div>After {written} tokens a layer with W = {window} holds {sees} "
            f"{badge('derived', 'slot = position mod W')}; the next token overwrites slot {written % window}.</div>"
            f"<table style='border-collapse:collapse'><tr>{''.join(cells)}</tr></table>")


@dataclasses.dataclass(frozen=True)
class KeyQuantization:
    """One cached key vector [H] before and after quantization, with its scale (measured)."""

    key: np.ndarray
    codes: np.ndarray
    scale: float
    restored: np.ndarray

    @property
    def max_error(self) -> float:
        return float(np.abs(self.restored - self.key).max())


def quantize_key(key_H: np.ndarray, cache_dtype: str = "int8") -> KeyQuantization:
    """Quantize one key vector as the cache does (one scale for the head of one token) and restore it."""
    codes, scale = quantize(jnp.asarray(key_H, jnp.float32)[None, None, None], cache_dtype)
    restored = dequantize(codes, scale)
    return KeyQuantization(np.asarray(key_H, np.float32), np.asarray(codes.astype(jnp.float32))[0, 0, 0],
                           float(scale[0, 0, 0]), np.asarray(restored)[0, 0, 0])


def trained_keys(run_dir: str | Path, text: str, layer: int = 0) -> np.ndarray:
    """Keys [K, T, H] that a trained run's float cache holds for the first row of `text` (after RoPE)."""
    _, model = dantinox.load_run(run_dir)
    ids = quality.heldout_chunks(text, model.cfg.max_context)[:1]
    float_cache = dantinox.init_cache(model.cfg.with_cache(cache_dtype="float32"), 1)  # whatever the run's own
    _, cache, _ = model(ids, use_cache=True, kv_caches=float_cache)
    return np.asarray(cache.layers[layer].k[0]).transpose(0, 2, 1)  # stored [K, H, T]


@dataclasses.dataclass(frozen=True)
class MemorySaversReading:
    row: dict[str, Any]
    window: int
    written: int
    quant: KeyQuantization


class MemorySaversLab(Lab):
    """The frontier with the learner's selection, a ring-buffer view and an int8 view of a real key."""

    CONTROLS = ("selection", "window", "written", "head", "token")
    reading = traitlets.Instance(MemorySaversReading, allow_none=True)

    def __init__(self, measurements: str | Path = MEASUREMENTS, run_dir: str | Path | None = None,
                 selection: str = "MHA int8"):
        self.data = load_measurements(measurements)
        run_dir = Path(run_dir) if run_dir else shipped.run("tiny")
        self.keys_KTH = trained_keys(run_dir, shipped.heldout_text())
        labels = [r["label"] for r in self.data["rows"]]
        style, layout = {"description_width": "150px"}, widgets.Layout(width="480px")
        self.selection = widgets.Dropdown(options=labels, description="configuration", style=style, layout=layout)
        self.window = NumberInput(value=8, min=2, max=16, description="window W", unit="slots", style=style,
                                  layout=layout)
        self.written = NumberInput(value=13, min=0, max=48, description="tokens decoded", unit="tokens",
                                   style=style, layout=layout)
        K, T, _ = self.keys_KTH.shape
        self.head = NumberInput(value=0, min=0, max=K - 1, description="KV head", unit="(index)", style=style,
                                layout=layout)
        self.token = NumberInput(value=40, min=0, max=T - 1, description="token position", unit="(index)",
                                 style=style, layout=layout)
        self.figure = FigureWidget(frontier_figure(self.data))
        for trace in self.figure.data[:-1]:  # clicking a point selects it, as the dropdown does
            trace.on_click(self._on_point)
        self.readout_html, self.ring_html, status = widgets.HTML(), widgets.HTML(), widgets.HTML()
        self.quant_html = widgets.HTML()
        self.quant_figure = FigureWidget(layout=dict(height=300, margin=dict(l=50, r=20, t=40, b=40)))
        super().__init__([self.selection, status, self.figure, self.readout_html,
                          widgets.HTML("<h4>Ring buffer of a local layer</h4>"), self.window, self.written,
                          self.ring_html, widgets.HTML("<h4>A key vector before and after int8</h4>"),
                          self.head, self.token, self.quant_html, self.quant_figure], status)
        self.observe_controls(self.selection, self.window, self.written, self.head, self.token)
        if selection not in labels:
            raise ValueError(f"selection: expected one of {', '.join(labels)}, got {selection!r}")
        self.update(selection=selection)

    def _on_point(self, trace, points, _state=None) -> None:
        """A click on the chart: select the configuration of the point clicked."""
        if points.point_inds:
            self.guard(lambda: self.update(selection=trace.text[points.point_inds[0]]))

    def _read(self) -> MemorySaversReading:
        row = next(r for r in self.data["rows"] if r["label"] == self.selection.value)
        quant = quantize_key(self.keys_KTH[self.head.value, self.token.value])
        return MemorySaversReading(row, self.window.value, self.written.value, quant)

    def _render(self, r: MemorySaversReading) -> None:
        self.status_html.value = ""
        row = r.row
        ring = frontier_figure(self.data, row["label"]).data[-1]
        with self.figure.batch_update():
            self.figure.data[-1].update(x=ring.x, y=ring.y, xaxis=ring.xaxis, yaxis=ring.yaxis)
        ref = f"same weights, float32 cache ({row['run']})"
        self.readout_html.value = f"<b>{esc(row['label'])}</b> ({esc(row['run'])})" + readout_table([
            ("cache bytes per token, from the arrays", f"{row['bytes_per_token']:,.1f} B",
             badge("measured", "init_cache, 256 tokens")),
            ("the same from the content formula", f"{row['formula_bytes'] / self.data['tokens']:,.1f} B",
             badge("derived", row.get("formula", "content formula"))),
            ("bits per byte on held-out text", f"{row['bits_per_byte']:.4f}", badge("measured")),
            ("change vs float MHA", f"{row['delta_bits_per_byte']:+.4f}", badge("measured")),
            ("next-token agreement with float MHA", f"{row['agreement_vs_mha']:.2%}", badge("measured")),
            (f"agreement with the {ref}", f"{row['agreement_vs_own_float']:.2%}", badge("measured")),
            (f"largest logit error vs the {ref}", f"{row['max_logit_error']:.3f}", badge("measured")),
        ])
        self.ring_html.value = ring_table(r.window, r.written)
        q = r.quant
        self.quant_html.value = readout_table([
            ("scale = max |key| / 127 (one per token and head)", f"{q.scale:.5f}",
             badge("measured", "runs/tiny, layer 0")),
            ("largest |error| over the head's channels", f"{q.max_error:.5f}", badge("measured")),
            ("bound: half a step, scale / 2", f"{q.scale / 2:.5f}", badge("derived")),
        ])
        channels = list(range(len(q.key)))
        with self.quant_figure.batch_update():
            self.quant_figure.data = []
            self.quant_figure.add_bar(x=channels, y=q.key, name="key (float32)", marker_color="#90a4ae")
            self.quant_figure.add_scatter(x=channels, y=q.restored, mode="markers", name="int8 code × scale",
                                          marker=dict(color="#1565c0", size=7))
            self.quant_figure.add_bar(x=channels, y=q.restored - q.key, name="error", marker_color="#c62828")
            self.quant_figure.layout.title = (f"key of head {self.head.value} at position {self.token.value} "
                                              f"(measured from runs/tiny's cache)")
            self.quant_figure.layout.xaxis.title = "channel"
