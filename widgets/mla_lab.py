"""The MLA lab: latent-cache sliders, the formula beside real arrays, MHA/GQA/MQA on the same plot.

    lab = MlaLab(content.load_entry("multi-head-latent-attention"))
    lab.latent.value = 128                # any control, as a learner would move it
    lab.reading.residual                  # measured - derived bytes: 0
    decode_path_agreement(16, 4)          # absorbed vs materialized logits, measured on a small model

The numbers come from `widgets.readings.read_mla_cache`: the MLA entry's "MLA latent cache size",
"Equivalent GQA KV heads" and "MLA cache relative to MHA", the kv-cache entry's "KV cache size" for the
MHA/GQA/MQA peers, and the arrays of `dantinox.init_cache` (from `jax.eval_shape` above the budget). This
widget observes its sliders and renders that reading; its plot is a `CachePlot`.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as widgets
import jax.numpy as jnp
import numpy as np
import traitlets
from flax import nnx

import content
import dantinox
from widgets._controls import Lab
from widgets._html import badge, formula_block, readout_table
from widgets.cache_lab import guard_note, measured_how
from widgets.number_input import NumberInput
from widgets.plot import CachePlot
from widgets.readings import (
    DEFAULT_BUDGET,
    KV_SIZE,
    MLA_EQUIVALENT_HEADS,
    MLA_FRACTION,
    MLA_SIZE,
    MlaReading,
    cache_formula_bytes,
    formula_params,
    peer_configs,
    read_mla_cache,
)


def mla_and_peers(reading: MlaReading) -> list[dantinox.ModelConfig]:
    """The plot's lines: the MLA cache, then its MHA, GQA and MQA peers."""
    return [reading.cfg, *(p.cfg for p in reading.peers)]


class MlaLab(Lab):
    """Sliders for C, R, tokens and batch on a fixed model; readouts, the shapes cached, and a plot."""

    CONTROLS = ("latent", "rope", "tokens", "batch")
    WORKING = ("building the latent cache and its MHA, GQA and MQA peers to measure them (shapes not seen yet are "
               "traced and allocated first, a second or more)")
    reading = traitlets.Instance(MlaReading, allow_none=True)

    def __init__(self, entry: Any, kv_entry: Any = None, *, preset: str = "reference", latent: int = 64,
                 rope: int = 16, tokens: int | None = None, batch: int = 1, cache_dtype: str = "bfloat16",
                 gqa_kv_heads: int = 2, budget_bytes: int = DEFAULT_BUDGET):
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
            raise ValueError(f"budget_bytes: expected a non-negative integer, got {budget_bytes!r}")
        self.entry = entry
        self.kv_entry = content.load_entry("kv-cache") if kv_entry is None else kv_entry
        for e, title in ((entry, MLA_SIZE), (entry, MLA_EQUIVALENT_HEADS), (entry, MLA_FRACTION),
                         (self.kv_entry, KV_SIZE)):
            e.science_item(title)  # fail now, naming the entry, if a formula is missing
        self.base = dantinox.ModelConfig.preset(preset, cache_dtype=cache_dtype)
        peer_configs(self.base, gqa_kv_heads)  # refuses a K that is not a proper divisor of N
        self.gqa_kv_heads = gqa_kv_heads
        self.budget_bytes = budget_bytes
        style, layout = {"description_width": "170px"}, widgets.Layout(width="520px")
        h = self.base.head_size
        self.latent = NumberInput(value=8, min=8, max=16 * h, step=8, description="latent width C",
                                  unit="elements", style=style, layout=layout)
        self.rope = NumberInput(value=2, min=2, max=4 * h, multiple_of=2, description="RoPE key width R",
                                unit="elements", style=style, layout=layout)  # RoPE rotates pairs of channels
        self.tokens = NumberInput(value=1, min=1, max=self.base.max_context, description="tokens T", unit="tokens",
                                  style=style, layout=layout)
        self.batch = NumberInput(value=1, min=1, max=64, description="batch B", unit="sequences", style=style,
                                 layout=layout)
        self.formula_html = widgets.HTMLMath()
        self.readout_html = widgets.HTML()
        status = widgets.HTML()
        super().__init__([self.latent, self.rope, self.tokens, self.batch, status, self.formula_html,
                          self.readout_html], status)
        self.plot = CachePlot(self, variants=mla_and_peers)
        self.figure = self.plot.figure
        self.children = (*self.children, self.plot)
        self.observe_controls(self.latent, self.rope, self.tokens, self.batch)
        tokens = self.base.max_context // 2 if tokens is None else tokens  # room to slide both ways
        self.update(latent=latent, rope=rope, tokens=tokens, batch=batch)

    # Model and formulas -------------------------------------------------------------------------
    def config(self) -> dantinox.ModelConfig:
        """The MLA model the sliders describe (same layers, heads and head size as the base preset)."""
        return self.base.replace(attention="latent", kv_heads=None, kv_latent_dim=self.latent.value,
                                 rope_head_dim=self.rope.value)

    def formula_params(self) -> dict[str, float]:
        """The content's variables at the current settings (the quiz takes these)."""
        return formula_params(self.config(), self.batch.value, self.tokens.value)

    def derived_bytes(self, cfg: dantinox.ModelConfig, batch: int, tokens: int) -> int:
        """The content formula for any variant: MLA's latent formula, or the kv-cache formula for K heads."""
        return cache_formula_bytes(self.kv_entry, self.entry, cfg, batch, tokens)

    # Reading and rendering ----------------------------------------------------------------------
    def _read(self) -> MlaReading:
        return read_mla_cache(self.entry, self.kv_entry, self.config(), self.batch.value, self.tokens.value,
                              gqa_kv_heads=self.gqa_kv_heads, budget=self.budget_bytes)

    def _render(self, r: MlaReading) -> None:
        fmt = dantinox.format_bytes
        self.formula_html.value = formula_block(self.entry.science_item(MLA_SIZE), r.formula_params,
                                                r.formula_bytes, fmt(r.formula_bytes))
        self.status_html.value = guard_note(r.source, r.measured_bytes, self.budget_bytes)
        C, R, H, N = r.cfg.kv_latent_dim, r.cfg.rope_head_dim, r.cfg.head_size, r.cfg.n_heads
        shapes = "; ".join(f"{k} {list(v)}" for k, v in r.layer_shapes.items())
        table = readout_table([
            ("MLA cache, formula", f"{r.formula_bytes:,} B ({fmt(r.formula_bytes)})", badge("derived")),
            (f"MLA cache, {'real arrays' if r.source == 'arrays' else 'array shapes (not allocated)'}",
             f"{r.measured_bytes:,} B ({fmt(r.measured_bytes)})", badge("measured", measured_how(r.source))),
            ("residual (measured − formula)", f"{r.residual:,} B", badge("measured", "minus derived")),
            (f"what one layer stores: LatentCache [B, T, C + R], {r.cfg.cache_dtype}", shapes,
             badge("measured", "shape from eval_shape(init_cache)")),
            *[(f"{p.label}, {'real arrays' if p.source == 'arrays' else 'shapes (not allocated)'}: "
               + "; ".join(f"{k} {list(v)}" for k, v in p.layer_shapes.items()) + " per layer",
               f"{p.measured_bytes:,} B ({fmt(p.measured_bytes)})", badge("measured", f"formula {p.formula_bytes:,} B"))
              for p in r.peers],
            (f"GQA KV heads holding as much (head size {H})", f"({C} + {R}) / (2·{H}) = {r.equivalent_kv_heads:g}",
             badge("derived", f"content: {MLA_EQUIVALENT_HEADS}")),
            (f"the same from the arrays: MLA bytes / (MHA bytes / {N})", f"{r.measured_kv_heads:g}",
             badge("measured")),
            ("fraction of the MHA cache", f"{r.mha_fraction:.2%}", badge("derived", f"content: {MLA_FRACTION}")),
        ])
        self.readout_html.value = (
            f"<div><b>MLA with C={C}, R={R} stores as much as GQA with {r.equivalent_kv_heads:g} KV heads of "
            f"size {H}</b> ({N} query heads either way).</div>{table}")


def decode_path_agreement(latent: int, rope: int, *, tokens: int = 24, preset: str = "test",
                          seed: int = 0) -> list[dict[str, Any]]:
    """Max |logit difference| between the absorbed and materialized paths, both RoPE placements, measured.

    Builds the same small MLA model twice per placement (the decode path adds no parameters) and compares
    a full forward pass, and a prefill + one-token-at-a-time cached decode, of the same random tokens.
    """
    ids = np.random.RandomState(seed).randint(0, 256, (2, tokens)).astype(np.int32)
    rows = []
    for on_latent in (False, True):
        logits = {}
        for path in ("absorbed", "materialized"):
            cfg = dantinox.ModelConfig.preset(preset, attention="latent", kv_latent_dim=latent, rope_head_dim=rope,
                                              mla_decode=path, mla_rope_on_latent=on_latent)
            if tokens > cfg.max_context:
                raise ValueError(f"tokens: expected at most max_context={cfg.max_context}, got {tokens}")
            model = dantinox.Transformer(cfg, rngs=nnx.Rngs(seed))  # its call compiles one program per shape
            full, _, _ = model(ids)
            half = tokens // 2
            steps, cache, _ = model(ids[:, :half], use_cache=True, kv_caches=dantinox.init_cache(cfg, 2))
            pieces = [steps]
            for t in range(half, tokens):  # one token at a time; the cache's fill says where it goes
                step, cache, _ = model(ids[:, t:t + 1], use_cache=True, kv_caches=cache)
                pieces.append(step)
            logits[path] = (full, jnp.concatenate(pieces, axis=1))
        (a_full, a_cached), (m_full, m_cached) = logits["absorbed"], logits["materialized"]
        rows.append({"rope": "on the compressed keys (teaching switch)" if on_latent else "decoupled key (DeepSeek-V2)",
                     "rope_on_latent": on_latent,
                     "paths_full": float(jnp.abs(a_full - m_full).max()),
                     "paths_cached": float(jnp.abs(a_cached - m_cached).max()),
                     "cache_vs_full": max(float(jnp.abs(a_cached - a_full).max()),
                                          float(jnp.abs(m_cached - m_full).max())),
                     "logit_scale": float(jnp.abs(m_full).max())})
    return rows
