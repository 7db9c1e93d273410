"""The MLA lab: latent-cache sliders, the formula beside real arrays, MHA/GQA/MQA on the same plot.

    lab = MlaLab(content.load_entry("multi-head-latent-attention"))
    lab.latent.value = 128                # any control, as a learner would move it
    lab.reading.residual                  # measured - derived bytes: 0
    decode_path_agreement(16, 4)          # absorbed vs materialized logits, measured on a small model

Formulas come from content: the MLA entry's "MLA latent cache size", "Equivalent GQA KV heads" and
"MLA cache relative to MHA", and the kv-cache entry's "KV cache size" for the MHA/GQA/MQA peers. Bytes
are measured with `dantinox.tree_nbytes` of `dantinox.init_cache` (from `jax.eval_shape` above the budget).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ipywidgets as widgets
import jax
import jax.numpy as jnp
import numpy as np
import plotly.graph_objects as go
import traitlets
from flax import nnx

import content
import dantinox
from widgets._controls import QuietUpdates
from widgets._html import badge, error_box, esc, note_box
from widgets.cache_lab import substitute

DEFAULT_BUDGET = 256 * 2**20  # bytes; a larger cache is sized from shapes instead of allocated
MIB = 2**20
GRID_POINTS = 65


@dataclasses.dataclass(frozen=True)
class Peer:
    """One comparison cache of the same model size: derived from the kv-cache formula and measured."""

    label: str
    cfg: dantinox.ModelConfig
    formula_bytes: int  # derived: the kv-cache entry's formula
    measured_bytes: int  # measured: tree_nbytes of its cache
    source: str  # "arrays" | "shapes", as for the MLA cache
    layer_shape: tuple[int, ...]  # measured: shape of one layer's k (and v), from eval_shape of init_cache


@dataclasses.dataclass(frozen=True)
class MlaReading:
    """Everything one refresh of the MLA lab computed."""

    cfg: dantinox.ModelConfig  # the MLA model
    batch: int  # B
    tokens: int  # T
    formula_params: dict[str, int]  # every variable the MLA entry's science items use
    formula_bytes: int  # derived: MLA latent cache size
    measured_bytes: int  # measured: tree_nbytes of the MLA cache
    source: str  # "arrays" (allocated, measured, freed) | "shapes" (jax.eval_shape, nothing allocated)
    layer_shape: tuple[int, ...]  # measured: shape of one layer's LatentCache.ckv, from eval_shape of init_cache
    equivalent_kv_heads: float  # derived: (C + R) / (2 H)
    measured_kv_heads: float  # measured: MLA bytes / (MHA bytes per KV head)
    mha_fraction: float  # derived: (C + R) / (2 N H)
    peers: tuple[Peer, ...]  # MHA, GQA, MQA of the same model

    @property
    def residual(self) -> int:
        return self.measured_bytes - self.formula_bytes


class MlaLab(QuietUpdates, widgets.VBox):
    """Sliders for C, R, tokens and batch on a fixed model; readouts, the shapes cached, and a plot."""

    reading = traitlets.Instance(MlaReading, allow_none=True)
    error = traitlets.Unicode("")

    def __init__(self, entry: Any, kv_entry: Any = None, *, preset: str = "reference", latent: int = 64,
                 rope: int = 16, tokens: int | None = None, batch: int = 1, cache_dtype: str = "bfloat16",
                 gqa_kv_heads: int = 2, budget_bytes: int = DEFAULT_BUDGET):
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 1:
            raise ValueError(f"budget_bytes: expected a positive integer, got {budget_bytes!r}")
        self.entry = entry
        self.kv_entry = content.load_entry("kv-cache") if kv_entry is None else kv_entry
        for e, title in ((entry, "MLA latent cache size"), (entry, "Equivalent GQA KV heads"),
                         (entry, "MLA cache relative to MHA"), (self.kv_entry, "KV cache size")):
            e.science_item(title)  # fail now, naming the entry, if a formula is missing
        self.base = dantinox.ModelConfig.preset(preset, cache_dtype=cache_dtype)
        if self.base.n_heads % gqa_kv_heads or not 1 < gqa_kv_heads < self.base.n_heads:
            raise ValueError(f"gqa_kv_heads: expected a divisor of n_heads={self.base.n_heads} between 1 and "
                             f"{self.base.n_heads} exclusive, got {gqa_kv_heads!r}")
        self.gqa_kv_heads = gqa_kv_heads
        self.budget_bytes = budget_bytes
        self._quiet = False
        style, layout = {"description_width": "170px"}, widgets.Layout(width="520px")
        h = self.base.head_size
        self.latent = widgets.IntSlider(min=8, max=16 * h, step=8, description="latent width C", style=style,
                                        layout=layout)
        self.rope = widgets.IntSlider(min=2, max=4 * h, step=2, description="RoPE key width R", style=style,
                                      layout=layout)
        self.tokens = widgets.IntSlider(min=1, max=self.base.max_context, description="tokens T", style=style,
                                        layout=layout)
        self.batch = widgets.IntSlider(min=1, max=64, description="batch B", style=style, layout=layout)
        self.status_html = widgets.HTML()
        self.formula_html = widgets.HTMLMath()
        self.readout_html = widgets.HTML()
        self.figure = go.FigureWidget(layout=dict(
            height=400, margin=dict(l=60, r=20, t=70, b=50), hovermode="closest",
            xaxis=dict(title="tokens held per sequence (T)"), yaxis=dict(title="KV cache (MiB)"),
            legend=dict(orientation="h", y=-0.2)))
        self._lines_key = None
        super().__init__([self.latent, self.rope, self.tokens, self.batch, self.status_html, self.formula_html,
                          self.readout_html, self.figure])
        tokens = self.base.max_context // 2 if tokens is None else tokens  # room to slide both ways
        self.update(latent=latent, rope=rope, tokens=tokens, batch=batch)
        for control in (self.latent, self.rope, self.tokens, self.batch):
            control.observe(self._on_change, names="value")

    # Controls -----------------------------------------------------------------------------------
    def update(self, **values: Any) -> MlaReading | None:
        """Set several sliders at once (one refresh); out-of-range values raise instead of clamping."""
        names = ("latent", "rope", "tokens", "batch")
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise ValueError(f"update: unknown control(s) {', '.join(unknown)}; expected {', '.join(names)}")
        with self._hold():
            for name, value in values.items():
                control = getattr(self, name)
                if isinstance(value, bool) or not isinstance(value, int) or \
                        not control.min <= value <= control.max or (value - control.min) % control.step:
                    raise ValueError(f"{name}: expected an integer in [{control.min}, {control.max}] in steps of "
                                     f"{control.step}, got {value!r}")
                control.value = value
        return self.refresh()

    def _on_change(self, _change) -> None:
        if not self._quiet:
            self.refresh()

    # Model and formulas -------------------------------------------------------------------------
    def config(self) -> dantinox.ModelConfig:
        """The MLA model the sliders describe (same layers, heads and head size as the base preset)."""
        return self.base.replace(attention="mla", kv_latent_dim=self.latent.value, rope_head_dim=self.rope.value)

    def peer_configs(self) -> list[tuple[str, dantinox.ModelConfig]]:
        n, k = self.base.n_heads, self.gqa_kv_heads
        return [(f"MHA (K={n})", self.base.replace(attention="mha")),
                (f"GQA (K={k})", self.base.replace(attention="gqa", kv_heads=k)),
                ("MQA (K=1)", self.base.replace(attention="mqa"))]

    def formula_params(self) -> dict[str, int]:
        """The variables of the MLA entry's formulas at the current settings (the quiz takes these too)."""
        cfg = self.base
        return {"L": cfg.n_layers, "B": self.batch.value, "T": self.tokens.value, "C": self.latent.value,
                "R": self.rope.value, "bytes": cfg.cache_itemsize, "d_h": cfg.head_size, "N": cfg.n_heads}

    def _evaluate(self, entry: Any, title: str, params: dict[str, Any]) -> float:
        item = entry.science_item(title)
        return content.evaluate(entry, title, **{k: v for k, v in params.items() if k in item.variables})

    def derived_bytes(self, cfg: dantinox.ModelConfig, batch: int, tokens: int) -> int:
        """The content formula for any variant: MLA's latent formula, or the kv-cache formula for K heads."""
        if cfg.attention == "mla":
            value = self._evaluate(self.entry, "MLA latent cache size", dict(
                L=cfg.n_layers, B=batch, T=tokens, C=cfg.kv_latent_dim, R=cfg.rope_head_dim,
                bytes=cfg.cache_itemsize))
        else:
            value = self._evaluate(self.kv_entry, "KV cache size", dict(
                L=cfg.n_layers, B=batch, T=tokens, H_kv=cfg.kv_heads, d_h=cfg.head_size, bytes=cfg.cache_itemsize))
        if value != int(value):
            raise ValueError(f"science: expected a whole number of bytes, got {value}")
        return int(value)

    def measure(self, cfg: dantinox.ModelConfig, batch: int, tokens: int) -> tuple[int, str]:
        """Bytes of the real cache: allocated and measured under the budget, else from its shapes."""
        from_shapes = dantinox.tree_nbytes(dantinox.cache_shapes(cfg, batch, tokens))
        if from_shapes > self.budget_bytes:
            return from_shapes, "shapes"
        cache = jax.block_until_ready(dantinox.init_cache(cfg, batch, length=tokens))
        measured = dantinox.tree_nbytes(cache)
        del cache  # the only reference: freed now, not at the next refresh
        return measured, "arrays"

    # Refresh ------------------------------------------------------------------------------------
    def refresh(self) -> MlaReading | None:
        """Recompute every readout; an error is shown in the lab (and kept in `.error`), never hidden."""
        try:
            reading = self._read()
        except Exception as err:  # noqa: BLE001 - shown on screen; the lab must survive any setting
            self.error = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
            self.status_html.value = error_box(self.error)
            return None
        self.error = ""
        self._render(reading)
        self._plot(reading)
        self.reading = reading
        return reading

    def _read(self) -> MlaReading:
        cfg, B, T = self.config(), self.batch.value, self.tokens.value
        params = self.formula_params()
        measured, source = self.measure(cfg, B, T)
        peers = tuple(Peer(label, c, self.derived_bytes(c, B, T), *self.measure(c, B, T), layer_shape(c, B, T))
                      for label, c in self.peer_configs())
        mha = peers[0].measured_bytes
        return MlaReading(
            cfg=cfg, batch=B, tokens=T, formula_params=params, formula_bytes=self.derived_bytes(cfg, B, T),
            measured_bytes=measured, source=source, layer_shape=layer_shape(cfg, B, T),
            equivalent_kv_heads=self._evaluate(self.entry, "Equivalent GQA KV heads", params),
            measured_kv_heads=measured / (mha / self.base.n_heads),
            mha_fraction=self._evaluate(self.entry, "MLA cache relative to MHA", params), peers=peers)

    def _render(self, r: MlaReading) -> None:
        fmt = dantinox.format_bytes
        item = self.entry.science_item("MLA latent cache size")
        shown = {k: r.formula_params[k] for k in item.variables}
        self.formula_html.value = (
            f"<b>{esc(item.title)}</b> {badge('derived', 'content formula')}"
            f"<div>$${esc(item.equation)}$$</div>"
            f"<div style='font-family:monospace'>= {esc(substitute(item.compute, shown))} "
            f"= {r.formula_bytes:,} B = {esc(fmt(r.formula_bytes))}</div>")
        how = ("tree_nbytes of the allocated arrays (then freed)" if r.source == "arrays" else
               "tree_nbytes of eval_shape(init_cache), nothing allocated")
        self.status_html.value = "" if r.source == "arrays" else note_box(
            f"Memory guard: this cache is above the lab's allocation budget ({esc(fmt(self.budget_bytes))}), so "
            f"its size comes from <code>jax.eval_shape</code> of the same <code>init_cache</code> call.")
        C, R, H, N = r.cfg.kv_latent_dim, r.cfg.rope_head_dim, r.cfg.head_size, r.cfg.n_heads
        rows = [
            ("MLA cache, formula", f"{r.formula_bytes:,} B ({fmt(r.formula_bytes)})", badge("derived")),
            (f"MLA cache, {'real arrays' if r.source == 'arrays' else 'array shapes (not allocated)'}",
             f"{r.measured_bytes:,} B ({fmt(r.measured_bytes)})", badge("measured", how)),
            ("residual (measured − formula)", f"{r.residual:,} B", badge("measured", "minus derived")),
            (f"what one layer stores: LatentCache.ckv [B, T, C + R], {r.cfg.cache_dtype}", str(list(r.layer_shape)),
             badge("measured", "shape from eval_shape(init_cache)")),
            *[(f"{p.label}, {'real arrays' if p.source == 'arrays' else 'shapes (not allocated)'}: k and v "
               f"{list(p.layer_shape)} per layer", f"{p.measured_bytes:,} B ({fmt(p.measured_bytes)})",
               badge("measured", f"formula {p.formula_bytes:,} B"))
              for p in r.peers],
            (f"GQA KV heads holding as much (head size {H})", f"({C} + {R}) / (2·{H}) = {r.equivalent_kv_heads:g}",
             badge("derived", "content: Equivalent GQA KV heads")),
            (f"the same from the arrays: MLA bytes / (MHA bytes / {N})", f"{r.measured_kv_heads:g}",
             badge("measured")),
            ("fraction of the MHA cache", f"{r.mha_fraction:.2%}", badge("derived", "content: MLA cache relative "
                                                                             "to MHA")),
        ]
        value_style = "text-align:right;font-family:monospace;white-space:nowrap"
        body = "".join(f"<tr><td style='min-width:220px'>{esc(a)}</td><td style='{value_style}'>{esc(b)}</td>"
                       f"<td>{c}</td></tr>" for a, b, c in rows)
        self.readout_html.value = (
            f"<div><b>MLA with C={C}, R={R} stores as much as GQA with {r.equivalent_kv_heads:g} KV heads of "
            f"size {H}</b> ({N} query heads either way).</div><table>{body}</table>")

    def _plot(self, r: MlaReading) -> None:
        """Derived lines (content formulas) over T for MLA and its peers; measured dots at the current T."""
        variants = [(f"MLA (C={r.cfg.kv_latent_dim}, R={r.cfg.rope_head_dim})", r.cfg, r.measured_bytes, r.source),
                    *[(p.label, p.cfg, p.measured_bytes, p.source) for p in r.peers]]
        key = (r.cfg, r.batch)
        traces = []
        if key != self._lines_key:
            grid = np.unique(np.linspace(1, self.base.max_context, GRID_POINTS).round().astype(int))
            for i, (label, cfg, _, _) in enumerate(variants):
                y = [self.derived_bytes(cfg, r.batch, int(t)) for t in grid]
                traces.append(dict(x=grid.tolist(), y=[b / MIB for b in y], customdata=y, mode="lines",
                                   name=f"{label}, derived", line=dict(width=3.5 if i == 0 else 1.5,
                                                                       dash="solid" if i == 0 else "dash"),
                                   hovertemplate=f"{label}<br>T=%{{x}}<br>%{{customdata:,}} B (derived)"
                                                 "<extra></extra>"))
        how = {"arrays": "real arrays", "shapes": "eval_shape, not allocated"}
        dots = dict(x=[r.tokens] * len(variants), y=[b / MIB for _, _, b, _ in variants],
                    customdata=[[label, b, how[src]] for label, _, b, src in variants], mode="markers",
                    name="measured at the current T (● real arrays, × eval_shape above the budget)",
                    marker=dict(size=10, color="black",
                                symbol=["circle" if src == "arrays" else "x" for *_, src in variants]),
                    hovertemplate="%{customdata[0]}<br>T=%{x}<br>%{customdata[1]:,} B (measured, %{customdata[2]})"
                                  "<extra></extra>")
        fig = self.figure
        if not fig.data:
            fig.add_traces([go.Scatter(**t) for t in [*traces, dots]])
        with fig.batch_update():
            for old, new in zip(fig.data[-len(traces) - 1:], [*traces, dots], strict=True):
                old.update(new)
            fig.layout.title.text = (
                f"KV cache vs tokens, {self.base.n_layers} layers, {self.base.n_heads} heads of {self.base.head_size},"
                f" B={r.batch}, {self.base.cache_dtype}<br><sup>lines: derived from the content formulas · dots: "
                f"measured</sup>")
        self._lines_key = key


def layer_shape(cfg: dantinox.ModelConfig, batch: int, tokens: int) -> tuple[int, ...]:
    """The shape of layer 0's first cache array (ckv for MLA, k otherwise), without allocating it."""
    return tuple(dantinox.cache_shapes(cfg, batch, tokens)[0][0].shape)


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
            cfg = dantinox.ModelConfig.preset(preset, attention="mla", kv_latent_dim=latent, rope_head_dim=rope,
                                              mla_decode=path, mla_rope_on_latent=on_latent)
            if tokens > cfg.max_context:
                raise ValueError(f"tokens: expected at most max_context={cfg.max_context}, got {tokens}")
            model = dantinox.Transformer(cfg, rngs=nnx.Rngs(seed))
            full, _, _ = model(ids)
            half = tokens // 2
            steps, cache, _ = model(ids[:, :half], use_cache=True, kv_caches=dantinox.init_cache(cfg, 2))
            pieces = [steps]
            for t in range(half, tokens):
                step, cache, _ = model(ids[:, t:t + 1], use_cache=True, kv_caches=cache, cache_index=t)
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
