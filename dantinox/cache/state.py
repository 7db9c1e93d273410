"""A linear-attention layer's cache: a recurrent state of constant size, not keys and values per token.

Gated DeltaNet (Yang, Kautz and Hatamizadeh, arXiv:2412.06464; the linear layers of Qwen3-Next and
Qwen3.5) keeps, per value head, a d_k x d_v matrix S that every token updates with the gated delta rule,
and a short causal convolution over its query, key and value inputs that needs the last `conv` inputs.
So its cache is two arrays per sequence, whatever the number of tokens:

    s       [R, V, H, H] float32, the recurrent state of V value heads (keys and values of H channels)
    window  [R, conv_dim, conv] the last `conv` inputs of the convolution, conv_dim = 2 K H + V H,
            in the model's activation dtype

as transformers' `LinearAttentionLayer` allocates them for Qwen3-Next (its recurrent state in float32, its
conv state of `linear_conv_kernel_dim` columns). The cache's CacheConfig storage (a quantized dtype) applies
to the K/V layers beside it, not to the state. Registered here: the "state" layer kind (registry.py).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from dantinox.architectures.config import LayerSpec, ModelConfig
from dantinox.cache.layout import Contiguous, Payload
from dantinox.cache.registry import ADDRESSING, PAYLOAD, register


class _StateFields(NamedTuple):
    s: jax.Array  # [R, V, H, H] float32: per value head, keys' channels x values' channels
    window: jax.Array  # [R, conv_dim, conv]: the convolution's last inputs, oldest first


def conv_dim(layer: LayerSpec) -> int:
    """Channels of the short convolution: queries and keys of K heads, values of V heads, H channels each."""
    return (2 * layer.kv_heads + layer.value_heads) * layer.head_size


class StateCache(Payload, _StateFields):
    """The payload of a 'state' layer: no slot axis; a write replaces both arrays
    (the model computes them)."""

    __slots__ = ()
    SEQ_AXES = ()  # nothing grows with the tokens: no slot, no scale

    def fit_slots(self, cfg, n: int, fit) -> StateCache:
        return self  # constant in the number of tokens

    def map_slots(self, fn) -> StateCache:
        return self

    @classmethod
    def zeros(cls, cfg: ModelConfig, rows: int, slots: int, layer: LayerSpec | None = None) -> StateCache:
        V, H = layer.value_heads, layer.head_size
        return cls(jnp.zeros((rows, V, H, H), jnp.float32), jnp.zeros((rows, conv_dim(layer), layer.conv),
                                                                      cfg.jnp_dtype))


def state_bytes(cfg: ModelConfig, layer: LayerSpec) -> int:
    """Bytes of one sequence's state in a 'state' layer:
    V · H · H float32s plus conv_dim · conv activations."""
    return (layer.value_heads * layer.head_size ** 2 * 4
            + conv_dim(layer) * layer.conv * jnp.dtype(cfg.jnp_dtype).itemsize)


@dataclasses.dataclass(frozen=True)
class Recurrent(Contiguous):
    """No slot per token: the layer's state is rewritten by each call (the model's GatedDeltaNet)."""

    bounded: ClassVar[bool] = True  # 0 slots whatever the length

    def slots(self, length: int) -> int:
        return 0


register(ADDRESSING, "state")(lambda cfg, layer: Recurrent())
register(PAYLOAD, "state")(StateCache)
