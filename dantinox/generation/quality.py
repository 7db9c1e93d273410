"""Quality of a model and its cache on held-out text: bits per byte, next-token agreement,
largest logit error.

Logits come from one forward pass that writes every token through the model's own cache and attends over
what the cache gives back, so a quantized cache's rounding and a ring buffer's window act on every
position. For these caches that pass computes what step-by-step decoding computes: a ring buffer attends
over exactly the band, and a quantized token's codes depend only on that token (per-token scales).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dantinox.architectures import tokenizer
from dantinox.architectures.config import CacheConfig, ModelConfig
from dantinox.architectures.model import Transformer
from dantinox.cache import init_cache
from dantinox.cache.eviction import BOOKKEEPING_BYTES
from dantinox.cache.kivi import SCALE_DTYPE as KIVI_SCALE_DTYPE
from dantinox.cache.quant import SCALE_BYTES
from dantinox.checks import positive_int

KIVI_SCALE_BYTES = np.dtype(KIVI_SCALE_DTYPE).itemsize


def heldout_chunks(text: str, length: int) -> np.ndarray:
    """The UTF-8 bytes of `text` cut into consecutive rows of `length` tokens [n, length]
    (the tail dropped)."""
    length = positive_int("length", length)
    data = np.asarray(tokenizer.encode(text), np.int32)
    n = len(data) // length
    if n == 0:
        raise ValueError(f"text: needs at least {length} bytes for one chunk of {length} tokens, got "
                         f"{len(data)}")
    return data[: n * length].reshape(n, length)


@functools.partial(jax.jit, static_argnums=(0, 3))
def _cached_logits(graphdef, params, ids_BT: jax.Array, cfg: ModelConfig) -> jax.Array:
    B, T = ids_BT.shape
    return nnx.merge(graphdef, params).forward(ids_BT, init_cache(cfg, B, T))[0]


def cached_logits(model: Transformer, ids_BT: np.ndarray, cache: CacheConfig | None = None) -> np.ndarray:
    """float32 logits [B, T, V] of a forward pass that writes and reads a cache of `cache` (default the
    model's own cache config: its cache_dtype, its sinks)."""
    ids_BT = np.asarray(ids_BT, np.int32)
    if ids_BT.ndim != 2 or ids_BT.shape[1] > model.cfg.max_context:
        raise ValueError(f"ids: expected [batch, tokens] with tokens <= max_context={model.cfg.max_context}, "
                         f"got shape {ids_BT.shape}")
    graphdef, params = nnx.split(model)
    return np.asarray(_cached_logits(graphdef, params, jnp.asarray(ids_BT), model.cfg.with_cache(cache)))


def bits_per_byte(logits_BTV: np.ndarray, ids_BT: np.ndarray) -> float:
    """Mean cross-entropy of each next byte, in bits (tokens are bytes, so bits per token = bits per byte)."""
    logp = jax.nn.log_softmax(jnp.asarray(logits_BTV[:, :-1], jnp.float32), axis=-1)
    target = jnp.asarray(ids_BT[:, 1:])[..., None]
    nats = -jnp.take_along_axis(logp, target, axis=-1).mean()
    return float(nats) / math.log(2)


def agreement(logits_a: np.ndarray, logits_b: np.ndarray) -> float:
    """Fraction of positions where the two predict the same next token (greedy)."""
    return float(np.mean(np.argmax(logits_a, -1) == np.argmax(logits_b, -1)))


def max_logit_error(logits: np.ndarray, reference: np.ndarray) -> float:
    """Largest absolute difference between two logit arrays."""
    return float(np.max(np.abs(np.asarray(logits, np.float32) - np.asarray(reference, np.float32))))


@functools.lru_cache(maxsize=16)
def _structure(cfg: ModelConfig) -> nnx.GraphDef:
    """A model's module structure and static attributes for `cfg`, traced once per config
    (seconds for 30 layers)."""
    return nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))[0]


def with_changes(model: Transformer, **changes) -> Transformer:
    """The same weights under another architecture that keeps the parameter shapes (sliding_windows=(16,) * L,
    another RoPE base): a new model object sharing the parameter arrays. Another cache needs no new model:
    make the cache with it (cfg.with_cache, cached_logits' `cache`, generate's cache_layout)."""
    return nnx.merge(_structure(model.cfg.replace(**changes)), nnx.state(model))


def formula_for(cfg: ModelConfig, batch: int, tokens: int) -> tuple[str, str, dict[str, float]]:
    """(content entry id, science title, variables) of the formula that sizes this config's cache.

    Windows: sliding-window-attention's per-layer sum; sinks: attention-sinks' W + S slots; KIVI and the
    quantized caches: kv-cache-quantization's sizes (int8/fp8 with one float32 scale per head of H elements);
    MLA: its latent size; otherwise the kv-cache formula.
    """
    if not cfg.uniform_heads:
        raise ValueError("layer_specs: the content's cache formulas have one K and H for every layer; "
                         "dantinox.kv_cache_bytes sums a config with per-layer K or H layer by layer")
    head = dict(B=batch, T=tokens, H_kv=cfg.n_kv_heads, d_h=cfg.head_size)
    if cfg.kivi_bits is not None:
        return ("kv-cache-quantization", "KIVI-style cache size (dantinox)",
                dict(L=cfg.n_layers, **head, q=cfg.kivi_bits, s=KIVI_SCALE_BYTES, G=cfg.kivi_group,
                     R=cfg.kivi_residual, bytes=np.dtype(cfg.jnp_dtype).itemsize))
    if cfg.eviction is not None:
        return ("kv-cache-eviction", "Eviction cache size",
                dict(L=cfg.n_layers, **head, N=cfg.cache_budget, bytes=cfg.cache_itemsize,
                     a=BOOKKEEPING_BYTES))
    if cfg.attention_sinks:
        if set(cfg.layer_windows) != {cfg.sliding_window}:
            raise ValueError("sliding_windows: the sink formula has one W in every layer, got "
                             f"{cfg.sliding_windows}")
        return ("attention-sinks", "Cache with attention sinks",
                dict(L=cfg.n_layers, **head, W=cfg.sliding_window, S=cfg.attention_sinks,
                     bytes=cfg.cache_itemsize))
    if cfg.attention == "latent":
        return ("multi-head-latent-attention", "MLA latent cache size",
                dict(L=cfg.n_layers, B=batch, T=tokens, C=cfg.kv_latent_dim, R=cfg.rope_head_dim,
                     bytes=cfg.cache_itemsize))
    if cfg.quantized_cache:
        return ("kv-cache-quantization", "Quantized KV cache size",
                dict(L=cfg.n_layers, **head, q=8 * cfg.cache_itemsize, z=SCALE_BYTES, G=cfg.head_size))
    if cfg.sliding_window is not None:
        if len({w for w in cfg.layer_windows if w}) > 1:
            raise ValueError(f"sliding_windows: the hybrid formula has one W, got {cfg.sliding_windows}")
        local = sum(w is not None for w in cfg.layer_windows)
        return ("sliding-window-attention", "Hybrid sliding-window cache size",
                dict(L_g=cfg.n_layers - local, L_l=local, W=cfg.sliding_window, **head,
                     bytes=cfg.cache_itemsize))
    return "kv-cache", "KV cache size", dict(L=cfg.n_layers, **head, bytes=cfg.cache_itemsize)
