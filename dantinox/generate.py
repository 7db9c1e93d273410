"""Autoregressive generation: one pure step function, run under lax.while_loop or streamed.

nnx stays out of the per-token path: the model is split once per call, and the compiled program
merges it back inside (`nnx.merge` runs at trace time only).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dantinox.cache import KVCache, cache_length, grow_cache, init_cache
from dantinox.config import ModelConfig
from dantinox.model import Transformer, check_ids, kv_windows, window_for


class DecodeState(NamedTuple):
    """Invariant: tokens[:, :index] are known and cached; `logits` predict tokens[:, index]."""

    tokens: jax.Array  # [B, S] int32, prompt then generated tokens
    caches: KVCache  # per-layer caches holding `index` tokens; () when decoding without a cache
    index: jax.Array  # int32 scalar
    end: jax.Array  # int32 scalar, stop once index == end
    logits: jax.Array  # [B, V] float32
    rng: jax.Array


class StreamEvent(NamedTuple):
    token: np.ndarray  # [B] the token just produced
    caches: KVCache  # the cache after that token was written (empty tuple without a cache)
    index: int  # tokens now held (prompt + generated)


def sample(logits_BV: jax.Array, rng: jax.Array, temperature: jax.Array | None, top_k: int | None) -> jax.Array:
    """Greedy when temperature is None or 0, else temperature (and optional top-k) sampling.

    None is greedy decided at trace time: the compiled step then draws no random numbers at all.
    """
    greedy = jnp.argmax(logits_BV, axis=-1)
    if temperature is None:
        return greedy.astype(jnp.int32)
    if top_k is not None:
        kth = jax.lax.top_k(logits_BV, top_k)[0][:, -1:]
        logits_BV = jnp.where(logits_BV < kth, -jnp.inf, logits_BV)
    drawn = jax.random.categorical(rng, logits_BV / jnp.maximum(temperature, 1e-6))
    return jnp.where(temperature > 0, drawn, greedy).astype(jnp.int32)


def _logits_at(model: Transformer, tokens_BS: jax.Array, index: jax.Array, window: int) -> jax.Array:
    """Recompute the first `window` tokens without a cache; the logits predicting tokens[:, index + 1]."""
    logits_BTV, _ = model.forward(tokens_BS[:, :window])  # causal: padding after `index` never leaks back
    return jax.lax.dynamic_index_in_dim(logits_BTV, index, axis=1, keepdims=False)


def _prefill(graphdef, params, prompt_BT, end, seed, use_cache: bool, cache_length: int) -> DecodeState:
    model = nnx.merge(graphdef, params)
    B, T = prompt_BT.shape
    S = model.cfg.max_context
    tokens = jnp.zeros((B, S), jnp.int32).at[:, :T].set(prompt_BT)
    if use_cache:
        logits_BTV, caches = model.forward(prompt_BT, init_cache(model.cfg, B, cache_length), 0)
    else:
        logits_BTV, caches = model.forward(prompt_BT)[0], ()
    return DecodeState(tokens, caches, jnp.int32(T), jnp.asarray(end, jnp.int32), logits_BTV[:, -1],
                       jax.random.key(seed))


def _step(graphdef, params, state: DecodeState, temperature, top_k: int | None, use_cache: bool,
          window: int) -> DecodeState:
    """Sample the next token, write it, and compute the logits for the one after it.

    `window` (static) is how many slots attention reads; it must cover state.index + 1.
    """
    model = nnx.merge(graphdef, params)
    rng, key = jax.random.split(state.rng)
    token_B = sample(state.logits, key, temperature, top_k)
    tokens = jax.lax.dynamic_update_slice(state.tokens, token_B[:, None], (0, state.index))
    if use_cache:
        logits_B1V, caches = model.forward(token_B[:, None], state.caches, state.index, window)
        logits = logits_B1V[:, 0]
    else:
        logits, caches = _logits_at(model, tokens, state.index, window), ()
    return DecodeState(tokens, caches, state.index + 1, state.end, logits, rng)


_prefill_jit = jax.jit(_prefill, static_argnums=(0,), static_argnames=("use_cache", "cache_length"))
_step_jit = jax.jit(_step, static_argnums=(0,), static_argnames=("top_k", "use_cache", "window"))
_grow_jit = jax.jit(grow_cache, static_argnums=(1,))


@partial(jax.jit, static_argnums=(0,), static_argnames=("top_k", "use_cache", "window"), donate_argnums=(2,))
def _decode_segment(graphdef, params, state: DecodeState, temperature, top_k, use_cache, window) -> DecodeState:
    """Decode while the next write fits in `window` slots, with a cache exactly `window` slots long.

    Attention reads every slot the cache holds, with no branches; the state is donated, so the cache is
    updated in place. One program per window size, compiled on first use and reused by every generation.
    """
    return jax.lax.while_loop(lambda s: (s.index < s.end) & (s.index < window),
                              lambda s: _step(graphdef, params, s, temperature, top_k, use_cache, window), state)


def _check_request(cfg: ModelConfig, prompt_ids: Any, max_new_tokens: Any, temperature: Any,
                   top_k: Any) -> tuple[jax.Array, int]:
    if cfg.paradigm != "autoregressive":
        raise ValueError(f"model: generate() decodes autoregressive models; this one has paradigm="
                         f"{cfg.paradigm!r} (use dantinox.diffusion_generate)")
    prompt = check_ids(cfg, prompt_ids, "prompt_ids")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int | np.integer) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: expected a non-negative integer, got {max_new_tokens!r}")
    end = prompt.shape[1] + int(max_new_tokens)
    if end > cfg.max_context:
        raise ValueError(f"max_new_tokens: prompt ({prompt.shape[1]}) + max_new_tokens ({max_new_tokens}) = "
                         f"{end} exceeds max_context={cfg.max_context}")
    if not isinstance(temperature, int | float) or temperature < 0:
        raise ValueError(f"temperature: expected a number >= 0, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)
                              or not 1 <= top_k <= cfg.vocab_size):
        raise ValueError(f"top_k: expected None or an integer in [1, {cfg.vocab_size}], got {top_k!r}")
    return prompt, end


def generate(model: Transformer, prompt_ids: Any, max_new_tokens: int, use_cache: bool = True,
             temperature: float = 0.0, top_k: int | None = None, seed: int = 0) -> jax.Array:
    """Continue `prompt_ids` [B, T] by `max_new_tokens`; returns [B, T + max_new_tokens] int32.

    Decoding runs in compiled `lax.while_loop`s, one per key window (128, 192, 256, 384, ... slots) the
    generation passes through, with the cache grown between them; no Python runs per token. Each program
    compiles once per (batch, window) and is reused for any prompt and any number of new tokens.
    """
    prompt, end = _check_request(model.cfg, prompt_ids, max_new_tokens, temperature, top_k)
    graphdef, params = nnx.split(model)
    S, T = model.cfg.max_context, prompt.shape[1]
    state = _prefill_jit(graphdef, params, prompt, end, seed, use_cache=use_cache, cache_length=window_for(S, T))
    if end > T:
        temp = jnp.float32(temperature) if temperature > 0 else None  # None: greedy, fixed at trace time
        # the step at index i writes slot i, so it needs a window of at least i + 1 slots
        for window in kv_windows(S):
            if window_for(S, T + 1) <= window <= window_for(S, end):
                if use_cache and cache_length(state.caches) < window:
                    state = state._replace(caches=_grow_jit(state.caches, window))
                state = _decode_segment(graphdef, params, state, temp, top_k=top_k, use_cache=use_cache,
                                        window=window)
    return state.tokens[:, :end]


def stream(model: Transformer, prompt_ids: Any, max_new_tokens: int, use_cache: bool = True,
           temperature: float = 0.0, top_k: int | None = None, seed: int = 0) -> Iterator[StreamEvent]:
    """Yield each new token with the cache and index after it, running the same step as `generate`."""
    prompt, end = _check_request(model.cfg, prompt_ids, max_new_tokens, temperature, top_k)
    graphdef, params = nnx.split(model)
    state = _prefill_jit(graphdef, params, prompt, end, seed, use_cache=use_cache,
                         cache_length=model.cfg.max_context)  # stream the whole static cache
    temp = jnp.float32(temperature) if temperature > 0 else None
    for index in range(prompt.shape[1], end):
        window = window_for(model.cfg.max_context, index + 1)  # compiles once per window size
        state = _step_jit(graphdef, params, state, temp, top_k=top_k, use_cache=use_cache, window=window)
        yield StreamEvent(np.asarray(state.tokens[:, index]), state.caches, index + 1)
