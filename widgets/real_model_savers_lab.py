"""The memory savers on SmolLM2-135M: the bytes-vs-quality frontier, StreamingLLM's curves, a KIVI block up close.

    lab = RealModelSaversLab()                       # reads benchmarks/data/memory_savers_smollm2.json
    lab.update(metric="mean KL", selection="int8")   # the frontier on another quality axis; lab.reading.row
    lab.update(window=1024, position=3000)           # perplexity against position, and which slots each policy holds
    lab.update(bits=2, block="keys per token")       # a real key block quantized the wrong way round

Every point and curve was measured by `benchmarks/memory_savers.py --part smollm2` and stored; the lab neither
loads the model nor re-measures. The kept-slot strips follow each policy's rule (derived). The KIVI view
quantizes a stored block of real keys and values (measured) with dantinox.cache.kivi's own scale and rounding.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import jax
import jax.numpy as jnp
import numpy as np
import plotly.graph_objects as go
import traitlets
from plotly.subplots import make_subplots

from dantinox.cache.kivi import encode, scale_zero
from dantinox_labs import shipped
from widgets._controls import Lab
from widgets._figure import FigureWidget
from widgets._html import badge, esc, readout_table
from widgets.memory_savers_lab import read_measurements
from widgets.number_input import NumberInput

SMOL_MEASUREMENTS = shipped.data("memory_savers_smollm2.json")  # benchmarks/memory_savers.py --part smollm2
METRICS = {"perplexity": ("perplexity", "perplexity on the held-out text (lower is better)"),
           "top-1 agreement": ("agreement", "next-token top-1 agreement with the fp32 full cache"),
           "mean KL": ("mean_kl", "mean KL(full fp32 ‖ saver) of next-token distributions, nats")}
FAMILY_COLORS = {"baseline": "#424242", "quantized": "#1565c0", "kivi": "#00838f", "window": "#ef6c00",
                 "sinks": "#2e7d32", "eviction": "#6a1b9a", "recompute": "#8d6e63"}
BLOCKS = ("keys per channel (KIVI)", "values per token (KIVI)", "keys per token")
ROW_FIELDS = ("label", "family", "decoded", "bytes_per_token", "bytes", "perplexity", "agreement", "mean_kl",
              "perplexity_by_position")


def load_smol_measurements(path: str | Path = SMOL_MEASUREMENTS) -> dict[str, Any]:
    """The SmolLM2 benchmark's JSON, checked: a missing file or field is one line naming it."""
    return read_measurements(path, ("date", "tokens", "bin", "rows", "missing", "wall_s", "kivi_block"), ROW_FIELDS,
                             "python benchmarks/memory_savers.py --part smollm2")


def frontier_figure(data: dict, metric: str, tiny: dict | None = None, selected: str | None = None) -> go.Figure:
    """SmolLM2 configurations: cache bytes per token (log x) against `metric`; the tiny runs beside them where
    the metric means the same there (top-1 agreement with the same weights' float cache)."""
    key, title = METRICS[metric]
    fig = go.Figure()
    for family, color in FAMILY_COLORS.items():
        rows = [r for r in data["rows"] if r["family"] == family]
        if rows:
            fig.add_trace(go.Scatter(x=[r["bytes_per_token"] for r in rows], y=[r[key] for r in rows],
                                     mode="markers", name=f"SmolLM2: {family}", text=[r["label"] for r in rows],
                                     marker=dict(size=12, color=color, line=dict(color="white", width=1)),
                                     hovertemplate="%{text}<br>%{x:,.0f} B/token<br>%{y:.4g}<extra></extra>"))
    if tiny is not None and key == "agreement":
        rows = tiny["rows"]
        fig.add_trace(go.Scatter(x=[r["bytes_per_token"] for r in rows], y=[r["agreement_vs_own_float"] for r in rows],
                                 mode="markers", name=f"tiny runs ({tiny['tokens']} tokens)",
                                 text=[r["label"] for r in rows], hovertemplate="%{text}<br>%{x:,.0f} B/token"
                                 "<br>%{y:.4g}<extra></extra>",
                                 marker=dict(size=9, symbol="diamond-open", color="#9e9e9e", line=dict(width=2))))
    chosen = [r for r in data["rows"] if r["label"] == selected]
    fig.add_trace(go.Scatter(x=[r["bytes_per_token"] for r in chosen], y=[r[key] for r in chosen], mode="markers",
                             name="your selection", hoverinfo="skip",
                             marker=dict(size=24, color="rgba(0,0,0,0)", line=dict(color="#d50000", width=3))))
    fig.update_layout(
        title=dict(text=f"SmolLM2-135M: cache bytes vs {metric}<br><sup>measured by benchmarks/memory_savers.py "
                        f"--part smollm2 on {data['date']}, {data['tokens']} held-out tokens, weights unchanged</sup>",
                   x=0, xref="paper", xanchor="left"),
        xaxis=dict(title=f"KV cache bytes per token over {data['tokens']} tokens (log)", type="log"),
        yaxis=dict(title=title),
        height=520, width=820, margin=dict(l=80, r=40, t=90, b=120),
        legend=dict(orientation="h", x=0, y=-0.2, xanchor="left", yanchor="top"))
    return fig


def streaming_rows(data: dict, window: int) -> list[dict]:
    """The stored rows of StreamingLLM's comparison at window W: full, window alone, window + sinks, recomputed."""
    wanted = ("fp32 full cache", f"window {window} (not retrained)", f"window {window - 4} + 4 sinks",
              f"window {window} recomputed")
    rows = {r["label"]: r for r in data["rows"]}
    return [rows[label] for label in wanted if label in rows]


def streaming_figure(data: dict, window: int) -> go.Figure:
    """Perplexity per bin of positions for each policy at window W (measured)."""
    fig = go.Figure()
    colors = ["#424242", "#ef6c00", "#2e7d32", "#8d6e63"]
    for row, color in zip(streaming_rows(data, window), colors, strict=False):
        curve = row["perplexity_by_position"]
        centers = [data["bin"] * i + data["bin"] / 2 for i in range(len(curve))]
        fig.add_trace(go.Scatter(x=centers, y=curve, mode="lines", name=row["label"], line=dict(color=color, width=2)))
    fig.add_vline(x=window, line_dash="dot", line_color="#9e9e9e")
    fig.update_layout(
        title=dict(text=f"StreamingLLM on SmolLM2-135M, W = {window}<br><sup>perplexity per {data['bin']} positions, "
                        f"measured; dotted: the window's length</sup>", x=0, xref="paper", xanchor="left"),
        xaxis=dict(title="position in the held-out text"), yaxis=dict(title="perplexity", rangemode="tozero"),
        height=420, width=820, margin=dict(l=70, r=30, t=80, b=60), legend=dict(x=0.01, y=0.99))
    return fig


def kept_spans(policy: str, position: int, window: int, sinks: int = 4) -> list[tuple[int, int]]:
    """[start, end] spans of positions a policy's cache holds when position `position` is written (derived)."""
    p, W = position, window
    if policy == "full":
        return [(0, p)]
    if policy == "window":
        return [(max(0, p - W + 1), p)]
    if policy == "sinks":
        ring = W - sinks
        return [(0, min(sinks, p + 1) - 1), (max(sinks, p - ring + 1), p)] if p >= sinks else [(0, p)]
    if policy == "recompute":  # strided: the chunk [c, c + 2W) whose second half holds p
        start = 0 if p < 2 * W else (p // W - 1) * W
        return [(start, p)]
    raise ValueError(f"policy: expected full, window, sinks or recompute, got {policy!r}")


def slots_figure(position: int, window: int, tokens: int) -> go.Figure:
    fig = go.Figure()
    for y, (policy, color) in enumerate((("full", "#424242"), ("window", "#ef6c00"), ("sinks", "#2e7d32"),
                                         ("recompute", "#8d6e63"))):
        for a, b in kept_spans(policy, position, window):
            fig.add_trace(go.Scatter(x=[a, b + 1], y=[y, y], mode="lines", line=dict(color=color, width=14),
                                     showlegend=False, hovertemplate=f"{policy}: positions {a}–{b}<extra></extra>"))
    fig.update_layout(title=dict(text=f"positions each cache holds when token {position} is written (derived from "
                                      f"each policy's rule)", x=0, xref="paper", xanchor="left", font=dict(size=13)),
                      xaxis=dict(range=[0, tokens], title="position"), height=230, width=820,
                      yaxis=dict(tickvals=[0, 1, 2, 3], ticktext=["full", f"window {window}",
                                                                   f"{window - 4} + 4 sinks", "recomputed"]),
                      margin=dict(l=110, r=30, t=40, b=45))
    return fig


@dataclasses.dataclass(frozen=True)
class KiviBlock:
    """A real block [T, H] and its quantized copy with the scales and zero points that produced it."""

    original: np.ndarray
    restored: np.ndarray
    scale: np.ndarray  # per channel [H] (keys) or per token and channel group [T, H / G]
    zero: np.ndarray

    @property
    def error(self) -> np.ndarray:
        return self.restored - self.original

    @property
    def mean_abs_error(self) -> float:
        return float(np.abs(self.error).mean())


@functools.partial(jax.jit, static_argnums=(1, 2, 3))  # one program per setting, not one per array operation
def _kivi_round(x_TH: jax.Array, bits: int, group: int, per_channel: bool):
    T, H = x_TH.shape
    grouped = x_TH.reshape(T // group, group, H) if per_channel else x_TH.reshape(T, H // group, group)
    axis = 1 if per_channel else 2
    scale, zero = scale_zero(grouped.min(axis, keepdims=True), grouped.max(axis, keepdims=True), bits)
    restored = encode(grouped, scale, zero, bits) * scale.astype(jnp.float32) + zero.astype(jnp.float32)
    return restored.reshape(T, H), scale.astype(jnp.float32).squeeze(axis), zero.astype(jnp.float32).squeeze(axis)


def kivi_quantize(x_TH: np.ndarray, bits: int, group: int, per_channel: bool) -> KiviBlock:
    """KIVI's asymmetric rounding with dantinox.cache.kivi's scales: per channel over groups of `group` tokens, or per
    token over groups of `group` channels."""
    x = np.asarray(x_TH, np.float32)
    restored, scale, zero = (np.asarray(a) for a in _kivi_round(jnp.asarray(x), bits, group, per_channel))
    return KiviBlock(x, restored, scale, zero)


def block_for(data: dict, block: str, bits: int) -> KiviBlock:
    stored = data["kivi_block"]
    group = stored["group"]
    keys, values = np.asarray(stored["keys"], np.float32), np.asarray(stored["values"], np.float32)
    if block not in BLOCKS:
        raise ValueError(f"block: expected one of {', '.join(BLOCKS)}, got {block!r}")
    if block == BLOCKS[0]:
        return kivi_quantize(keys, bits, group, per_channel=True)
    return kivi_quantize(values if block == BLOCKS[1] else keys, bits, group, per_channel=False)


@dataclasses.dataclass(frozen=True)
class RealModelSaversReading:
    row: dict[str, Any]
    metric: str
    window: int
    position: int
    kivi: KiviBlock
    keys_per_channel_error: float
    keys_per_token_error: float


class RealModelSaversLab(Lab):
    """SmolLM2's frontier (metric selectable, the tiny runs beside it), StreamingLLM's panel and a KIVI block."""

    CONTROLS = ("metric", "selection", "window", "position", "bits", "block")
    reading = traitlets.Instance(RealModelSaversReading, allow_none=True)

    def __init__(self, measurements: str | Path = SMOL_MEASUREMENTS, tiny: dict | None = None,
                 selection: str = "int8"):
        self.data = load_smol_measurements(measurements)
        self.tiny = tiny
        labels = [r["label"] for r in self.data["rows"]]
        style, layout = {"description_width": "150px"}, widgets.Layout(width="480px")
        self.metric = widgets.Dropdown(options=list(METRICS), value="perplexity", description="quality metric",
                                       style=style, layout=layout)
        self.selection = widgets.Dropdown(options=labels, description="configuration", style=style, layout=layout)
        windows = sorted({r["config"]["sliding_windows"][0] for r in self.data["rows"] if r["family"] == "window"}
                         | {r["window"] for r in self.data["rows"] if r["family"] == "recompute"})
        if not windows:
            raise ValueError(f"{measurements}: no window was measured, so the StreamingLLM panel has nothing to show")
        self.window = widgets.Dropdown(options=windows, description="window W", style=style, layout=layout)
        self.position = NumberInput(value=self.data["tokens"] - 1, min=0, max=self.data["tokens"] - 1,
                                    description="position", unit="(index)", style=style, layout=layout)
        self.bits = widgets.Dropdown(options=[2, 4], value=2, description="KIVI bits", style=style, layout=layout)
        self.block = widgets.Dropdown(options=list(BLOCKS), description="block", style=style, layout=layout)
        self.figure = FigureWidget(frontier_figure(self.data, "perplexity", tiny))
        self.stream_figure = FigureWidget(streaming_figure(self.data, windows[0]))
        self.slots_figure = FigureWidget(slots_figure(self.data["tokens"] - 1, windows[0], self.data["tokens"]))
        self.kivi_figure = FigureWidget()
        status = widgets.HTML()
        self.readout_html, self.stream_html, self.kivi_html = widgets.HTML(), widgets.HTML(), widgets.HTML()
        super().__init__([self.metric, self.selection, status, self.figure, self.readout_html,
                          widgets.HTML("<h4>StreamingLLM on SmolLM2</h4>"), self.window, self.stream_figure,
                          self.stream_html, self.position, self.slots_figure,
                          widgets.HTML("<h4>KIVI on a real key and value block</h4>"), self.bits, self.block,
                          self.kivi_html, self.kivi_figure], status)
        self.observe_controls(self.metric, self.selection, self.window, self.position, self.bits, self.block)
        if selection not in labels:
            raise ValueError(f"selection: expected one of {', '.join(labels)}, got {selection!r}")
        self.update(selection=selection)

    def _read(self) -> RealModelSaversReading:
        row = next(r for r in self.data["rows"] if r["label"] == self.selection.value)
        kivi = block_for(self.data, self.block.value, self.bits.value)
        per_channel = block_for(self.data, BLOCKS[0], self.bits.value).mean_abs_error
        per_token = block_for(self.data, BLOCKS[2], self.bits.value).mean_abs_error
        return RealModelSaversReading(row, self.metric.value, self.window.value, self.position.value, kivi,
                                      per_channel, per_token)

    def _render(self, r: RealModelSaversReading) -> None:
        self.status_html.value = ""
        fresh = frontier_figure(self.data, r.metric, self.tiny, r.row["label"])
        with self.figure.batch_update():
            self.figure.data = []
            self.figure.add_traces(list(fresh.data))
            self.figure.layout = fresh.layout
        row, base = r.row, next((x for x in self.data["rows"] if x["family"] == "baseline"), None)
        share = "" if base is None else f"{row['bytes_per_token'] / base['bytes_per_token']:.1%} of the full fp32 cache"
        self.readout_html.value = f"<b>{esc(row['label'])}</b>, decoded {esc(row['decoded'])}" + readout_table([
            ("cache bytes per token, from the arrays", f"{row['bytes_per_token']:,.0f} B ({share})",
             badge("measured", "init_cache shapes == kv_cache_bytes == the content formula")),
            ("perplexity", f"{row['perplexity']:.3f}", badge("measured")),
            ("top-1 agreement with the fp32 full cache", f"{row['agreement']:.2%}", badge("measured")),
            ("mean KL from the fp32 full cache", f"{row['mean_kl']:.4f} nats", badge("measured")),
        ])
        fresh = streaming_figure(self.data, r.window)
        with self.stream_figure.batch_update():
            self.stream_figure.data = []
            self.stream_figure.add_traces(list(fresh.data))
            self.stream_figure.layout = fresh.layout
        last = [(x["label"], x["perplexity_by_position"][-1]) for x in streaming_rows(self.data, r.window)]
        self.stream_html.value = readout_table([(f"{label}: perplexity over the last {self.data['bin']} positions",
                                                 f"{ppl:.2f}", badge("measured")) for label, ppl in last])
        fresh = slots_figure(r.position, r.window, self.data["tokens"])
        with self.slots_figure.batch_update():
            self.slots_figure.data = []
            self.slots_figure.add_traces(list(fresh.data))
            self.slots_figure.layout = fresh.layout
        k = r.kivi
        stored = self.data["kivi_block"]
        first, end = stored["tokens"]
        where = f"layer {stored['layer']}, KV head {stored['head']}, tokens {first}–{end - 1}"
        self.kivi_html.value = readout_table([
            ("block", f"{esc(self.block.value)}, {r.kivi.original.shape[0]} tokens × {r.kivi.original.shape[1]} "
                      f"channels, {where}", badge("measured", "SmolLM2's float32 cache")),
            ("mean |error| of this block", f"{k.mean_abs_error:.4f}", badge("derived", "dantinox.cache.kivi rounding")),
            (f"keys, {self.bits.value}-bit: mean |error| per channel vs per token",
             f"{r.keys_per_channel_error:.4f} vs {r.keys_per_token_error:.4f}", badge("derived")),
            ("largest scale / median scale", f"{np.max(k.scale) / np.median(k.scale):.1f}", badge("derived")),
        ])
        fig = make_subplots(rows=1, cols=3, subplot_titles=("original (measured)", f"{self.bits.value}-bit restored",
                                                            "error"))
        lim = float(np.abs(k.original).max())
        for col, z in ((1, k.original), (2, k.restored), (3, k.error)):
            fig.add_trace(go.Heatmap(z=z, zmin=-lim, zmax=lim, colorscale="RdBu", showscale=col == 3), 1, col)
        fig.update_layout(height=300, width=820, margin=dict(l=40, r=20, t=40, b=40))
        fig.update_xaxes(title_text="channel")
        fig.update_yaxes(title_text="token", col=1)
        with self.kivi_figure.batch_update():
            self.kivi_figure.data = []
            self.kivi_figure.add_traces(list(fig.data))
            self.kivi_figure.layout = fig.layout
