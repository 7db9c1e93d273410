"""Autoregressive generation: one pure step function, run under lax.while_loop for a batch or streamed.

nnx stays out of the per-token path: the model is split once per call, and the compiled program
merges it back inside (`nnx.merge` runs at trace time only). The key-window schedule lives here: the
cache is exactly one window long, and grown between windows, so a step's cost follows the filled
length while every program has static shapes and no branches.
"""

from __future__ import annotations

import collections
import functools
import threading
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dantinox import sharding
from dantinox.cache import KVCache, cache_length, grow_cache, init_cache
from dantinox.checks import check_ids, positive_int
from dantinox.config import ModelConfig
from dantinox.model import Transformer


def kv_windows(length: int) -> tuple[int, ...]:
    """Static key-window sizes for a cache of `length` slots: 128, 192, 256, 384, 512, 768, ..., length.

    Decoding uses the smallest window that covers the filled part, so a step's cost follows the
    filled length (within 1.5x) instead of the allocated length.
    """
    sizes, size = [], 128
    while size < length:
        sizes += [s for s in (size, size * 3 // 2) if s < length]
        size *= 2
    return (*sizes, length)


def window_for(length: int, kv_len: int) -> int:
    """The smallest window of `kv_windows(length)` that holds `kv_len` slots."""
    return next(w for w in kv_windows(length) if w >= kv_len)


class DecodeState(NamedTuple):
    """Invariant: tokens[:, :index] are known and cached; `logits` predict tokens[:, index]."""

    tokens: jax.Array  # [B, max_context] int32, prompt then generated tokens
    caches: KVCache  # per-layer caches, one key window long, holding `index` tokens; () without a cache
    index: jax.Array  # int32 scalar
    end: jax.Array  # int32 scalar, stop once index == end
    logits: jax.Array  # [B, V] float32
    rng: jax.Array


class StreamEvent(NamedTuple):
    """One chunk of `stream`: what it produced, the state after it, and what its compiled calls cost."""

    tokens: np.ndarray  # [B, n] the n tokens produced in this chunk
    caches: KVCache  # the cache after the chunk (as long as the current key window); () without a cache
    index: int  # tokens now held (prompt + generated)
    seconds: float  # wall time of this chunk's compiled call(s), up to block_until_ready
    compiled: bool  # True when one of those calls compiled (or loaded from disk) a new program

    @property
    def token(self) -> np.ndarray:
        """[B] the last token of the chunk."""
        return self.tokens[:, -1]


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


def _prefill(graphdef, params, prompt_BT, end, seed, use_cache: bool, cache_length: int) -> DecodeState:
    model = nnx.merge(graphdef, params)
    B, T = prompt_BT.shape
    tokens = jnp.zeros((B, model.cfg.max_context), jnp.int32).at[:, :T].set(prompt_BT)
    if use_cache:
        logits_BTV, caches = model.forward(prompt_BT, init_cache(model.cfg, B, cache_length), 0)
    else:
        logits_BTV, caches = model.forward(prompt_BT)[0], ()
    return DecodeState(tokens, caches, jnp.int32(T), jnp.asarray(end, jnp.int32), logits_BTV[:, -1],
                       jax.random.key(seed))


def _step(graphdef, params, state: DecodeState, temperature, top_k: int | None, use_cache: bool,
          window: int) -> DecodeState:
    """Sample the next token, write it, and compute the logits for the one after it.

    With a cache, attention reads the whole cache (one window long). Without one, the step recomputes
    the first `window` (static, >= index + 1) tokens in full: its cost grows with the length.
    """
    model = nnx.merge(graphdef, params)
    rng, key = jax.random.split(state.rng)
    with jax.named_scope("sample"):
        token_B = sample(state.logits, key, temperature, top_k)
    tokens = jax.lax.dynamic_update_slice(state.tokens, token_B[:, None], (0, state.index))
    if use_cache:
        logits_B1V, caches = model.forward(token_B[:, None], state.caches, state.index)
        logits = logits_B1V[:, 0]
    else:
        logits_BTV, _ = model.forward(tokens[:, :window])  # causal: padding after `index` never leaks back
        logits, caches = jax.lax.dynamic_index_in_dim(logits_BTV, state.index, axis=1, keepdims=False), ()
    return DecodeState(tokens, caches, state.index + 1, state.end, logits, rng)


def _decode(graphdef, params, state: DecodeState, temperature, stop, top_k, use_cache, window) -> DecodeState:
    """Decode while index < stop and the next write fits in `window` slots (the cache is that long)."""
    return jax.lax.while_loop(lambda s: (s.index < stop) & (s.index < window),
                              lambda s: _step(graphdef, params, s, temperature, top_k, use_cache, window), state)


_STATIC = dict(static_argnums=(0,), static_argnames=("top_k", "use_cache", "window"))
_prefill_jit = jax.jit(_prefill, static_argnums=(0,), static_argnames=("use_cache", "cache_length"))
_grow_jit = jax.jit(grow_cache, static_argnums=(1,))

# XLA:CPU runs a batch-1 step's matrix-vector products faster when it may use 512-bit vectors; from
# batch 2 up the matmuls go to a library kernel and the option measured neutral to slower
# (benchmarks/decode.py times both sides in every run). Other backends get no options.
VECTOR_512 = {"xla_cpu_prefer_vector_width": "512"}


def compiler_options(batch: int) -> dict[str, str] | None:
    """The XLA options dantinox compiles a decode program for `batch` sequences with (None: the defaults)."""
    return VECTOR_512 if batch == 1 and jax.default_backend() == "cpu" else None


@functools.cache
def _decode_jit(donate: bool, vector_512: bool):
    return jax.jit(_decode, donate_argnums=(2,) if donate else (), compiler_options=VECTOR_512 if vector_512 else None,
                   **_STATIC)


def decode_program(batch: int, donate: bool):
    """The compiled decode loop for `batch` sequences: one program per (batch, window), reused for any prompt,
    length and stop. generate donates the state, so the cache is updated in place; stream does not, since
    it hands each chunk's cache to the caller."""
    return _decode_jit(donate, compiler_options(batch) is not None)


def _check_request(cfg: ModelConfig, prompt_ids: Any, max_new_tokens: Any, temperature: Any,
                   top_k: Any) -> tuple[jax.Array, int]:
    if cfg.paradigm != "autoregressive":
        raise ValueError(f"model: generate() decodes autoregressive models; this one has paradigm="
                         f"{cfg.paradigm!r} (use dantinox.diffusion_generate)")
    prompt = check_ids(cfg.vocab_size, prompt_ids, "prompt_ids")
    end = prompt.shape[1] + positive_int("max_new_tokens", max_new_tokens, minimum=0)
    if end > cfg.max_context:
        raise ValueError(f"max_new_tokens: prompt ({prompt.shape[1]}) + max_new_tokens ({max_new_tokens}) = "
                         f"{end} exceeds max_context={cfg.max_context}")
    if isinstance(temperature, bool) or not isinstance(temperature, int | float | np.number) or temperature < 0:
        raise ValueError(f"temperature: expected a number >= 0, got {temperature!r}")
    if top_k is not None:
        top_k = positive_int("top_k", top_k)
        if top_k > cfg.vocab_size:
            raise ValueError(f"top_k: expected None or an integer in [1, {cfg.vocab_size}], got {top_k!r}")
    return prompt, end


def _start(model: Transformer, prompt: jax.Array, end: int, seed: int, use_cache: bool, temperature: float,
           mesh: Any = None):
    graphdef, params = nnx.split(model)
    layout = None if mesh is None else sharding.plan(model.cfg, mesh, prompt.shape[0])
    if layout is not None:  # weights replicated, prompts over "data"; XLA partitions the programs
        params, prompt = sharding.place_inputs(layout, params, prompt)
    window = window_for(model.cfg.max_context, prompt.shape[1])
    state = _prefill_jit(graphdef, params, prompt, end, seed, use_cache=use_cache, cache_length=window)
    if layout is not None and use_cache:  # KV heads over "model"; the decode loops keep this placement
        state = state._replace(caches=sharding.shard_cache(state.caches, model.cfg, layout))
    temp = jnp.float32(temperature) if temperature > 0 else None  # None: greedy, fixed at trace time
    return graphdef, params, state, temp


def _advance(decode, graphdef, params, state: DecodeState, index: int, stop: int, temp, top_k, use_cache):
    """Run the decode programs from `index` to `stop`, growing the cache at each key window; (state, stop)."""
    max_context = state.tokens.shape[1]
    while index < stop:
        window = window_for(max_context, index + 1)  # the step at index i writes slot i
        if use_cache and cache_length(state.caches) < window:
            state = state._replace(caches=_grow_jit(state.caches, window))
        state = decode(graphdef, params, state, temp, stop, top_k=top_k, use_cache=use_cache, window=window)
        index = min(stop, window)
    return state


def generate(model: Transformer, prompt_ids: Any, max_new_tokens: int, use_cache: bool = True,
             temperature: float = 0.0, top_k: int | None = None, seed: int = 0,
             cache_layout: str = "contiguous", block_size: int = 16, mesh: Any = None) -> jax.Array:
    """Continue `prompt_ids` [B, T] by `max_new_tokens`; returns [B, T + max_new_tokens] int32.

    Decoding runs in compiled `lax.while_loop`s, one per key window (128, 192, 256, 384, ... slots) the
    generation passes through, with the cache grown between them; no Python runs per token. Each program
    compiles once per (batch, window) and is reused for any prompt and any number of new tokens.
    `cache_layout="paged"` keeps the cache in blocks of `block_size` tokens (dantinox/paged.py).
    `mesh` (a jax ("data", "model") Mesh) decodes with sequences and KV heads spread over its devices
    (dantinox/sharding.py).
    """
    prompt, end = _check_request(model.cfg, prompt_ids, max_new_tokens, temperature, top_k)
    if cache_layout not in ("contiguous", "paged"):
        raise ValueError(f"cache_layout: expected 'contiguous' or 'paged', got {cache_layout!r}")
    if cache_layout == "paged":
        if not use_cache:
            raise ValueError("cache_layout: 'paged' is a layout of the KV cache; it needs use_cache=True")
        if mesh is not None:
            raise ValueError("mesh: the paged cache runs on one device; use cache_layout='contiguous' with a mesh")
        from dantinox.paged import paged_generate  # paged.py drives this module's decode step

        return paged_generate(model, prompt, end, temperature, top_k, seed, block_size)
    graphdef, params, state, temp = _start(model, prompt, end, seed, use_cache, temperature, mesh)
    decode = decode_program(prompt.shape[0], donate=True)
    state = _advance(decode, graphdef, params, state, prompt.shape[1], end, temp, top_k, use_cache)
    return state.tokens[:, :end]


class _CompileCounter:
    """Counts XLA compilations per thread, from jax.monitoring's backend-compile events."""

    EVENT = "/jax/core/compile/backend_compile_duration"

    def __init__(self):
        self.counts: collections.Counter = collections.Counter()
        jax.monitoring.register_event_duration_secs_listener(self)

    def __call__(self, event: str, duration: float, **kwargs: Any) -> None:
        if event == self.EVENT:
            self.counts[threading.get_ident()] += 1

    def here(self) -> int:
        return self.counts[threading.get_ident()]


_compile_counter: _CompileCounter | None = None


def stream(model: Transformer, prompt_ids: Any, max_new_tokens: int, use_cache: bool = True,
           temperature: float = 0.0, top_k: int | None = None, seed: int = 0,
           chunk_tokens: int = 1, mesh: Any = None) -> Iterator[StreamEvent]:
    """Decode like `generate`, yielding after every `chunk_tokens` tokens (the last chunk may be shorter).

    Each chunk runs the same compiled step as `generate` inside one while_loop per key window it
    touches; `seconds` times only those calls (and a cache grow between windows), to block_until_ready.
    The prefill is not part of any chunk. Without a cache every step recomputes the full forward over
    the tokens so far (rounded up to the key window), so its cost per token grows with the length.
    """
    global _compile_counter
    prompt, end = _check_request(model.cfg, prompt_ids, max_new_tokens, temperature, top_k)
    chunk = positive_int("chunk_tokens", chunk_tokens)
    if _compile_counter is None:
        _compile_counter = _CompileCounter()
    graphdef, params, state, temp = _start(model, prompt, end, seed, use_cache, temperature, mesh)
    index, decode = prompt.shape[1], decode_program(prompt.shape[0], donate=False)
    while index < end:
        stop = min(index + chunk, end)
        compiles, start = _compile_counter.here(), time.perf_counter()
        state = jax.block_until_ready(_advance(decode, graphdef, params, state, index, stop, temp, top_k,
                                               use_cache))
        seconds = time.perf_counter() - start
        yield StreamEvent(np.asarray(state.tokens[:, index:stop]), state.caches, stop, seconds,
                          _compile_counter.here() > compiles)
        index = stop
