"""The cache lab: controls for the cache's shape, and the formula set beside the bytes of real arrays.

    lab = CacheLab(content.load_entry("kv-cache"))
    lab.tokens.value = 512                # any control, as a learner would move it
    lab.reading.residual                  # measured - derived bytes: 0

Every refresh evaluates the entry's science item (the formula lives in content, not here), then
allocates the real cache with `dantinox.init_cache` and measures it, unless it is larger than the
allocation budget: then the sizes come from `jax.eval_shape` of the same `init_cache`, and the lab says so.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any

import ipywidgets as widgets
import jax
import traitlets

import content
import dantinox
from dantinox.config import DTYPES
from widgets._controls import QuietUpdates
from widgets._html import badge, error_box, esc, note_box

# Bytes; a larger cache is sized from shapes instead of allocated. Allocating is dominated by the OS
# zeroing fresh pages (benchmarks/lab_latency.py): 256 MiB keeps a slider move under 300 ms on 2 CPU cores.
DEFAULT_BUDGET = 256 * 2**20
SCIENCE_TITLE = "KV cache size"
PER_TOKEN_TITLE = "KV cache per token"


@dataclasses.dataclass(frozen=True)
class LabReading:
    """Everything one refresh of the lab computed; the plot and the generate panel read it."""

    cfg: dantinox.ModelConfig
    batch: int  # B
    tokens: int  # T
    device: dantinox.DevicePreset
    formula_params: dict[str, int]  # the science item's variables, as substituted
    formula_bytes: int  # derived: the content formula
    measured_bytes: int  # measured: tree_nbytes of the real cache (or of its shapes above the budget)
    source: str  # "arrays" (allocated and measured) | "shapes" (jax.eval_shape, nothing allocated)
    per_token_bytes: int  # derived: ΔM, one more token of one sequence (the per-token science item)
    weight_bytes: int  # measured from the parameter shapes
    max_batch: int  # derived: sequences of `tokens` tokens that fit on `device` next to the weights

    @property
    def residual(self) -> int:
        return self.measured_bytes - self.formula_bytes


@functools.lru_cache(maxsize=64)
def weight_bytes(cfg: dantinox.ModelConfig) -> int:
    """Parameter bytes of a config (traced once per config: it builds the model under eval_shape)."""
    return dantinox.param_bytes(cfg)


def substitute(expression: str, params: dict[str, Any]) -> str:
    """`L * 2 * T` with L=12, T=512 -> `12 × 2 × 512`: the formula as the learner reads it, numbers in."""
    def value(match: re.Match) -> str:
        name = match.group(0)
        return f"{params[name]:,}" if name in params else name
    return re.sub(r"[A-Za-z_][A-Za-z_0-9]*", value, expression).replace("*", "×")


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


class CacheLab(QuietUpdates, widgets.VBox):
    """Sliders for T, B, attention variant, KV heads, cache dtype, model and device presets, with readouts."""

    ATTENTIONS = ("mha", "gqa", "mqa")
    reading = traitlets.Instance(LabReading, allow_none=True)
    error = traitlets.Unicode("")

    def __init__(self, entry: Any, *, preset: str = "reference", tokens: int | None = None, batch: int = 1,
                 attention: str = "gqa", kv_heads: int | None = None, cache_dtype: str = "bfloat16",
                 device: str = "H100 80GB", budget_bytes: int = DEFAULT_BUDGET, max_batch_slider: int = 256):
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 1:
            raise ValueError(f"budget_bytes: expected a positive integer, got {budget_bytes!r}")
        self.entry = entry
        self.science = entry.science_item(SCIENCE_TITLE)
        self.per_token_science = entry.science_item(PER_TOKEN_TITLE)
        self.budget_bytes = budget_bytes
        self._quiet = False
        style = {"description_width": "150px"}
        layout = widgets.Layout(width="520px")
        self.preset = widgets.Dropdown(options=list(dantinox.PRESETS), description="model preset",
                                       style=style, layout=layout)
        self.tokens = widgets.IntSlider(min=1, max=1, description="tokens T", style=style, layout=layout)
        self.batch = widgets.IntSlider(min=1, max=max_batch_slider, description="concurrency B",
                                       style=style, layout=layout)
        self.attention = widgets.ToggleButtons(options=list(self.ATTENTIONS), description="attention",
                                               style=style)
        self.kv_heads = widgets.Dropdown(description="KV heads K", style=style, layout=layout)
        self.cache_dtype = widgets.Dropdown(options=list(DTYPES), description="cache dtype", style=style,
                                            layout=layout)
        self.device = widgets.Dropdown(options=list(dantinox.DEVICE_PRESETS), description="device (batch calc)",
                                       style=style, layout=layout)
        self.formula_html = widgets.HTMLMath()
        self.readout_html = widgets.HTML()
        self.status_html = widgets.HTML()
        controls = [self.preset, self.tokens, self.batch, self.attention, self.kv_heads, self.cache_dtype,
                    self.device]
        super().__init__([*controls, self.status_html, self.formula_html, self.readout_html])
        if tokens is None:  # half the context: room to slide both ways
            tokens = max(1, dantinox.ModelConfig.preset(preset).max_context // 2)
        self.update(preset=preset, tokens=tokens, batch=batch, attention=attention, kv_heads=kv_heads,
                    cache_dtype=cache_dtype, device=device)
        self.preset.observe(self._on_preset, names="value")
        self.attention.observe(self._on_attention, names="value")
        for control in (self.tokens, self.batch, self.kv_heads, self.cache_dtype, self.device):
            control.observe(self._on_change, names="value")

    # Controls -----------------------------------------------------------------------------------
    def update(self, **values: Any) -> LabReading | None:
        """Set several controls at once (one refresh); out-of-range values raise instead of clamping."""
        names = ("preset", "tokens", "batch", "attention", "kv_heads", "cache_dtype", "device")
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise ValueError(f"update: unknown control(s) {', '.join(unknown)}; expected {', '.join(names)}")
        with self._hold():
            if "preset" in values:
                self._choose(self.preset, values["preset"], "preset")
                self._fit_to_preset()
            if "attention" in values:
                self._choose(self.attention, values["attention"], "attention")
                self._fit_kv_heads()
            if values.get("kv_heads") is not None:
                self._choose(self.kv_heads, values["kv_heads"], "kv_heads")
            for name in ("cache_dtype", "device"):
                if name in values:
                    self._choose(getattr(self, name), values[name], name)
            for name in ("tokens", "batch"):
                if name in values:
                    self._slide(getattr(self, name), values[name], name)
        return self.refresh()

    @staticmethod
    def _choose(control: widgets.Widget, value: Any, name: str) -> None:
        options = list(control.options)
        if value not in options:
            raise ValueError(f"{name}: expected one of {', '.join(map(str, options))}, got {value!r}")
        control.value = value

    @staticmethod
    def _slide(control: widgets.IntSlider, value: Any, name: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not control.min <= value <= control.max:
            raise ValueError(f"{name}: expected an integer in [{control.min}, {control.max}], got {value!r}")
        control.value = value

    def _fit_to_preset(self) -> None:
        """New preset: the token range follows max_context and the KV-head choices follow n_heads."""
        base = dantinox.ModelConfig.preset(self.preset.value)
        self.tokens.max = base.max_context  # the slider keeps its value inside its new range
        self._n_heads = base.n_heads
        self._fit_kv_heads()

    def _fit_kv_heads(self) -> None:
        """Offer only head counts the variant allows: N for MHA, 1 for MQA, the other divisors of N for GQA."""
        n = self._n_heads
        if self.attention.value == "mha":
            options = [n]
        elif self.attention.value == "mqa":
            options = [1]
        else:
            options = [k for k in divisors(n) if 1 < k < n] or divisors(n)
        current = self.kv_heads.value
        self.kv_heads.options = options
        self.kv_heads.value = current if current in options else options[0]
        self.kv_heads.disabled = len(options) == 1

    def _on_preset(self, _change) -> None:
        with self._hold():
            self._fit_to_preset()
        self._on_change(None)

    def _on_attention(self, _change) -> None:
        with self._hold():
            self._fit_kv_heads()
        self._on_change(None)

    def _on_change(self, _change) -> None:
        if not self._quiet:
            self.refresh()

    # Model --------------------------------------------------------------------------------------
    def config(self) -> dantinox.ModelConfig:
        """The model config the controls describe."""
        kv = self.kv_heads.value if self.attention.value == "gqa" else None
        return _config(self.preset.value, self.attention.value, kv, self.cache_dtype.value)

    def formula_params(self, cfg: dantinox.ModelConfig | None = None, batch: int | None = None,
                       tokens: int | None = None) -> dict[str, int]:
        """The science item's variables for a config (defaults: the current settings)."""
        cfg = self.config() if cfg is None else cfg
        return {"L": cfg.n_layers, "B": self.batch.value if batch is None else batch,
                "T": self.tokens.value if tokens is None else tokens, "H_kv": cfg.kv_heads,
                "d_h": cfg.head_size, "bytes": cfg.cache_itemsize}

    def derived_bytes(self, cfg: dantinox.ModelConfig, batch: int, tokens: int) -> int:
        """The content formula for a config: the derived cache size in bytes."""
        return self._evaluate(self.science, self.formula_params(cfg, batch, tokens))

    def per_token_bytes(self, cfg: dantinox.ModelConfig) -> int:
        """The content's per-token formula: bytes one more token adds to one sequence (ΔM)."""
        return self._evaluate(self.per_token_science, self.formula_params(cfg, 1, 1))

    def _evaluate(self, item: Any, params: dict[str, int]) -> int:
        value = content.evaluate(self.entry, item.title, **{k: v for k, v in params.items() if k in item.variables})
        if value != int(value):
            raise ValueError(f"{self.entry.id}.science[{item.title!r}]: expected a whole number of bytes, "
                             f"got {value}")
        return int(value)

    def measure(self, cfg: dantinox.ModelConfig, batch: int, tokens: int) -> tuple[int, str]:
        """Bytes of the real cache: allocated and measured under the budget, else from its shapes."""
        from_shapes = dantinox.tree_nbytes(dantinox.cache_shapes(cfg, batch, tokens))
        if from_shapes > self.budget_bytes:
            return from_shapes, "shapes"
        cache = dantinox.init_cache(cfg, batch, length=tokens)
        jax.block_until_ready(cache)
        measured = dantinox.tree_nbytes(cache)
        del cache  # drop the only reference: the buffers are freed now, not at the next refresh
        return measured, "arrays"

    # Refresh ------------------------------------------------------------------------------------
    def refresh(self) -> LabReading | None:
        """Recompute every readout; an error is shown in the lab (and kept in `.error`), never hidden."""
        try:
            reading = self._read()
        except Exception as err:  # noqa: BLE001 - shown on screen; the lab must survive any setting
            self.error = f"{type(err).__name__}: {err}" if not isinstance(err, ValueError) else str(err)
            self.status_html.value = error_box(self.error)
            return None
        self.error = ""
        self._render(reading)
        self.reading = reading
        return reading

    def _read(self) -> LabReading:
        cfg, B, T = self.config(), self.batch.value, self.tokens.value
        device = dantinox.DEVICE_PRESETS[self.device.value]
        measured, source = self.measure(cfg, B, T)
        weights = weight_bytes(cfg)
        return LabReading(
            cfg=cfg, batch=B, tokens=T, device=device, formula_params=self.formula_params(cfg, B, T),
            formula_bytes=self.derived_bytes(cfg, B, T), measured_bytes=measured, source=source,
            per_token_bytes=self.per_token_bytes(cfg), weight_bytes=weights,
            max_batch=dantinox.max_batch_size(cfg, device.memory_bytes, T, weight_bytes=weights))

    def _render(self, r: LabReading) -> None:
        fmt = dantinox.format_bytes
        item = self.science
        self.formula_html.value = (
            f"<b>{esc(item.title)}</b> {badge('derived', 'content formula')}"
            f"<div>$${esc(item.equation)}$$</div>"
            f"<div style='font-family:monospace'>= {esc(substitute(item.compute, r.formula_params))} "
            f"= {r.formula_bytes:,} B = {esc(fmt(r.formula_bytes))}</div>")
        if r.source == "arrays":
            how = badge("measured", "tree_nbytes of the allocated arrays (then freed)")
            self.status_html.value = ""
        else:
            how = badge("measured", "tree_nbytes of eval_shape(init_cache), nothing allocated")
            self.status_html.value = note_box(
                f"Memory guard: this cache ({esc(fmt(r.measured_bytes))}) is above the lab's allocation budget "
                f"({esc(fmt(self.budget_bytes))}), so its size comes from <code>jax.eval_shape</code> of the "
                f"same <code>init_cache</code> call; no array was allocated.")
        residual = f"{r.residual:,} B" if r.residual else "0 B"
        rows = [
            ("KV cache, formula", f"{r.formula_bytes:,} B ({fmt(r.formula_bytes)})", badge("derived")),
            (f"KV cache, {'real arrays' if r.source == 'arrays' else 'array shapes (not allocated)'}",
             f"{r.measured_bytes:,} B ({fmt(r.measured_bytes)})", how),
            ("residual (measured − formula)", residual, badge("measured", "minus derived")),
            ("growth per token, one sequence (ΔM)", f"{r.per_token_bytes:,} B ({fmt(r.per_token_bytes)})",
             badge("derived", f"content: {self.per_token_science.title}")),
            (f"weights ({r.cfg.dtype})", fmt(r.weight_bytes), badge("measured", "parameter shapes")),
            (f"largest batch at T={r.tokens:,} on {r.device.name}", f"{r.max_batch:,} sequences",
             badge("derived", "(memory − weights) // formula per sequence")),
        ]
        value_style = "text-align:right;font-family:monospace;white-space:nowrap"
        body = "".join(f"<tr><td style='min-width:220px'>{esc(a)}</td><td style='{value_style}'>{esc(b)}</td>"
                       f"<td>{c}</td></tr>" for a, b, c in rows)
        self.readout_html.value = f"<table>{body}</table>"


@functools.lru_cache(maxsize=256)
def _config(preset: str, attention: str, kv_heads: int | None, cache_dtype: str) -> dantinox.ModelConfig:
    return dantinox.ModelConfig.preset(preset, attention=attention, kv_heads=kv_heads, cache_dtype=cache_dtype)
