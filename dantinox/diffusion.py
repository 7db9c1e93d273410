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
Keys are cached after RoPE at absolute positions, as in dantinox/cache.py.
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

from dantinox.cache import KVCache, LayerCache, cache_shapes, init_cache, tree_nbytes
from dantinox.config import ModelConfig
from dantinox.memory import kv_cache_bytes
from dantinox.model import NEG_INF, Attention, Transformer, attend, check_ids
from dantinox.tokenizer import MASK


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

    Both halves are per-layer LayerCache(k, v) with keys after RoPE at their absolute positions. A
    prefix cache is a DualCache whose suffix holds zero slots.
    """

    prefix_kvs: tuple[LayerCache, ...]  # positions [0, block start): the prompt and the finished blocks
    suffix_kvs: tuple[LayerCache, ...]  # positions [block end, T): the still-masked suffix


@dataclasses.dataclass(frozen=True)
class DiffusionResult:
    """Tokens of a diffusion generation and what each step did; step k is the k-th model evaluation."""

    tokens: np.ndarray  # [B, prompt_length + gen_length], no MASK left
    nfe: int  # model evaluations (one per step; the first step of a block also refreshes the cache)
    cache: str  # "none" | "prefix" | "dual"
    prompt_length: int
    gen_length: int
    block_size: int
    threshold: float
    step_block: np.ndarray  # [nfe] the block each step decoded
    unmasked_at: np.ndarray  # [B, gen_length] the step that unmasked each generated position
    computed_tokens: np.ndarray  # [nfe] positions run through the model at each step
    prefix_bytes: np.ndarray  # [nfe] bytes of cached prefix keys/values read by each step
    suffix_bytes: np.ndarray  # [nfe] bytes of cached suffix keys/values read by each step
    allocated_bytes: int  # bytes of this mode's static cache buffers (tree_nbytes of their shapes)
    ar_static_bytes: int  # the autoregressive static cache for the same total length (kv_cache_bytes)

    @property
    def cache_bytes(self) -> np.ndarray:
        """[nfe] prefix + suffix bytes in use at each step."""
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
    return model.forward(tokens_BT, init_cache(model.cfg, B, T), 0)


def _split_cache(caches: KVCache, start: jax.Array | int, end: jax.Array | int, prefix_slots: int,
                 suffix_slots: int) -> DualCache:
    """Cut full-sequence K/V into a prefix ([0, start), left-aligned) and suffix ([end, T), right-aligned).

    The buffers have static sizes; slots outside the live range are zeroed, so the two halves can be
    added back into one sequence without a mask.
    """
    T = caches[0].k.shape[2]
    live_prefix = (jnp.arange(prefix_slots) < start)[None, None, :, None]
    live_suffix = (T - suffix_slots + jnp.arange(suffix_slots) >= end)[None, None, :, None]
    prefix = tuple(LayerCache(*(jnp.where(live_prefix, a[:, :, :prefix_slots], 0) for a in layer))
                   for layer in caches)
    suffix = tuple(LayerCache(*(jnp.where(live_suffix, a[:, :, T - suffix_slots:], 0) for a in layer))
                   for layer in caches)
    return DualCache(prefix, suffix)


def _assemble(prefix_BKSH: jax.Array, span_BKWH: jax.Array, suffix_BKSH: jax.Array,
              start: jax.Array | int, T: int) -> jax.Array:
    """One [B, K, T, H] sequence: cached prefix, the span's fresh K or V at `start`, cached suffix."""
    pad = lambda a, before, after: jnp.pad(a, ((0, 0), (0, 0), (before, after), (0, 0)))  # noqa: E731
    cached = pad(prefix_BKSH, 0, T - prefix_BKSH.shape[2]) + pad(suffix_BKSH, T - suffix_BKSH.shape[2], 0)
    return jax.lax.dynamic_update_slice(cached, span_BKWH, (0, 0, start, 0))


def _span_attention(attn: Attention, x_BWD: jax.Array, pos_W: jax.Array, start: jax.Array | int, T: int,
                    prefix: LayerCache, suffix: LayerCache) -> jax.Array:
    """The span's queries attend (bidirectionally) to [cached prefix | the span itself | cached suffix]."""
    q_BWKGH, k_BKWH, v_BKWH = attn.project(x_BWD, pos_W)
    dt = attn.cfg.cache_jnp_dtype  # fresh K/V rounded like cached ones, as model.forward does
    k_BKTH = _assemble(prefix.k, k_BKWH.astype(dt), suffix.k, start, T)
    v_BKTH = _assemble(prefix.v, v_BKWH.astype(dt), suffix.v, start, T)
    out_BWKGH = attend(q_BWKGH, k_BKTH, v_BKTH, pos_W, T, causal=False)
    return attn.output(out_BWKGH, x_BWD.dtype)


def _span_forward(model: Transformer, tokens_BT: jax.Array, start: jax.Array | int, width: int,
                  cache: DualCache) -> jax.Array:
    """Logits [B, width, V] for positions [start, start + width), run against the cached K/V."""
    T = tokens_BT.shape[1]
    pos_W = start + jnp.arange(width, dtype=jnp.int32)  # RoPE at absolute positions
    x = model.embed(jax.lax.dynamic_slice_in_dim(tokens_BT, start, width, axis=1))
    for block, prefix, suffix in zip(model.blocks, cache.prefix_kvs, cache.suffix_kvs, strict=True):
        x = x + _span_attention(block.attn, block.norm1(x), pos_W, start, T, prefix, suffix)
        x = x + block.mlp(block.norm2(x))
    return model.logits(model.norm(x))


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


def cache_slots(cache: str, prompt_length: int, gen_length: int, block_size: int) -> tuple[int, int]:
    """Static (prefix, suffix) buffer slots a mode allocates: the longest prefix and suffix it holds."""
    if cache == "none":
        return 0, 0
    longest_prefix = prompt_length + gen_length - block_size  # at the last block
    return longest_prefix, (gen_length - block_size if cache == "dual" else 0)  # suffix: at the first block


def _empty_cache(cfg: ModelConfig, batch: int, prefix_slots: int, suffix_slots: int) -> DualCache:
    def layers(slots):
        shape = (batch, cfg.kv_heads, slots, cfg.head_size)
        return tuple(LayerCache(jnp.zeros(shape, cfg.cache_jnp_dtype), jnp.zeros(shape, cfg.cache_jnp_dtype))
                     for _ in range(cfg.n_layers))
    return DualCache(layers(prefix_slots), layers(suffix_slots))


def _decode(graphdef, params, prompt_BP: jax.Array, threshold: jax.Array, gen_length: int, block_size: int,
            cache: str) -> _State:
    """The whole generation: a fori_loop over blocks, a while_loop over the steps inside each block."""
    model = nnx.merge(graphdef, params)
    B, P = prompt_BP.shape
    T, n_blocks = P + gen_length, gen_length // block_size
    slots = cache_slots(cache, P, gen_length, block_size)
    tokens = jnp.concatenate([prompt_BP, jnp.full((B, gen_length), MASK, jnp.int32)], axis=1)
    state = _State(tokens, jnp.int32(0), jnp.full((B, gen_length), -1, jnp.int32),
                   jnp.full((gen_length,), -1, jnp.int32), _empty_cache(model.cfg, B, *slots))

    def advance(state: _State, logits_BWV, block, start, new_cache) -> _State:
        tokens, chosen_BW = _unmask(state.tokens, logits_BWV, start, threshold)
        at = start - P
        old = jax.lax.dynamic_slice_in_dim(state.unmasked_at, at, block_size, axis=1)
        unmasked_at = jax.lax.dynamic_update_slice_in_dim(
            state.unmasked_at, jnp.where(chosen_BW, state.step, old), at, axis=1)
        return _State(tokens, state.step + 1, unmasked_at, state.step_block.at[state.step].set(block), new_cache)

    def prefix_branch(block, tokens, kv):  # block is static here: the span [start, T) has a static width
        start = P + block * block_size
        return _span_forward(model, tokens, start, T - start, kv)[:, :block_size]

    def decode_block(block, state: _State) -> _State:
        start = P + block * block_size
        # First step of the block: one full forward decodes and refreshes the cache (no extra NFE).
        logits_BTV, caches = _full_forward(model, state.tokens)
        fresh = state.cache if cache == "none" else _split_cache(caches, start, start + block_size, *slots)
        state = advance(state, jax.lax.dynamic_slice_in_dim(logits_BTV, start, block_size, axis=1), block,
                        start, fresh)

        def later_step(state: _State) -> _State:  # the rest of the block: mode decides what is recomputed
            if cache == "none":
                logits_BTV = _full_forward(model, state.tokens)[0]
                logits_BWV = jax.lax.dynamic_slice_in_dim(logits_BTV, start, block_size, axis=1)
            elif cache == "dual":
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
    _, caches = _full_forward(nnx.merge(graphdef, params), tokens_BT)
    return _split_cache(caches, start, end, start, suffix_slots)


@functools.partial(jax.jit, static_argnums=(0, 4, 5))
def _span_logits_jit(graphdef, params, tokens_BT, cache: DualCache, start: int, width: int) -> jax.Array:
    return _span_forward(nnx.merge(graphdef, params), tokens_BT, start, width, cache)


_decode_jit = jax.jit(_decode, static_argnums=(0,), static_argnames=("gen_length", "block_size", "cache"))


CACHE_MODES = ("none", "prefix", "dual")


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    return int(value)


def _check_model(model: Any, cache: str) -> ModelConfig:
    if not isinstance(model, Transformer):
        raise ValueError(f"model: expected a dantinox.Transformer, got {type(model).__name__}")
    cfg = model.cfg
    if cfg.paradigm != "diffusion":
        raise ValueError(f"model: diffusion decoding needs paradigm='diffusion', got {cfg.paradigm!r} "
                         "(use dantinox.generate)")
    if cache not in CACHE_MODES:
        raise ValueError(f"cache: expected one of {', '.join(CACHE_MODES)}, got {cache!r}")
    if cache != "none" and cfg.attention == "mla":
        raise ValueError(f"cache: {cache!r} caches per-head keys/values; attention='mla' supports cache='none'")
    return cfg


def _check_request(model: Any, prompt_ids: Any, gen_length: Any, block_size: Any, threshold: Any,
                   cache: Any) -> tuple[ModelConfig, jax.Array, int, int]:
    cfg = _check_model(model, cache)
    prompt = check_ids(cfg, prompt_ids, "prompt_ids")
    if bool(jnp.any(prompt == MASK)):
        raise ValueError(f"prompt_ids: must not contain the MASK token ({MASK}); generation fills only the "
                         "positions after the prompt")
    gen_length, block_size = _positive("gen_length", gen_length), _positive("block_size", block_size)
    if gen_length % block_size:
        raise ValueError(f"gen_length: expected a multiple of block_size ({block_size}), got {gen_length}")
    total = prompt.shape[1] + gen_length
    if total > cfg.max_context:
        raise ValueError(f"gen_length: prompt ({prompt.shape[1]}) + gen_length ({gen_length}) = {total} exceeds "
                         f"max_context={cfg.max_context}")
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 < threshold <= 1:
        raise ValueError(f"threshold: expected a number in (0, 1], got {threshold!r}")
    return cfg, prompt, gen_length, block_size


def diffusion_generate(model: Transformer, prompt_ids: Any, gen_length: int, block_size: int = 32,
                       threshold: float = 0.9, cache: str = "dual") -> DiffusionResult:
    """Fill `gen_length` MASK positions after `prompt_ids` [B, P], block by block, left to right.

    Inside a block each step predicts every masked position and decodes those whose confidence
    exceeds `threshold` (at least one). `cache` picks what a step recomputes:
      "none"   the whole sequence, every step;
      "prefix" the block and everything after it, against prompt + finished blocks cached per block;
      "dual"   the block only, against a DualCache of prefix and masked suffix, refreshed per block.
    The first step of every block is a full forward in all modes; it also refreshes the cache. The
    whole generation is one compiled program per (batch, prompt length, gen_length, block_size, cache).
    """
    cfg, prompt, gen_length, block_size = _check_request(model, prompt_ids, gen_length, block_size,
                                                         threshold, cache)
    graphdef, params = nnx.split(model)
    state = _decode_jit(graphdef, params, prompt, jnp.float32(threshold), gen_length=gen_length,
                        block_size=block_size, cache=cache)
    B, P = prompt.shape
    T, nfe = P + gen_length, int(state.step)
    step_block = np.asarray(state.step_block[:nfe])
    start = P + step_block * block_size
    refresh = np.r_[True, step_block[1:] != step_block[:-1]]
    computed = {"none": np.full(nfe, T), "prefix": np.where(refresh, T, T - start),
                "dual": np.where(refresh, T, block_size)}[cache]
    slot_bytes = 0 if cache == "none" else tree_nbytes(cache_shapes(cfg, B, 1))
    prefix_bytes = (start if cache != "none" else np.zeros(nfe, int)) * slot_bytes
    suffix_bytes = (T - start - block_size if cache == "dual" else np.zeros(nfe, int)) * slot_bytes
    buffers = jax.eval_shape(lambda: _empty_cache(cfg, B, *cache_slots(cache, P, gen_length, block_size)))
    return DiffusionResult(
        tokens=np.asarray(state.tokens), nfe=nfe, cache=cache, prompt_length=P, gen_length=gen_length,
        block_size=block_size, threshold=float(threshold), step_block=step_block,
        unmasked_at=np.asarray(state.unmasked_at), computed_tokens=computed.astype(np.int64),
        prefix_bytes=prefix_bytes.astype(np.int64), suffix_bytes=suffix_bytes.astype(np.int64),
        allocated_bytes=tree_nbytes(buffers), ar_static_bytes=kv_cache_bytes(cfg, B, T))


def build_cache(model: Transformer, tokens_BT: Any, block_start: int, block_size: int,
                cache: str = "dual") -> DualCache:
    """The cache a block's steps read, computed from one full forward of `tokens_BT`, at exact sizes.

    prefix_kvs hold positions [0, block_start); for cache="dual", suffix_kvs hold
    [block_start + block_size, T), else zero slots. Pair it with `span_logits`.
    """
    if cache == "none":
        raise ValueError("cache: expected 'prefix' or 'dual' (mode 'none' keeps no cache), got 'none'")
    cfg = _check_model(model, cache)
    tokens = check_ids(cfg, tokens_BT, "tokens_BT")
    T = tokens.shape[1]
    if T > cfg.max_context:
        raise ValueError(f"tokens_BT: {T} tokens exceed max_context={cfg.max_context}")
    block_start, block_size = int(block_start), _positive("block_size", block_size)
    if not 0 <= block_start <= T - block_size:
        raise ValueError(f"block_start: expected 0..{T - block_size} so the block fits in {T} tokens, "
                         f"got {block_start}")
    end = block_start + block_size
    return _build_cache_jit(*nnx.split(model), tokens, block_start, end, T - end if cache == "dual" else 0)


def span_logits(model: Transformer, tokens_BT: Any, cache: DualCache) -> jax.Array:
    """Logits for the positions `cache` does not hold, computed against the cached keys/values.

    With a cache from `build_cache` (exact sizes) that span is [prefix length, T - suffix length):
    the block for a DualCache, the block and everything after it for a prefix cache.
    """
    cfg = model.cfg
    tokens = check_ids(cfg, tokens_BT, "tokens_BT")
    T = tokens.shape[1]
    start = cache.prefix_kvs[0].k.shape[2]
    end = T - cache.suffix_kvs[0].k.shape[2]
    if not 0 <= start < end <= T:
        raise ValueError(f"cache: holds {start} prefix and {T - end} suffix slots, leaving no span in {T} tokens")
    return _span_logits_jit(*nnx.split(model), tokens, cache, start, end - start)
