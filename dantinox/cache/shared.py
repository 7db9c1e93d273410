"""Cross-layer KV sharing: a layer that reads the keys and values an earlier layer stored, and stores none.

Gemma 3n's last `num_kv_shared_layers` layers compute only queries and attend over the cache of the last
earlier layer of their own attention type (transformers' Gemma3n code; its config field is documented at
https://huggingface.co/docs/transformers/model_doc/gemma3n). In dantinox such a layer is
`LayerSpec("shared", source=j)`: its payload is `SharedCache`, with no array and 0 bytes, and the model hands
its attention the View layer j's write produced (dantinox/architectures/model.py). So the cache is stored once
and read twice: the bytes a decode step reads are not the bytes the cache holds (accounting/roofline.py).

Registered here: the "shared" layer kind's addressing and payload (registry.py), and the "mlp" kind's (a block
with no token mixer, Nemotron-H's MLP and MoE layers: nothing stored, nothing read).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import jax.numpy as jnp

from dantinox.architectures.config import LayerSpec, ModelConfig
from dantinox.cache.layout import Contiguous, Payload
from dantinox.cache.registry import ADDRESSING, PAYLOAD, register


class _NoFields(NamedTuple):
    pass


class SharedCache(Payload, _NoFields):
    """The payload of a shared layer: nothing. Every per-slot operation maps over its (no) fields."""

    __slots__ = ()
    SEQ_AXES = ()  # no slot, no scale

    @classmethod
    def zeros(cls, cfg: ModelConfig, rows: int, slots: int, layer: LayerSpec | None = None) -> SharedCache:
        return cls()

    @classmethod
    def encode(cls, cfg: Any, *new: Any) -> SharedCache:
        return cls()


@dataclasses.dataclass(frozen=True)
class NoSlots(Contiguous):
    """No slot of its own: an MLP-only block (Nemotron-H's '-' and 'E' layers), which mixes no tokens."""

    bounded: ClassVar[bool] = True  # 0 slots whatever the length

    def slots(self, length: int) -> int:
        return 0

    def locate(self, pos_BT, live_BT, after_B, S, table):
        """No token is written here (slot -1 for every one)."""
        rows = jnp.broadcast_to(jnp.arange(pos_BT.shape[0])[:, None], pos_BT.shape)
        return rows, jnp.full(pos_BT.shape, -1, jnp.int32)


@dataclasses.dataclass(frozen=True)
class ReadsLayer(NoSlots):
    """No slot of its own: the layer's queries read layer `source`'s view (its keys, positions and mask)."""

    source: int


register(ADDRESSING, "shared")(lambda cfg, layer: ReadsLayer(layer.source))
register(PAYLOAD, "shared")(SharedCache)
register(ADDRESSING, "mlp")(lambda cfg, layer: NoSlots())  # an MLP-only block stores nothing either
register(PAYLOAD, "mlp")(SharedCache)
