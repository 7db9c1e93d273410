"""The cache lab: controls for the cache's shape, and the formula set beside the bytes of real arrays.

    lab = CacheLab(content.load_entry("kv-cache"))
    lab.tokens.value = 512                # any control, as a learner would move it
    lab.reading.residual                  # measured - derived bytes: 0

The numbers come from `widgets.readings.read_kv_cache` (the entry's formulas, and `init_cache`'s arrays
measured under the allocation budget, else sized by `jax.eval_shape`); this widget only observes its
controls and renders that reading.
"""

from __future__ import annotations

import functools
from typing import Any

import ipywidgets as widgets
import traitlets

import dantinox
from dantinox.architectures.config import DTYPES, heads_fields
from widgets._controls import Lab
from widgets._html import badge, esc, formula_block, note_box, readout_table
from widgets.number_input import NumberInput
from widgets.readings import (
    DEFAULT_BUDGET,
    KV_PER_TOKEN,
    KV_SIZE,
    CacheReading,
    cache_formula_bytes,
    formula_params,
    read_kv_cache,
)


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def fit_kv_heads(control: widgets.Dropdown, attention: str, n_heads: int) -> None:
    """Offer only the KV-head counts a variant allows: N for MHA, 1 for MQA, the other divisors of N for GQA."""
    options = {"mha": [n_heads], "mqa": [1]}.get(attention) or \
        [k for k in divisors(n_heads) if 1 < k < n_heads] or divisors(n_heads)
    current = control.value
    control.options = options
    control.value = current if current in options else options[0]
    control.disabled = len(options) == 1


def measured_how(source: str) -> str:
    """The measured badge's detail: real arrays, or their shapes above the budget."""
    return ("tree_nbytes of the allocated arrays (then freed)" if source == "arrays" else
            "tree_nbytes of eval_shape(init_cache), nothing allocated")


def guard_note(source: str, nbytes: int, budget: int) -> str:
    """The memory-guard note shown when a cache was sized from shapes; empty when it was allocated."""
    if source == "arrays":
        return ""
    fmt = dantinox.format_bytes
    return note_box(f"Memory guard: this cache ({esc(fmt(nbytes))}) is above the lab's allocation budget "
                    f"({esc(fmt(budget))}), "
                    "so its size comes from <code>jax.eval_shape</code> of the same <code>init_cache</code> call; "
                    "no array was allocated.")


PRESET_LABELS = {"smollm2-135m": "SmolLM2-135M"}
PUBLISHED_K = {"smollm2-135m": 3}  # the KV heads of the published model a preset has the geometry of


# How dantinox.convert_attention makes each variant from a published GQA model (dantinox/architectures/convert.py).
CONVERTED = {"mha": "every KV head repeated for the query heads of its group: the same outputs (exact)",
             "mqa": "its KV heads mean-pooled into one (Ainslie et al., arXiv 2305.13245 §2.1): the outputs change"}


def what_if_note(preset: str, cfg: dantinox.ModelConfig) -> str:
    """A published model's geometry with another K than its own: the converted model's cache, or a what-if."""
    k = PUBLISHED_K.get(preset)
    if k is None or (cfg.variant, cfg.n_kv_heads) == ("gqa", k):
        return ""
    label = esc(PRESET_LABELS[preset])
    if cfg.variant in CONVERTED:
        call = f"dantinox.convert_attention(model, to={cfg.variant!r})"
        return note_box(f"Converted, not retrained: {label} has GQA with K={k}; these bytes are the cache of "
                        f"<code>{esc(call)}</code>, {esc(CONVERTED[cfg.variant])}. The MLA lab's real-model "
                        f"section shows what each conversion costs.")
    return note_box(f"What-if: {label} has GQA with K={k}; these bytes are its geometry with "
                    f"{esc(cfg.variant.upper())} K={cfg.n_kv_heads}, a model nobody trained.")


class CacheLab(Lab):
    """Sliders for T, B, attention variant, KV heads, cache dtype, model and device presets, with readouts."""

    ATTENTIONS = ("mha", "gqa", "mqa")
    CONTROLS = ("preset", "attention", "kv_heads", "cache_dtype", "device", "tokens", "batch")
    WORKING = ("building this setting's cache to measure it (a shape not seen yet is traced and allocated first, "
               "a second or more)")
    reading = traitlets.Instance(CacheReading, allow_none=True)

    def __init__(self, entry: Any, *, preset: str = "reference", tokens: int | None = None, batch: int = 1,
                 attention: str = "gqa", kv_heads: int | None = None, cache_dtype: str = "bfloat16",
                 device: str = "H100 80GB", budget_bytes: int = DEFAULT_BUDGET, max_batch_slider: int = 256):
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
            raise ValueError(f"budget_bytes: expected a non-negative integer, got {budget_bytes!r}")
        self.entry = entry
        self.science = entry.science_item(KV_SIZE)  # fail now, naming the entry, if a formula is missing
        self.per_token_science = entry.science_item(KV_PER_TOKEN)
        self.budget_bytes = budget_bytes
        style, layout = {"description_width": "150px"}, widgets.Layout(width="520px")
        self.preset = widgets.Dropdown(options=[(PRESET_LABELS.get(p, p), p) for p in dantinox.PRESETS],
                                       description="model preset", style=style, layout=layout)
        self.tokens = NumberInput(value=1, min=1, max=1, description="tokens T", unit="tokens", style=style,
                                  layout=layout)
        self.batch = NumberInput(value=1, min=1, max=max_batch_slider, description="concurrency B",
                                 unit="sequences", style=style, layout=layout)
        self.attention = widgets.ToggleButtons(options=list(self.ATTENTIONS), description="attention",
                                               style=style)
        self.kv_heads = widgets.Dropdown(description="KV heads K", style=style, layout=layout)
        self.cache_dtype = widgets.Dropdown(options=list(DTYPES), description="cache dtype", style=style,
                                            layout=layout)
        self.device = widgets.Dropdown(options=list(dantinox.DEVICE_PRESETS), description="device (batch calc)",
                                       style=style, layout=layout)
        self.formula_html = widgets.HTMLMath()
        self.readout_html = widgets.HTML()
        controls = [getattr(self, name) for name in ("preset", "tokens", "batch", "attention", "kv_heads",
                                                      "cache_dtype", "device")]
        super().__init__([*controls, status := widgets.HTML(), self.formula_html, self.readout_html], status)
        self.preset.observe(self._on_preset, names="value")
        self.attention.observe(self._on_attention, names="value")
        self.observe_controls(self.tokens, self.batch, self.kv_heads, self.cache_dtype, self.device)
        if tokens is None:  # half the context: room to slide both ways
            tokens = max(1, dantinox.ModelConfig.preset(preset).max_context // 2)
        with self.batched():
            self._set("preset", preset)
            self._fit_to_preset()  # also when `preset` is the dropdown's first option (no change event)
        self.update(attention=attention, kv_heads=kv_heads, cache_dtype=cache_dtype, device=device, tokens=tokens,
                    batch=batch)

    # Controls -----------------------------------------------------------------------------------
    def _fit_to_preset(self) -> None:
        """New preset: the token range follows max_context and the KV-head choices follow n_heads."""
        base = dantinox.ModelConfig.preset(self.preset.value)
        self.tokens.max = base.max_context  # the slider keeps its value inside its new range
        self._n_heads = base.n_heads
        self._fit_kv_heads()

    def _fit_kv_heads(self) -> None:
        fit_kv_heads(self.kv_heads, self.attention.value, self._n_heads)

    def _on_preset(self, _change) -> None:
        with self.batched():
            self._fit_to_preset()
        self._on_change()

    def _on_attention(self, _change) -> None:
        with self.batched():
            self._fit_kv_heads()
        self._on_change()

    # Model and formulas -------------------------------------------------------------------------
    def config(self) -> dantinox.ModelConfig:
        """The model config the controls describe."""
        return _config(self.preset.value, self.attention.value, self.kv_heads.value, self.cache_dtype.value)

    def formula_params(self) -> dict[str, float]:
        """The content's variables at the current settings (the quiz takes these)."""
        return formula_params(self.config(), self.batch.value, self.tokens.value)

    def derived_bytes(self, cfg: dantinox.ModelConfig, batch: int, tokens: int) -> int:
        """The entry's cache-size formula for any config: the derived bytes."""
        return cache_formula_bytes(self.entry, None, cfg, batch, tokens)

    # Reading and rendering ----------------------------------------------------------------------
    def _read(self) -> CacheReading:
        return read_kv_cache(self.entry, self.config(), self.batch.value, self.tokens.value,
                             device=self.device.value, budget=self.budget_bytes)

    def _render(self, r: CacheReading) -> None:
        fmt = dantinox.format_bytes
        self.formula_html.value = formula_block(self.science, r.formula_params, r.formula_bytes, fmt(r.formula_bytes))
        self.status_html.value = (guard_note(r.source, r.measured_bytes, self.budget_bytes)
                                  + what_if_note(self.preset.value, r.cfg))
        self.readout_html.value = readout_table([
            ("KV cache, formula", f"{r.formula_bytes:,} B ({fmt(r.formula_bytes)})", badge("derived")),
            (f"KV cache, {'real arrays' if r.source == 'arrays' else 'array shapes (not allocated)'}",
             f"{r.measured_bytes:,} B ({fmt(r.measured_bytes)})", badge("measured", measured_how(r.source))),
            ("residual (measured − formula)", f"{r.residual:,} B", badge("measured", "minus derived")),
            ("growth per token, one sequence (ΔM)", f"{r.per_token_bytes:,} B ({fmt(r.per_token_bytes)})",
             badge("derived", f"content: {self.per_token_science.title}")),
            (f"weights ({r.cfg.weights_dtype})", fmt(r.weight_bytes), badge("measured", "parameter shapes")),
            (f"largest batch at T={r.tokens:,} on {r.device.name}", f"{r.max_batch:,} sequences",
             badge("derived", "(memory − weights) // formula per sequence")),
        ])


@functools.lru_cache(maxsize=256)
def _config(preset: str, variant: str, kv_heads: int | None, cache_dtype: str) -> dantinox.ModelConfig:
    n_heads = dantinox.PRESETS[preset]["n_heads"]
    return dantinox.ModelConfig.preset(preset, **heads_fields(variant, n_heads, kv_heads), cache_dtype=cache_dtype)
