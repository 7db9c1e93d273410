"""The real-models lab: a published model's KV cache layer by layer, its growth with T, its fit, two engines.

    lab = RealModelsLab(model="gemma-3-27b")
    lab.update(tokens=32_768, batch=4, cache_dtype="bfloat16", device="H100 80GB", weights_format="bf16")
    lab.reading.ledger.total_bytes, lab.reading.curve, lab.load_file("path/to/config.json")

Every number comes from dantinox.kv_ledger: the per-layer bytes are measured from dantinox's cache shapes
(jax.eval_shape on the same layouts; linear-attention states are derived), the curve over T is the ledger's
formula, and the engine columns are derived from vLLM's and llama.cpp's sources
(dantinox/accounting/peer_allocation.py). The fit sizes the weights in the format chosen under "weights": by
default the published checkpoint's (dantinox/data/real_models.json names it, with its source), else bf16, and
the readout says which.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

import ipywidgets as widgets
import traitlets

import dantinox
from dantinox.accounting.kv_ledger import CACHE_DTYPES, Ledger, kv_ledger, sequence_bytes
from dantinox.accounting.memory import WEIGHT_FORMATS
from dantinox.accounting.peer_allocation import llama_cpp_column, vllm_column
from dantinox.architectures.catalogue import Architecture, catalogue, load_architecture
from widgets._controls import Lab
from widgets._figure import FigureWidget
from widgets._html import badge, esc, link, note_box, readout_table
from widgets.number_input import NumberInput

KIND_COLOURS = {"full": "#1565c0", "sliding": "#2e7d32", "chunked": "#00897b", "latent": "#6a1b9a",
                "shared": "#9e9e9e", "linear": "#ef6c00", "mamba": "#c62828", "conv": "#8d6e63",
                "mlp": "#bdbdbd"}
CURVE_POINTS = 48
PUBLISHED = "published"  # the weights control's default: the checkpoint's own format where the catalogue names it


def token_choices(max_context: int) -> list[int]:
    """Powers of two up to the model's context, and the context itself: the T slider's stops (log scale)."""
    stops = [2**k for k in range(int(math.log2(max_context)) + 1)]
    return stops if stops[-1] == max_context else [*stops, max_context]


@dataclasses.dataclass(frozen=True)
class RealModelReading:
    arch: Architecture
    ledger: Ledger
    curve: tuple[tuple[int, int, int], ...]  # (T, ledger bytes, naive bytes) for B sequences, derived
    engines: tuple[str, ...]  # one line per engine column, or why it is not derived


def _engine_lines(arch: Architecture, ledger: Ledger) -> tuple[str, ...]:
    fmt = dantinox.format_bytes
    lines = []
    try:
        hybrid = vllm_column(arch, ledger.tokens, ledger.batch, ledger.cache_dtype)
        plain = vllm_column(arch, ledger.tokens, ledger.batch, ledger.cache_dtype, hybrid_allocator=False)
        lines.append(f"vLLM (16-token pages): {fmt(hybrid.total_bytes)} with its hybrid allocator, "
                     f"{fmt(plain.total_bytes)} without")
        lines += [f"vLLM: {note}" for note in hybrid.notes]
        fit = ledger.fit
        if fit is not None and fit.weight_bytes is not None and fit.capacity_bytes > fit.weight_bytes:
            log = vllm_column(arch, ledger.tokens, ledger.batch, ledger.cache_dtype,
                                      budget_bytes=fit.capacity_bytes - fit.weight_bytes)
            lines.append(f"vLLM would log: {log.log_line}" if log.log_line else f"vLLM: {log.notes[-1]}")
    except ValueError as e:
        lines.append(f"vLLM: {e}")
    try:
        column = llama_cpp_column(arch, ledger.tokens, ledger.cache_dtype)
        lines += [f"llama.cpp at n_ctx {ledger.tokens:,} (one sequence): {line.strip()}"
                  for line in column.log_line.splitlines()]
    except ValueError as e:
        lines.append(f"llama.cpp: {e}")
    return tuple(lines)


def read_real_model(arch: Architecture, tokens: int, batch: int, cache_dtype: str, device: str,
                    weights_format: str | None = None) -> RealModelReading:
    """The ledger at (T, B), the derived curve over T, and the engine columns; the fit's weights in
    `weights_format` (None: the published checkpoint's format, else bf16)."""
    ledger = kv_ledger(arch, tokens, batch, cache_dtype, device, weights_format=weights_format)
    grid = sorted({max(1, round(arch.max_context ** (i / (CURVE_POINTS - 1)))) for i in range(CURVE_POINTS)}
                  | {tokens})
    naive_per_token = ledger.naive_bytes // tokens
    curve = tuple((t, batch * sequence_bytes(arch, t, cache_dtype), naive_per_token * t) for t in grid)
    return RealModelReading(arch, ledger, curve, _engine_lines(arch, ledger))


_WINDOW_TERM = re.compile(r"^(.*?): they hold min\(T, ([\d,]+)\) = ([\d,]+) slots, not T = ([\d,]+)$")


def gap_lines(terms: tuple[str, ...]) -> list[str]:
    """The ledger's gap terms as a learner reads them: a window at least T long misses nothing, so say that
    instead of 'hold min(T, W) = T slots, not T'."""
    out = []
    for term in terms:
        match = _WINDOW_TERM.match(term)
        if match and match.group(3) == match.group(4):
            out.append(f"{match.group(1)}: at T = {match.group(4)} the window covers every token, so these "
                       "layers hold all T slots, as the naive formula assumes (they save memory once T > the window)")
        else:
            out.append(term)
    return out


def weights_note(arch: Architecture, ledger: Ledger) -> str:
    """HTML: the format the weights were sized in, why, and the source that names the published one."""
    fit = ledger.fit
    if fit is None or fit.weights_format is None:
        return ""
    used = fit.weights_format
    text = esc(f"Weights sized as {used}: {WEIGHT_FORMATS[used].about}.")
    if arch.weights_format is None:
        return text + esc(" The catalogue names no published format for this model, so bf16 is assumed unless "
                          "you choose another under weights.")
    url, _, why = arch.weights_format_source.partition(" ")
    said = link(why.strip().removeprefix("(").removesuffix(")") or url, url)
    if used == arch.weights_format:
        return f"{text} The published checkpoint's format: {said}"
    return f"{text} {esc(f'The published checkpoint is {arch.weights_format}:')} {said}"


def max_context_row(fits: int, model_limit: int, batch: int) -> tuple[str, str, str]:
    """The longest T whose B sequences fit, saying when the model's own context limit, not memory, stops it."""
    if fits >= model_limit:
        return (f"max context at B = {batch}", f"{fits:,} tokens",
                badge("derived", "the model's context limit (max_position_embeddings); memory holds more"))
    return (f"max context at B = {batch}", f"{fits:,} tokens", badge("derived", "memory limit: cache + weights"))


class RealModelsLab(Lab):
    """Pick a model (or load a config.json / GGUF), move T, B, cache dtype and device; see every layer."""

    CONTROLS = ("model", "tokens", "batch", "cache_dtype", "device", "weights_format")
    reading = traitlets.Instance(RealModelReading, allow_none=True)

    def __init__(self, *, model: str = "gemma-3-27b", tokens: int = 32_768, batch: int = 1,
                 cache_dtype: str = "bfloat16", device: str = "H100 80GB", weights_format: str = PUBLISHED):
        self._archs = {name: load_architecture(name) for name in catalogue()}
        style, layout = {"description_width": "150px"}, widgets.Layout(width="560px")
        self.model = widgets.Dropdown(options=list(self._archs), description="model", style=style, layout=layout)
        first = self._archs[model].max_context if model in self._archs else 1
        self.tokens = NumberInput(value=min(tokens, first), min=1, max=first, scale="log",
                                  grid=token_choices(first), description="tokens T (log)", unit="tokens",
                                  style=style, layout=layout)
        self.batch = NumberInput(value=1, min=1, max=256, description="sequences B", unit="sequences",
                                 style=style, layout=layout)
        self.cache_dtype = widgets.Dropdown(options=list(CACHE_DTYPES), description="cache dtype", style=style,
                                            layout=layout)
        self.device = widgets.Dropdown(options=[d for d in dantinox.DEVICE_PRESETS if not d.startswith("this")],
                                       description="device", style=style, layout=layout)
        self.weights_format = widgets.Dropdown(
            options=[("the published checkpoint's format (else bf16)", PUBLISHED),
                     *((f"{name}: {WEIGHT_FORMATS[name].bits:g} bits a parameter", name) for name in WEIGHT_FORMATS)],
            description="weights", style=style, layout=layout)
        self.path = widgets.Text(placeholder="path to a config.json or .gguf", description="your file",
                                 style=style, layout=layout)
        self.load_button = widgets.Button(description="load file")
        self.load_button.on_click(lambda _: self.guard(lambda: self.load_file(self.path.value)))
        self.readout_html, self.engines_html = widgets.HTML(), widgets.HTML()
        self.layers_fig = FigureWidget(layout=dict(height=320, margin=dict(t=50, b=40, l=60, r=20), barmode="stack",
                                                   xaxis_title="layer", yaxis_title="bytes"))
        self.curve_fig = FigureWidget(layout=dict(height=320, margin=dict(t=50, b=40, l=60, r=20),
                                                  xaxis=dict(type="log", title="tokens T"),
                                                  yaxis=dict(type="log", title="bytes")))
        controls = [self.model, self.tokens, self.batch, self.cache_dtype, self.device, self.weights_format]
        status = widgets.HTML()
        super().__init__([*controls, widgets.HBox([self.path, self.load_button]), status, self.readout_html,
                          self.layers_fig, self.curve_fig, self.engines_html], status)
        self.model.observe(self._on_model, names="value")
        self.observe_controls(self.tokens, self.batch, self.cache_dtype, self.device, self.weights_format)
        with self.batched():
            self.model.value = model
            self._set_tokens_range(tokens)
        self.update(batch=batch, cache_dtype=cache_dtype, device=device, weights_format=weights_format)

    def _set_tokens_range(self, tokens: int | None = None) -> None:
        """A new model: T keeps its value (said in the control's line when the new context is shorter)."""
        context = self._archs[self.model.value].max_context
        self.tokens.set_range(1, context)  # an outside T moves to the new end, and the control says so
        self.tokens.set_grid(token_choices(context))
        if tokens is not None:
            self.tokens.value = min(tokens, context)

    def _on_model(self, _change=None) -> None:
        with self.batched():
            self._set_tokens_range()
        self._on_change()

    def load_file(self, path: str) -> Architecture:
        """Read a user's config.json or GGUF (metadata only) and select it; errors show in one line."""
        arch = load_architecture(os.path.expanduser(path.strip()))  # '~/models/config.json' as a shell reads it
        label = f"your file: {arch.name}"
        self._archs[label] = arch
        self.model.options = list(self._archs)
        self.model.value = label
        return arch

    def _read(self) -> RealModelReading:
        arch = self._archs[self.model.value]
        chosen = None if self.weights_format.value == PUBLISHED else self.weights_format.value
        return read_real_model(arch, self.tokens.value, self.batch.value, self.cache_dtype.value, self.device.value,
                               chosen)

    def _render(self, r: RealModelReading) -> None:
        fmt, led = dantinox.format_bytes, r.ledger
        self.status_html.value = note_box("<br>".join(esc(n) for n in led.notes)) if led.notes else ""
        same = led.measured_bytes == led.total_bytes
        rows = [("total cache", f"{led.total_bytes:,} B = {fmt(led.total_bytes)}",
                 badge("measured", "dantinox cache shapes, = formula" if same else "differs from the formula!")),
                ("one more token adds", f"{led.per_token_bytes:,} B per sequence", badge("derived", "ledger")),
                ("naive calculator", f"{fmt(led.naive_bytes)} "
                 f"({'the same here' if led.naive_bytes == led.total_bytes else f'{led.naive_error_pct:+.1f} %'})",
                 badge("derived", "2·L·K·(D/N)·T·B·s"))]
        fit = led.fit
        if fit is not None:
            rows.append((f"{fit.device} capacity", fmt(fit.capacity_bytes), badge("derived", "device preset")))
            if fit.weight_bytes is None:
                rows.append(("weights", "unknown", badge("derived", fit.weights_source)))
            else:
                rows.append(("weights", fmt(fit.weight_bytes), badge("derived", fit.weights_source)))
                if fit.capacity_bytes <= fit.weight_bytes:
                    rows.append(("fit", "the weights alone do not fit", ""))
                else:
                    rows.append(max_context_row(fit.max_context, led.max_context, led.batch))
                    rows.append((f"max batch at T = {led.tokens:,}", f"{fit.max_batch:,} sequences", badge("derived")))
        gaps = "".join(f"<li>{esc(t)}</li>" for t in gap_lines(led.gap_terms))
        weights = weights_note(r.arch, led)
        self.readout_html.value = (readout_table(rows)
                                   + (f"<div style='margin:4px 0'>{weights}</div>" if weights else "")
                                   + (f"<div>What the naive formula misses:<ul>{gaps}</ul></div>" if gaps else ""))
        with self.layers_fig.batch_update():
            self.layers_fig.data = []
            for kind, colour in KIND_COLOURS.items():
                mine = [row for row in led.rows if row.kind == kind]
                if mine:
                    self.layers_fig.add_bar(x=[row.layer for row in mine], y=[row.bytes for row in mine], name=kind,
                                            marker_color=colour)
            self.layers_fig.layout.title = dict(  # two short lines: one long line was cut off for every model
                text=(f"{esc(led.model)}: bytes per layer at T = {led.tokens:,}, B = {led.batch}<br><sup>measured "
                      "from dantinox's cache shapes; linear states derived</sup>"), x=0, xref="paper", xanchor="left")
        with self.curve_fig.batch_update():
            self.curve_fig.data = []
            ts = [t for t, _, _ in r.curve]
            self.curve_fig.add_scatter(x=ts, y=[b for _, b, _ in r.curve], name="ledger", mode="lines",
                                       line_color="#1565c0")
            self.curve_fig.add_scatter(x=ts, y=[n for _, _, n in r.curve], name="naive calculator", mode="lines",
                                       line=dict(color="#b71c1c", dash="dash"))
            self.curve_fig.add_scatter(x=[led.tokens], y=[led.total_bytes], name="this T (measured)", mode="markers",
                                       marker=dict(size=10, color="#000"))
            self.curve_fig.layout.title = "total bytes against T (derived: the ledger's formula; marker measured)"
        lines = "".join(f"<li>{esc(line)}</li>" for line in r.engines)
        self.engines_html.value = (f"<div>Engine columns {badge('derived', 'from vLLM and llama.cpp sources')}"
                                   f"<ul>{lines}</ul></div>")
