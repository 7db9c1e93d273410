"""Decoding on a device mesh: sequences over the "data" axis, KV heads over the "model" axis.

    mesh = jax.make_mesh((2, 4), ("data", "model"))
    tokens = dantinox.generate(model, prompt_ids, 32, mesh=mesh)     # same tokens as on one device

Placement uses only `jax.sharding` (NamedSharding on a Mesh); XLA's partitioner splits the compiled
decode programs, so the same code runs on CPU, GPU or TPU devices. Each layer's cache ([B, K, H, S] keys,
[B, K, S, H] values) has B split over "data" and K over "model". When the model axis is larger than K, the
heads cannot be split further: each KV head is then held by model / K devices (replicated), as when
Llama-70B's 8 KV heads are served on 16 chips. Per device a cache then takes total / (data · min(model, K))
bytes. The weights are replicated on every device (the reference model is tens of MB; the cache is what
grows). MLA's latent cache has no head axis, so it is split over "data" only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dantinox.architectures.config import ModelConfig

AXES = ("data", "model")


@dataclass(frozen=True)
class MeshPlan:
    """How a cache is laid out on a mesh: the sizes of its axes and where the KV heads go."""

    data: int  # devices sequences are split over
    model: int  # devices KV heads are split over (the mesh's "model" axis)
    heads_split: int  # min(model, K): how many ways each cache's head axis is cut
    replicas: int  # model / heads_split: devices holding the same KV heads
    mesh: Mesh  # the user's devices as (data, heads_split, replicas), named data / model / replica

    @property
    def replicated(self) -> bool:
        return self.replicas > 1


def plan(cfg: ModelConfig, mesh: Any, batch: int) -> MeshPlan:
    """Check a ("data", "model") mesh against the model and batch, and lay the cache out on it."""
    if not isinstance(mesh, Mesh):
        raise ValueError(f"mesh: expected a jax.sharding.Mesh, e.g. jax.make_mesh((2, 4), {AXES}), got "
                         f"{mesh!r}")
    if tuple(mesh.axis_names) != AXES:
        raise ValueError(f"mesh: expected axis names {AXES}, got {tuple(mesh.axis_names)}")
    data, model = mesh.devices.shape
    if batch % data:
        raise ValueError(f"mesh: the data axis ({data}) must divide the batch ({batch})")
    if not cfg.uniform_heads:
        raise ValueError("mesh: the cache is laid out with one K for every layer; "
                         "this config's layers differ")
    k = 1 if cfg.attention == "latent" else cfg.n_kv_heads  # the latent cache is one shared "head"
    if model % k and k % model:
        raise ValueError(f"mesh: the model axis ({model}) must divide K={k} or be a multiple of it")
    split = min(model, k)
    devices = np.asarray(mesh.devices).reshape(data, split, model // split)
    return MeshPlan(data, model, split, model // split, Mesh(devices, ("data", "model", "replica")))


def cache_spec(cfg: ModelConfig) -> PartitionSpec:
    """Where each cache array's axes go: [B, K, ...] -> (data, model), MLA's [B, S, C + R] -> (data)."""
    return PartitionSpec("data") if cfg.attention == "latent" else PartitionSpec("data", "model")


def shard_cache(caches: Any, cfg: ModelConfig, layout: MeshPlan) -> Any:
    """The cache moved onto the mesh: sequences over data, KV heads over model (replicated past K); the
    per-sequence lengths over data."""
    layers = jax.device_put(caches.layers, NamedSharding(layout.mesh, cache_spec(cfg)))
    return caches._replace(layers=layers, lengths=jax.device_put(caches.lengths, NamedSharding(
        layout.mesh, PartitionSpec("data"))))


def place_inputs(layout: MeshPlan, params: Any, prompt: jax.Array) -> tuple[Any, jax.Array]:
    """Weights replicated on every device, prompts split over data."""
    replicated = NamedSharding(layout.mesh, PartitionSpec())
    return jax.device_put(params, replicated), jax.device_put(prompt, NamedSharding(layout.mesh,
                                                                                  PartitionSpec("data")))


def device_bytes(tree: Any) -> dict[int, int]:
    """Bytes each device holds of a pytree of arrays, summed from every array's addressable shards.

    A KVCache counts its stored layers (its lengths are bookkeeping, as in dantinox.tree_nbytes).
    """
    out: dict[int, int] = {}
    for leaf in jax.tree.leaves(getattr(tree, "layers", tree)):
        for shard in leaf.addressable_shards:
            out[shard.device.id] = out.get(shard.device.id, 0) + shard.data.nbytes
    return out


def holdings(cfg: ModelConfig, layout: MeshPlan, batch: int) -> list[dict[str, Any]]:
    """Which sequences and KV heads each device of the mesh holds (derived from the layout)."""
    k = 1 if cfg.attention == "latent" else cfg.n_kv_heads
    per_seq, per_head = batch // layout.data, k // layout.heads_split
    rows = []
    for (d, h, r), device in np.ndenumerate(layout.mesh.devices):
        rows.append(dict(device=device.id, sequences=range(d * per_seq, (d + 1) * per_seq),
                         heads=range(h * per_head, (h + 1) * per_head), replica=r))
    return rows
