"""Recurrent layers' caches: a state of constant size per sequence, not keys and values per token.

Three layer kinds (config.RECURRENT_KINDS), each with its payload here:
  state  Gated DeltaNet (StateCache, below)
  conv   LFM2's gated short convolution (ConvCache)
  mamba  a Mamba-2 mixer (MambaCache)
Each is rewritten by every call of its layer (dantinox/architectures/model.py); `state_bytes` is each one's
size, written from the formula, not from the arrays.

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


class ConstantPayload(Payload):
    """What the three recurrent payloads share: nothing grows with the tokens (no slot axis, no scale), so
    fitting or mapping their slots leaves them as they are; each call of the layer rewrites every field."""

    __slots__ = ()
    SEQ_AXES = ()

    def fit_slots(self, cfg, n: int, fit) -> ConstantPayload:
        return self

    def map_slots(self, fn) -> ConstantPayload:
        return self


class StateCache(ConstantPayload, _StateFields):
    """The payload of a 'state' layer: a write replaces both arrays (the model computes them)."""

    __slots__ = ()

    @classmethod
    def zeros(cls, cfg: ModelConfig, rows: int, slots: int, layer: LayerSpec | None = None) -> StateCache:
        V, H = layer.value_heads, layer.head_size
        return cls(jnp.zeros((rows, V, H, H), jnp.float32), jnp.zeros((rows, conv_dim(layer), layer.conv),
                                                                      cfg.jnp_dtype))


class _ConvFields(NamedTuple):
    window: jax.Array  # [R, channels, conv]: the last `conv` inputs of the convolution (B·x), oldest first


class ConvCache(ConstantPayload, _ConvFields):
    """The payload of a 'conv' layer (LFM2's short convolution, https://arxiv.org/abs/2511.23404;
    transformers' `Lfm2ShortConv`): the last `conv` inputs B·x of its depthwise convolution over its channels
    (LFM2: all D).

    Of the `conv` columns, the convolution of the next token reads the last conv - 1; transformers'
    LinearAttentionLayer keeps `conv_L_cache` columns for LFM2 (its conv state is [B, D, conv_L_cache]), and
    so does dantinox, so that the two allocate the same bytes (vLLM and llama.cpp keep conv - 1).
    """

    __slots__ = ()

    @classmethod
    def zeros(cls, cfg: ModelConfig, rows: int, slots: int, layer: LayerSpec | None = None) -> ConvCache:
        return cls(jnp.zeros((rows, layer.channels, layer.conv), cfg.jnp_dtype))


def mamba_conv_dim(layer: LayerSpec) -> int:
    """Channels of a Mamba-2 layer's convolution: x (heads · P), then B and C (N channels per group each)."""
    return layer.value_heads * layer.head_size + 2 * layer.ssm_groups * layer.ssm_state


class _MambaFields(NamedTuple):
    ssm: jax.Array  # [R, heads, P, N] float32: per head, its P channels x the N state entries
    window: jax.Array  # [R, conv_dim, conv]: the convolution's last inputs (x, B, C), oldest first


class MambaCache(ConstantPayload, _MambaFields):
    """The payload of a 'mamba' layer (Mamba-2, Dao and Gu, https://arxiv.org/abs/2405.21060): the SSM state
    of every head and the convolution's last `conv` inputs, as transformers' cache holds them for Nemotron-H
    and Granite 4.0-H (recurrent state [B, heads, head_dim, ssm_state_size] in float32, conv state
    [B, conv_dim, conv_kernel] in the activation dtype)."""

    __slots__ = ()

    @classmethod
    def zeros(cls, cfg: ModelConfig, rows: int, slots: int, layer: LayerSpec | None = None) -> MambaCache:
        return cls(jnp.zeros((rows, layer.value_heads, layer.head_size, layer.ssm_state), jnp.float32),
                   jnp.zeros((rows, mamba_conv_dim(layer), layer.conv), cfg.jnp_dtype))


def state_bytes(cfg: ModelConfig, layer: LayerSpec) -> int:
    """Bytes of one sequence's state in a recurrent layer (written from the formula, not the arrays):
    'state' V · H · H float32s plus conv_dim · conv activations; 'conv' channels · conv activations; 'mamba'
    heads · P · N float32s plus (heads · P + 2 · groups · N) · conv activations."""
    act = jnp.dtype(cfg.jnp_dtype).itemsize
    if layer.kind == "conv":
        return layer.channels * layer.conv * act
    if layer.kind == "mamba":
        ssm = layer.value_heads * layer.head_size * layer.ssm_state * 4
        return ssm + mamba_conv_dim(layer) * layer.conv * act
    return layer.value_heads * layer.head_size ** 2 * 4 + conv_dim(layer) * layer.conv * act


@dataclasses.dataclass(frozen=True)
class Recurrent(Contiguous):
    """No slot per token: the layer's state is rewritten by each call (the model's GatedDeltaNet)."""

    bounded: ClassVar[bool] = True  # 0 slots whatever the length

    def slots(self, length: int) -> int:
        return 0


for kind, payload in (("state", StateCache), ("conv", ConvCache), ("mamba", MambaCache)):
    register(ADDRESSING, kind)(lambda cfg, layer: Recurrent())
    register(PAYLOAD, kind)(payload)
