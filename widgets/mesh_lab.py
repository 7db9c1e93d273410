"""The mesh lab: which device holds which sequences and KV heads, and how many cache bytes, measured.

    reading = read_mesh(cfg, (2, 4), batch=8, context=256)   # allocates the sharded cache, measures each device
    lab = MeshLab()                                           # needs several devices: see labs/mesh.ipynb
    lab.update(mesh_shape="2×4", kv_heads=2)

The cache is placed exactly as `dantinox.generate(..., mesh=mesh)` places it (dantinox.generation.sharding); bytes
per device are summed from each array's addressable shards, beside the formula total / (data · min(model, K)).
The device grid draws, for every device of the mesh, which sequences and KV heads of the cache it holds, read
from the shard indices of the allocated arrays (or, above the allocation budget, from the sharding's map).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ipywidgets as widgets
import jax
import traitlets

import dantinox
from dantinox.generation import sharding
from widgets._controls import Lab
from widgets._html import badge, esc, note_box
from widgets.cache_lab import divisors
from widgets.number_input import NumberInput
from widgets.readings import formula_params

BUDGET = 256 * 2**20  # bytes: a larger cache is sized from its shard shapes instead of allocated
HEAD_COLOURS = ("#42a5f5", "#ef5350", "#66bb6a", "#ffa726", "#ab47bc", "#26a69a", "#8d6e63", "#ec407a")


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
    grid: tuple[tuple[int, ...], ...] = ()  # device ids as the mesh arranges them: data rows × model columns
    placement: dict[int, tuple[range, range]] = dataclasses.field(default_factory=dict)  # id -> (sequences, heads)

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
    spec = jax.sharding.NamedSharding(layout.mesh, sharding.cache_spec(cfg))
    first = jax.tree.leaves(dantinox.cache_shapes(cfg, batch, context).layers)[0]  # layer 0's keys [B, K, H, S]
    if total > budget:
        per = 0
        for leaf in jax.tree.leaves(dantinox.cache_shapes(cfg, batch, context).layers):
            n = 1
            for dim in spec.shard_shape(leaf.shape):
                n *= dim
            per += n * leaf.dtype.itemsize
        measured, source = {d.id: per for d in layout.mesh.devices.flat}, "shapes"
        index = {d.id: i for d, i in spec.devices_indices_map(first.shape).items()}
    else:
        caches = sharding.shard_cache(dantinox.init_cache(cfg, batch, context), cfg, layout)
        measured, source = sharding.device_bytes(jax.block_until_ready(caches)), "arrays"
        index = {s.device.id: s.index for s in jax.tree.leaves(caches.layers)[0].addressable_shards}
        del caches  # freed now, not at the next reading
    heads_axis = None if cfg.attention == "latent" else 1  # the latent cache has no head axis: one shared "head"
    placement = {d: (range(*i[0].indices(first.shape[0])),
                     range(*i[heads_axis].indices(first.shape[heads_axis])) if heads_axis else range(1))
                 for d, i in index.items()}
    return MeshReading(cfg=cfg, shape=tuple(shape), batch=batch, context=context, layout=layout,
                       holdings=tuple(sharding.holdings(cfg, layout, batch)), device_bytes=measured, source=source,
                       total_bytes=total, grid=tuple(tuple(int(d.id) for d in row) for row in mesh.devices),
                       placement=placement)


def device_grid_html(r: MeshReading) -> str:
    """The mesh as a grid of devices; each shows the whole cache (rows: sequences, columns: KV heads) with the
    part it holds filled in, coloured by its heads, so devices holding the same heads share a colour."""
    B, K = r.batch, 1 if r.cfg.attention == "latent" else r.cfg.n_kv_heads
    model = r.shape[1]
    cells = ["<div></div>"] + [f"<div style='text-align:center;font-size:85%'>model {c}</div>" for c in range(model)]
    for row, ids in enumerate(r.grid):
        cells.append(f"<div style='font-size:85%;align-self:center'>data {row}</div>")
        for device in ids:
            seqs, heads = r.placement[device]
            colour = HEAD_COLOURS[(heads.start * len(HEAD_COLOURS) // K) % len(HEAD_COLOURS)]
            box = (f"position:absolute;top:{100 * seqs.start / B:.4g}%;height:{100 * len(seqs) / B:.4g}%;"
                   f"left:{100 * heads.start / K:.4g}%;width:{100 * len(heads) / K:.4g}%;background:{colour}")
            cells.append(
                f"<div class='mesh-device' data-device='{device}' style='border:1px solid #90a4ae;border-radius:4px;"
                f"padding:3px;font-size:80%;min-width:0'><b>device {device}</b>"
                f"<div style='position:relative;height:48px;background:#eceff1;border:1px solid #b0bec5;"
                f"margin:2px 0' title='the whole cache: {B} sequences (rows) × {K} KV heads (columns)'>"
                f"<div style='{box}'></div></div>sequences {_span(seqs)}<br>heads {_span(heads)}<br>"
                f"<span style='font-family:monospace'>{r.device_bytes[device]:,} B</span></div>")
    how = (badge("measured", "shard indices of the allocated cache arrays") if r.source == "arrays" else
           badge("derived", "the sharding's index map; nothing allocated"))
    return (f"<div><b>Which device holds which part of the cache</b> {how}</div>"
            f"<div style='font-size:85%;margin:2px 0 4px 0'>Each box is the whole cache of one layer as one device "
            f"sees it: {B} sequences down, {K} KV heads across; the filled part is what that device stores. "
            f"The data axis splits the sequences; the model axis splits the heads, and past K it copies them "
            f"(devices with the same colour hold the same heads). Every layer is split the same way.</div>"
            f"<div style='display:grid;grid-template-columns:auto repeat({model}, minmax(0, 1fr));gap:4px;"
            f"max-width:{120 * model + 60}px'>{''.join(cells)}</div>")


def _span(r: range) -> str:
    return f"{r.start}" if len(r) == 1 else f"{r.start}–{r.stop - 1}"


BATCH_MAX = 64


class MeshLab(Lab):
    """Controls for the mesh shape, KV heads, batch and context; a device grid and a table of what each holds."""

    CONTROLS = ("mesh_shape", "kv_heads", "batch", "context")
    WORKING = ("placing this setting's cache on the mesh to measure each device's share (a shape or mesh not seen "
               "yet is traced and allocated first, a second or more)")
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
        self.batch = NumberInput(value=1, min=1, max=64, description="batch B", unit="sequences", style=style,
                                 layout=layout)
        self.context = NumberInput(value=1, min=1, max=self.base.max_context, description="context T",
                                   unit="tokens", style=style, layout=layout)
        self.grid_html, self.table_html = widgets.HTML(), widgets.HTML()
        controls = [self.mesh_shape, self.kv_heads, self.batch, self.context]
        super().__init__([*controls, status := widgets.HTML(), self.grid_html, self.table_html], status)
        self.mesh_shape.observe(self._on_mesh, names="value")
        self.observe_controls(self.kv_heads, self.batch, self.context)
        self._snapped = ""  # the note of the last mesh change that moved the batch
        self.update(mesh_shape=mesh_shape or list(shapes)[len(shapes) // 2], kv_heads=kv_heads, batch=batch,
                    context=context)

    def _on_mesh(self, _change=None) -> None:
        """The batch takes multiples of the data axis only, so every batch splits evenly over the mesh; a batch
        that must move is announced, and one that need not move stays (2×4 -> 1×8 keeps B = 8)."""
        data = self._shapes[self.mesh_shape.value][0]
        old = self.batch.value
        top = BATCH_MAX // data * data
        new = min(max(data, round(old / data) * data), top)
        moved = new != old and not self._quiet  # update(...) sets the batch itself next: no note then
        with self.batched():
            self.batch.set_range(data, top, multiple_of=data, value=new)
        self._snapped = f"batch moved from {old} to {new}: the data axis ({data}) must divide it" if moved else ""
        self._on_change()

    def config(self) -> dantinox.ModelConfig:
        return self.base.replace(kv_heads=self.kv_heads.value)

    def formula_params(self) -> dict[str, float]:
        """The content's variables at the current settings, the mesh's two axes included (the quiz takes these)."""
        data, model = self._shapes[self.mesh_shape.value]
        return formula_params(self.config(), self.batch.value, self.context.value, data=data, model=model)

    def _read(self) -> MeshReading:
        return read_mesh(self.config(), self._shapes[self.mesh_shape.value], self.batch.value, self.context.value)

    def refresh(self) -> MeshReading | None:
        """Recompute and redraw; a setting that fails shows its error and no table (the last one would be stale)."""
        reading = super().refresh()
        if reading is None:
            self.table_html.value = self.grid_html.value = ""
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
        if self._snapped:
            notes.insert(0, esc(self._snapped))
            self._snapped = ""
        self.status_html.value = note_box("<br>".join(notes)) if notes else ""
        how = badge("measured", "addressable shards" if r.source == "arrays" else "shard shapes, not allocated")
        self.grid_html.value = device_grid_html(r)
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
