"""The mesh lab: which device holds which sequences and KV heads, and how many cache bytes, measured.

    reading = read_mesh(cfg, (2, 4), batch=8, context=256)   # allocates the sharded cache, measures each device
    lab = MeshLab()                                           # needs several devices: see labs/mesh.ipynb
    lab.update(mesh_shape="2×4", kv_heads=2)

The cache is placed exactly as `dantinox.generate(..., mesh=mesh)` places it (dantinox.sharding); bytes
per device are summed from each array's addressable shards, beside the formula total / (data · min(model, K)).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ipywidgets as widgets
import jax
import traitlets

import dantinox
from dantinox import sharding
from widgets._controls import Lab
from widgets._html import badge, esc, note_box
from widgets.cache_lab import divisors

BUDGET = 256 * 2**20  # bytes: a larger cache is sized from its shard shapes instead of allocated


@dataclasses.dataclass(frozen=True)
class MeshReading:
    cfg: dantinox.ModelConfig
    shape: tuple[int, int]  # (data, model)
    batch: int
    context: int
    layout: sharding.MeshPlan
    holdings: tuple[dict[str, Any], ...]  # per device: sequences, heads, replica (derived from the layout)
    device_bytes: dict[int, int]  # per device id: measured from addressable shards, or shard shapes
    source: str  # "arrays" (allocated and measured) | "shapes" (shard shapes, nothing allocated)
    total_bytes: int  # the whole cache, one copy (dantinox.kv_cache_bytes)

    @property
    def formula_bytes(self) -> int:
        """total / (data · min(model, K)): one device's share."""
        return self.total_bytes // (self.layout.data * self.layout.heads_split)


def mesh_shapes(devices: int) -> list[tuple[int, int]]:
    """Every (data, model) whose product is the device count."""
    return [(d, devices // d) for d in divisors(devices)]


def read_mesh(cfg: dantinox.ModelConfig, shape: tuple[int, int], batch: int, context: int,
              budget: int = BUDGET) -> MeshReading:
    """Place a cache of `batch` × `context` tokens on a (data, model) mesh as generate() does, and measure it."""
    if shape[0] * shape[1] > jax.device_count():
        raise ValueError(f"mesh_shape: {shape[0]}×{shape[1]} needs {shape[0] * shape[1]} devices, this kernel has "
                         f"{jax.device_count()}")
    mesh = jax.make_mesh(shape, sharding.AXES, devices=jax.devices()[: shape[0] * shape[1]])
    layout = sharding.plan(cfg, mesh, batch)
    total = dantinox.kv_cache_bytes(cfg, batch, context)
    if total > budget:
        spec = jax.sharding.NamedSharding(layout.mesh, sharding.cache_spec(cfg))
        per = 0
        for leaf in jax.tree.leaves(dantinox.cache_shapes(cfg, batch, context).layers):
            n = 1
            for dim in spec.shard_shape(leaf.shape):
                n *= dim
            per += n * leaf.dtype.itemsize
        measured, source = {d.id: per for d in layout.mesh.devices.flat}, "shapes"
    else:
        caches = sharding.shard_cache(dantinox.init_cache(cfg, batch, context), cfg, layout)
        measured, source = sharding.device_bytes(jax.block_until_ready(caches)), "arrays"
        del caches  # freed now, not at the next reading
    return MeshReading(cfg=cfg, shape=tuple(shape), batch=batch, context=context, layout=layout,
                       holdings=tuple(sharding.holdings(cfg, layout, batch)), device_bytes=measured, source=source,
                       total_bytes=total)


def _span(r: range) -> str:
    return f"{r.start}" if len(r) == 1 else f"{r.start}–{r.stop - 1}"


class MeshLab(Lab):
    """Controls for the mesh shape, KV heads, batch and context; a per-device table of what each holds."""

    CONTROLS = ("mesh_shape", "kv_heads", "batch", "context")
    reading = traitlets.Instance(MeshReading, allow_none=True)

    def __init__(self, *, preset: str = "reference", mesh_shape: str | None = None, kv_heads: int = 2,
                 batch: int = 8, context: int = 256, cache_dtype: str = "bfloat16"):
        self.base = dantinox.ModelConfig.preset(preset, cache_dtype=cache_dtype)
        shapes = {f"{d}×{m}": (d, m) for d, m in mesh_shapes(jax.device_count())}
        style, layout = {"description_width": "150px"}, widgets.Layout(width="520px")
        self._shapes = shapes
        self.mesh_shape = widgets.Dropdown(options=list(shapes), description="mesh data × model", style=style,
                                           layout=layout)
        self.kv_heads = widgets.Dropdown(options=divisors(self.base.n_heads), description="KV heads K", style=style,
                                         layout=layout)
        self.batch = widgets.IntSlider(min=1, max=64, description="batch B", style=style, layout=layout)
        self.context = widgets.IntSlider(min=1, max=self.base.max_context, description="context T", style=style,
                                         layout=layout)
        self.table_html = widgets.HTML()
        controls = [self.mesh_shape, self.kv_heads, self.batch, self.context]
        super().__init__([*controls, status := widgets.HTML(), self.table_html], status)
        self.observe_controls(*controls)
        self.update(mesh_shape=mesh_shape or list(shapes)[len(shapes) // 2], kv_heads=kv_heads, batch=batch,
                    context=context)

    def config(self) -> dantinox.ModelConfig:
        return self.base.replace(kv_heads=self.kv_heads.value)

    def _read(self) -> MeshReading:
        return read_mesh(self.config(), self._shapes[self.mesh_shape.value], self.batch.value, self.context.value)

    def refresh(self) -> MeshReading | None:
        """Recompute and redraw; a setting that fails shows its error and no table (the last one would be stale)."""
        reading = super().refresh()
        if reading is None:
            self.table_html.value = ""
        return reading

    def _render(self, r: MeshReading) -> None:
        fmt = dantinox.format_bytes
        k = r.cfg.n_kv_heads
        notes = []
        if r.layout.replicated:
            notes.append(f"The model axis ({r.layout.model}) is larger than K = {k}: the heads cannot be cut "
                         f"further, so each KV head is held by {r.layout.replicas} devices (replicated): more "
                         f"devices on the model axis than KV heads no longer shrinks each device's cache.")
        if r.source == "shapes":
            notes.append(f"This cache ({esc(fmt(r.total_bytes))}) is above the lab's allocation budget, so the "
                         "per-device bytes come from the sharding's shard shapes; nothing was allocated.")
        self.status_html.value = note_box("<br>".join(notes)) if notes else ""
        how = badge("measured", "addressable shards" if r.source == "arrays" else "shard shapes, not allocated")
        rows = "".join(
            f"<tr><td>{h['device']}</td><td>{_span(h['sequences'])}</td><td>{_span(h['heads'])}</td>"
            f"<td style='text-align:right;font-family:monospace'>{r.device_bytes[h['device']]:,} B</td></tr>"
            for h in r.holdings)
        self.table_html.value = (
            f"<table><tr><th>device</th><th>sequences</th><th>KV heads</th><th>cache bytes {how}</th></tr>{rows}"
            f"</table><div>whole cache {r.total_bytes:,} B ({esc(fmt(r.total_bytes))}) "
            f"{badge('derived', 'L · 2 · B · T · K · H · bytes')}; one device's share by the formula: "
            f"{r.total_bytes:,} / ({r.layout.data} · min({r.layout.model}, {k})) = {r.formula_bytes:,} B "
            f"{badge('derived')}</div>")
