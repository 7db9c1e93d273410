"""Masked diffusion: the training objective, and block-wise generation with a prefix cache or a DualCache.

A diffusion model (ModelConfig(paradigm="diffusion")) is the same transformer with bidirectional
attention; it learns to fill in MASK tokens (LLaDA, arXiv:2502.09992). Generation appends gen_length
MASKs to the prompt and decodes them block by block, left to right; inside a block each step decodes
the positions the model is confident about (Fast-dLLM, arXiv:2505.22618).

Because attention is bidirectional, decoding a token changes the keys and values of every position,
so no cache is exact. Fast-dLLM's approximation: keys/values of everything outside the active block
change little while the block is decoded, so compute them once per block and reuse them:
  prefix cache: the prompt and finished blocks, [0, block start);
  DualCache:    the prefix plus the still-masked suffix after the block, [block end, T).
Keys are cached after RoPE at absolute positions, as in dantinox/cache/container.py.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from dantinox.accounting.memory import kv_cache_bytes
from dantinox.architectures.attention import NEG_INF
from dantinox.architectures.config import ModelConfig
from dantinox.architectures.model import Transformer
from dantinox.architectures.tokenizer import MASK
from dantinox.cache import (
    KVCache,
    add_caches,
    cache_shapes,
    init_cache,
    keep_slots,
    layouts,
    resize_layers,
    tree_nbytes,
)
from dantinox.checks import check_ids, positive_int


def masked_diffusion_loss(model: Transformer, tokens_BT: jax.Array, rng: jax.Array,
                          eps: float = 1e-3) -> jax.Array:
    """LLaDA's masked-token objective, normalised by the number of tokens.

    Each sequence draws a masking ratio t ~ U(eps, 1] and masks each token with probability t. The
    model predicts the masked tokens; each masked cross-entropy is weighted by 1/t, which makes the
    loss an upper bound on the sequence's negative log-likelihood.
    """
    if model.cfg.paradigm != "diffusion":
        raise ValueError(f"model: masked_diffusion_loss trains diffusion models; this one has paradigm="
                         f"{model.cfg.paradigm!r}")
    B, T = tokens_BT.shape
    ratio_rng, mask_rng = jax.random.split(rng)
    t_B = eps + (1.0 - eps) * (1.0 - jax.random.uniform(ratio_rng, (B,)))  # uniform is [0, 1): flip to (0, 1]
    masked_BT = jax.random.uniform(mask_rng, (B, T)) < t_B[:, None]
    logits_BTV, _ = model.forward(jnp.where(masked_BT, MASK, tokens_BT))
    nll_BT = optax.softmax_cross_entropy_with_integer_labels(logits_BTV, tokens_BT)
    return jnp.sum(jnp.where(masked_BT, nll_BT / t_B[:, None], 0.0)) / (B * T)


class DualCache(NamedTuple):
    """Fast-dLLM's DualCache (arXiv:2505.22618 §3.2): keys/values computed once per block and reused.

    Both halves are tuples of per-layer payloads in the model's own layout (LayerCache, or LatentCache for
    MLA), keys after RoPE at their absolute positions; they are joined into one full KVCache for a step.
    A prefix cache is a DualCache whose suffix holds zero slots.
    """

    prefix_kvs: tuple  # positions [0, block start): the prompt and the finished blocks
    suffix_kvs: tuple  # positions [block end, T): the still-masked suffix


@dataclasses.dataclass(frozen=True)
class DiffusionResult:
    """Tokens of a diffusion generation and what each step did; step k is the k-th model evaluation."""

    tokens: np.ndarray  # [B, prompt_length + gen_length], no MASK left
    nfe: int  # model evaluations (one per step; the first step of a block also refreshes the cache)
    cache_mode: str  # "none" | "prefix" | "dual"
    prompt_length: int
    gen_length: int
    block_size: int
    threshold: float
    step_block: np.ndarray  # [nfe] the block each step decoded
    unmasked_at: np.ndarray  # [B, gen_length] the step that unmasked each generated position
    computed_tokens: np.ndarray  # [nfe] positions run through the model at each step
    prefix_bytes: np.ndarray  # [nfe] derived: live prefix slots x bytes per slot (tree_nbytes of one slot)
    suffix_bytes: np.ndarray  # [nfe] derived: live suffix slots x bytes per slot
    allocated_bytes: int  # bytes of this mode's static cache buffers (tree_nbytes of their shapes)
    ar_static_bytes: int  # the autoregressive static cache for the same total length (kv_cache_bytes)

    @property
    def cache_bytes(self) -> np.ndarray:
        """[nfe] prefix + suffix bytes in use at each step (derived from positions, not read from arrays)."""
        return self.prefix_bytes + self.suffix_bytes

    @property
    def peak_cache_bytes(self) -> int:
        return int(self.cache_bytes.max(initial=0))

    @property
    def steps_per_block(self) -> np.ndarray:
        return np.bincount(self.step_block, minlength=self.gen_length // self.block_size)

    def unmasked_by(self, step: int) -> np.ndarray:
        """[B, gen_length] bool: which generated positions are decoded once `step` has run."""
        return (self.unmasked_at >= 0) & (self.unmasked_at <= step)


class _State(NamedTuple):
    tokens: jax.Array  # [B, T] prompt then generated positions, MASK where not yet decoded
    step: jax.Array  # int32, steps taken so far (= NFE)
    unmasked_at: jax.Array  # [B, gen_length] int32, -1 until decoded
    step_block: jax.Array  # [gen_length] int32, the block of each step, -1 past the last step
    cache: DualCache  # static-size buffers; slots outside the current prefix/suffix hold zeros


def _full_forward(model: Transformer, tokens_BT: jax.Array) -> tuple[jax.Array, KVCache]:
    """Logits for every position and the keys/values of every position and layer."""
    B, T = tokens_BT.shape
    return model.forward(tokens_BT, init_cache(model.cfg, B, T))


def _slots(layers: tuple) -> int:
    return layers[0].slots


def _split_cache(cfg: ModelConfig, caches: KVCache, start: jax.Array | int, end: jax.Array | int,
                 prefix_slots: int, suffix_slots: int) -> DualCache:
    """Cut full-sequence caches into a prefix ([0, start), left-aligned) and suffix ([end, T), right-aligned).

    The buffers have static sizes; slots outside the live range are zeroed, so the two halves add back
    into one full-length cache.
    """
    T = _slots(caches.layers)
    prefix = keep_slots(resize_layers(caches.layers, cfg, prefix_slots), jnp.arange(prefix_slots) < start)
    suffix_pos_S = T - suffix_slots + jnp.arange(suffix_slots)
    suffix = keep_slots(resize_layers(caches.layers, cfg, suffix_slots, at_end=True), suffix_pos_S >= end)
    return DualCache(prefix, suffix)


def _span_forward(model: Transformer, tokens_BT: jax.Array, start: jax.Array | int, width: int,
                  cache: DualCache) -> jax.Array:
    """Logits [B, width, V] for positions [start, start + width), through the model's own cached forward.

    The prefix and suffix are joined into one full-length cache that holds all T positions; the model
    rewrites the span's keys/values at `start` and attends bidirectionally over all T slots.
    """
    B, T = tokens_BT.shape
    cfg = model.cfg
    layers = add_caches(resize_layers(cache.prefix_kvs, cfg, T),
                        resize_layers(cache.suffix_kvs, cfg, T, at_end=True))
    full = KVCache(layers, jnp.full((B,), T, jnp.int32))
    span_BW = jax.lax.dynamic_slice_in_dim(tokens_BT, start, width, axis=1)
    pos_BW = jnp.broadcast_to(start + jnp.arange(width, dtype=jnp.int32), (B, width))
    return model.forward(span_BW, full, positions_BT=pos_BW)[0]


def _unmask(tokens_BT: jax.Array, logits_BWV: jax.Array, start: jax.Array | int, threshold: jax.Array):
    """Decode, inside the block at `start`, every masked position whose confidence exceeds `threshold`.

    Confidence is the largest softmax probability; a sequence with masks left always decodes at
    least its most confident one. Returns the new tokens and [B, W] bool of what was decoded.
    """
    W = logits_BWV.shape[1]
    block_BW = jax.lax.dynamic_slice_in_dim(tokens_BT, start, W, axis=1)
    logits_BWV = logits_BWV.at[..., MASK].set(NEG_INF)  # MASK is never a prediction
    guess_BW = jnp.argmax(logits_BWV, axis=-1).astype(jnp.int32)
    masked_BW = block_BW == MASK
    conf_BW = jnp.where(masked_BW, jnp.max(jax.nn.softmax(logits_BWV, axis=-1), axis=-1), -1.0)
    best_BW = jax.nn.one_hot(jnp.argmax(conf_BW, axis=-1), W, dtype=jnp.bool_) & masked_BW
    chosen_BW = (masked_BW & (conf_BW > threshold)) | best_BW
    new_block = jnp.where(chosen_BW, guess_BW, block_BW)
    return jax.lax.dynamic_update_slice_in_dim(tokens_BT, new_block, start, axis=1), chosen_BW


def cache_slots(cache_mode: str, prompt_length: int, gen_length: int, block_size: int) -> tuple[int, int]:
    """Static (prefix, suffix) buffer slots a mode allocates: the longest prefix and suffix it holds."""
    if cache_mode == "none":
        return 0, 0
    longest_prefix = prompt_length + gen_length - block_size  # at the last block
    # suffix: at the first block
    return longest_prefix, (gen_length - block_size if cache_mode == "dual" else 0)


def _empty_cache(cfg: ModelConfig, batch: int, prefix_slots: int, suffix_slots: int) -> DualCache:
    return DualCache(*(tuple(lay.zeros(cfg, batch, slots) for lay in layouts(cfg))
                       for slots in (prefix_slots, suffix_slots)))


def _decode(graphdef, params, prompt_BP: jax.Array, threshold: jax.Array, gen_length: int, block_size: int,
            cache_mode: str) -> _State:
    """The whole generation: a fori_loop over blocks, a while_loop over the steps inside each block."""
    model = nnx.merge(graphdef, params)
    B, P = prompt_BP.shape
    T, n_blocks = P + gen_length, gen_length // block_size
    slots = cache_slots(cache_mode, P, gen_length, block_size)
    tokens = jnp.concatenate([prompt_BP, jnp.full((B, gen_length), MASK, jnp.int32)], axis=1)
    state = _State(tokens, jnp.int32(0), jnp.full((B, gen_length), -1, jnp.int32),
                   jnp.full((gen_length,), -1, jnp.int32), _empty_cache(model.cfg, B, *slots))

    def advance(state: _State, logits_BWV, block, start, new_cache) -> _State:
        tokens, chosen_BW = _unmask(state.tokens, logits_BWV, start, threshold)
        at = start - P
        old = jax.lax.dynamic_slice_in_dim(state.unmasked_at, at, block_size, axis=1)
        unmasked_at = jax.lax.dynamic_update_slice_in_dim(
            state.unmasked_at, jnp.where(chosen_BW, state.step, old), at, axis=1)
        return _State(tokens, state.step + 1, unmasked_at, state.step_block.at[state.step].set(block),
                      new_cache)

    def prefix_branch(block, tokens, kv):  # block is static here: the span [start, T) has a static width
        start = P + block * block_size
        return _span_forward(model, tokens, start, T - start, kv)[:, :block_size]

    def decode_block(block, state: _State) -> _State:
        start = P + block * block_size
        # First step of the block: one full forward decodes and refreshes the cache (no extra NFE).
        logits_BTV, caches = _full_forward(model, state.tokens)
        fresh = (state.cache if cache_mode == "none"
                 else _split_cache(model.cfg, caches, start, start + block_size, *slots))
        state = advance(state, jax.lax.dynamic_slice_in_dim(logits_BTV, start, block_size, axis=1), block,
                        start, fresh)

        def later_step(state: _State) -> _State:  # the rest of the block: mode decides what is recomputed
            if cache_mode == "none":
                logits_BTV = _full_forward(model, state.tokens)[0]
                logits_BWV = jax.lax.dynamic_slice_in_dim(logits_BTV, start, block_size, axis=1)
            elif cache_mode == "dual":
                logits_BWV = _span_forward(model, state.tokens, start, block_size, state.cache)
            else:
                branches = [functools.partial(prefix_branch, b) for b in range(n_blocks)]
                logits_BWV = jax.lax.switch(block, branches, state.tokens, state.cache)
            return advance(state, logits_BWV, block, start, state.cache)

        def block_masked(state: _State) -> jax.Array:
            return jnp.any(jax.lax.dynamic_slice_in_dim(state.tokens, start, block_size, axis=1) == MASK)

        return jax.lax.while_loop(block_masked, later_step, state)

    return jax.lax.fori_loop(0, n_blocks, decode_block, state)


@functools.partial(jax.jit, static_argnums=(0, 3, 4, 5))
def _build_cache_jit(graphdef, params, tokens_BT, start: int, end: int, suffix_slots: int) -> DualCache:
    model = nnx.merge(graphdef, params)
    _, caches = _full_forward(model, tokens_BT)
    return _split_cache(model.cfg, caches, start, end, start, suffix_slots)


@functools.partial(jax.jit, static_argnums=(0, 4, 5))
def _span_logits_jit(graphdef, params, tokens_BT, cache: DualCache, start: int, width: int) -> jax.Array:
    return _span_forward(nnx.merge(graphdef, params), tokens_BT, start, width, cache)


_decode_jit = jax.jit(_decode, static_argnums=(0,),
                      static_argnames=("gen_length", "block_size", "cache_mode"))


CACHE_MODES = ("none", "prefix", "dual")


def _check_model(model: Any, cache_mode: str) -> ModelConfig:
    if not isinstance(model, Transformer):
        raise ValueError(f"model: expected a dantinox.Transformer, got {type(model).__name__}")
    cfg = model.cfg
    if cfg.paradigm != "diffusion":
        raise ValueError(f"model: diffusion decoding needs paradigm='diffusion', got {cfg.paradigm!r} "
                         "(use dantinox.generate)")
    if cache_mode not in CACHE_MODES:
        raise ValueError(f"cache_mode: expected one of {', '.join(CACHE_MODES)}, got {cache_mode!r}")
    return cfg


def _check_request(model: Any, prompt_ids: Any, gen_length: Any, block_size: Any, threshold: Any,
                   cache_mode: Any) -> tuple[ModelConfig, jax.Array, int, int]:
    cfg = _check_model(model, cache_mode)
    prompt = check_ids(cfg.vocab_size, prompt_ids, "prompt_ids")
    if bool(jnp.any(prompt == MASK)):
        raise ValueError(f"prompt_ids: must not contain the MASK token ({MASK}); generation fills only the "
                         "positions after the prompt")
    gen_length, block_size = positive_int("gen_length", gen_length), positive_int("block_size", block_size)
    if gen_length % block_size:
        raise ValueError(f"gen_length: expected a multiple of block_size ({block_size}), got {gen_length}")
    total = prompt.shape[1] + gen_length
    if total > cfg.max_context:
        raise ValueError(f"gen_length: prompt ({prompt.shape[1]}) + gen_length ({gen_length}) = {total} "
                         f"exceeds max_context={cfg.max_context}")
    number = not isinstance(threshold, bool) and isinstance(threshold, int | float | np.number)
    if not number or not 0 < threshold <= 1:
        raise ValueError(f"threshold: expected a number in (0, 1], got {threshold!r}")
    return cfg, prompt, gen_length, block_size


def diffusion_generate(model: Transformer, prompt_ids: Any, gen_length: int, block_size: int = 32,
                       threshold: float = 0.9, cache_mode: str = "dual") -> DiffusionResult:
    """Fill `gen_length` MASK positions after `prompt_ids` [B, P], block by block, left to right.

    Inside a block each step predicts every masked position and decodes those whose confidence
    exceeds `threshold` (at least one). `cache_mode` picks what a step recomputes:
      "none"   the whole sequence, every step;
      "prefix" the block and everything after it, against prompt + finished blocks cached per block;
      "dual"   the block only, against a DualCache of prefix and masked suffix, refreshed per block.
    The first step of every block is a full forward in all modes; it also refreshes the cache. The
    whole generation is one compiled program per (batch, prompt length, gen_length, block_size, cache_mode).
    Every attention variant, MLA included, works in every mode: the steps call the model's own forward.
    """
    cfg, prompt, gen_length, block_size = _check_request(model, prompt_ids, gen_length, block_size,
                                                         threshold, cache_mode)
    graphdef, params = nnx.split(model)
    state = _decode_jit(graphdef, params, prompt, jnp.float32(threshold), gen_length=gen_length,
                        block_size=block_size, cache_mode=cache_mode)
    B, P = prompt.shape
    T, nfe = P + gen_length, int(state.step)
    step_block = np.asarray(state.step_block)[:nfe]  # slice on the host: no program per NFE
    start = P + step_block * block_size
    refresh = np.r_[True, step_block[1:] != step_block[:-1]]
    computed = {"none": np.full(nfe, T), "prefix": np.where(refresh, T, T - start),
                "dual": np.where(refresh, T, block_size)}[cache_mode]
    # derived: live slots from the block positions, times the bytes of one slot of every layer
    slot_bytes = 0 if cache_mode == "none" else cache_shapes(cfg, B, 1).nbytes
    prefix_bytes = (start if cache_mode != "none" else np.zeros(nfe, int)) * slot_bytes
    suffix_bytes = (T - start - block_size if cache_mode == "dual" else np.zeros(nfe, int)) * slot_bytes
    slots = cache_slots(cache_mode, P, gen_length, block_size)
    buffers = jax.eval_shape(lambda: _empty_cache(cfg, B, *slots))
    return DiffusionResult(
        tokens=np.asarray(state.tokens), nfe=nfe, cache_mode=cache_mode, prompt_length=P,
        gen_length=gen_length, block_size=block_size, threshold=float(threshold), step_block=step_block,
        unmasked_at=np.asarray(state.unmasked_at), computed_tokens=computed.astype(np.int64),
        prefix_bytes=prefix_bytes.astype(np.int64), suffix_bytes=suffix_bytes.astype(np.int64),
        allocated_bytes=tree_nbytes(buffers), ar_static_bytes=kv_cache_bytes(cfg, B, T))


def build_cache(model: Transformer, tokens_BT: Any, block_start: int, block_size: int,
                cache_mode: str = "dual") -> DualCache:
    """The cache a block's steps read, computed from one full forward of `tokens_BT`, at exact sizes.

    prefix_kvs hold positions [0, block_start); for cache_mode="dual", suffix_kvs hold
    [block_start + block_size, T), else zero slots. Pair it with `span_logits`.
    """
    if cache_mode == "none":
        raise ValueError("cache_mode: expected 'prefix' or 'dual' (mode 'none' keeps no cache), got 'none'")
    cfg = _check_model(model, cache_mode)
    tokens = check_ids(cfg.vocab_size, tokens_BT, "tokens_BT")
    T = tokens.shape[1]
    if T > cfg.max_context:
        raise ValueError(f"tokens_BT: {T} tokens exceed max_context={cfg.max_context}")
    block_start = positive_int("block_start", block_start, minimum=0)
    block_size = positive_int("block_size", block_size)
    if not 0 <= block_start <= T - block_size:
        raise ValueError(f"block_start: expected 0..{T - block_size} so the block fits in {T} tokens, "
                         f"got {block_start}")
    end = block_start + block_size
    return _build_cache_jit(*nnx.split(model), tokens, block_start, end,
                            T - end if cache_mode == "dual" else 0)


def span_logits(model: Transformer, tokens_BT: Any, cache: DualCache) -> jax.Array:
    """Logits for the positions `cache` does not hold, computed against the cached keys/values.

    With a cache from `build_cache` (exact sizes) that span is [prefix length, T - suffix length):
    the block for a DualCache, the block and everything after it for a prefix cache.
    """
    cfg = model.cfg
    tokens = check_ids(cfg.vocab_size, tokens_BT, "tokens_BT")
    T = tokens.shape[1]
    start, end = _slots(cache.prefix_kvs), T - _slots(cache.suffix_kvs)
    if not 0 <= start < end <= T:
        raise ValueError(f"cache: holds {start} prefix and {T - end} suffix slots, "
                         f"leaving no span in {T} tokens")
    return _span_logits_jit(*nnx.split(model), tokens, cache, start, end - start)
