"""Autoregressive generation: one pure step function, run under lax.while_loop for a batch or streamed.

nnx stays out of the per-token path: the model is split once per call, and the compiled program
merges it back inside (`nnx.merge` runs at trace time only). One prefill (`_prefill`) and one decode
loop (`_decode`) serve generate, stream, the paged cache, the roofline timings, the profile and the
benchmarks. The key-bucket schedule lives here: the cache is exactly one key bucket long, and grown
between buckets, so a step's cost follows the filled length while every program has static shapes and
no branches. Rows of a batch may hold different lengths (ragged prompts, rows stopped at eos): the
cache's per-row `lengths` say where each writes.
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

from dantinox import ops
from dantinox.architectures.config import ModelConfig
from dantinox.architectures.model import Transformer
from dantinox.cache import KVCache, cache_length, empty_cache, grow_cache
from dantinox.checks import check_ids, positive_int
from dantinox.generation import sharding


def key_buckets(length: int) -> tuple[int, ...]:
    """Static key-bucket sizes for a cache of `length` slots: 128, 192, 256, 384, 512, 768, ..., length.

    Decoding uses the smallest bucket that covers the filled part, so a step's cost follows the
    filled length (within 1.5x) instead of the allocated length.
    """
    sizes, size = [], 128
    while size < length:
        sizes += [s for s in (size, size * 3 // 2) if s < length]
        size *= 2
    return (*sizes, length)


def bucket_for(length: int, filled: int) -> int:
    """The smallest bucket of `key_buckets(length)` that holds `filled` slots."""
    return next(w for w in key_buckets(length) if w >= filled)


class DecodeState(NamedTuple):
    """Invariant: tokens[b, :index[b]] are known (and cached: caches.lengths == index);
    `logits` predict the next."""

    tokens: jax.Array  # [B, max_context] int32, prompt then generated tokens
    caches: KVCache | None  # the cache, one key bucket long; None without a cache
    index: jax.Array  # [B] int32, tokens known per sequence
    end: jax.Array  # [B] int32, a row stops once index == end (set to index + 1 when it emits eos)
    logits: jax.Array  # [B, V] float32
    rng: jax.Array


class StreamEvent(NamedTuple):
    """One chunk of `stream`: what it produced, the state after it, and what its compiled calls cost."""

    tokens: np.ndarray  # [B, n] the n tokens produced in this chunk
    caches: KVCache | None  # the cache after the chunk, valid until the next chunk runs (stream donates it)
    index: int  # tokens now held (prompt + generated)
    seconds: float  # wall time of this chunk's compiled call(s), up to block_until_ready
    compiled: bool  # True when one of those calls compiled (or loaded from disk) a new program

    @property
    def token(self) -> np.ndarray:
        """[B] the last token of the chunk."""
        return self.tokens[:, -1]


def sample(logits_BV: jax.Array, rng: jax.Array, temperature: jax.Array | None,
           top_k: int | None) -> jax.Array:
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


def _prefill(graphdef, params, prompt_BT, lengths_B, end_B, seed, caches: KVCache | None) -> DecodeState:
    """The one prefill: every prompt through the model (and into `caches`), padding past lengths_B masked."""
    model = nnx.merge(graphdef, params)
    B, T = prompt_BT.shape
    tokens = jnp.zeros((B, model.cfg.max_context), jnp.int32).at[:, :T].set(prompt_BT)
    live_BT = jnp.arange(T)[None, :] < lengths_B[:, None]
    # the vocabulary projection of each prompt's last token only: the others' logits would be thrown away
    logits_B1V, caches = model.forward(prompt_BT, caches, live_BT if caches is not None else None,
                                       logits_at_BP=(lengths_B - 1)[:, None])
    last_BV = logits_B1V[:, 0]
    return DecodeState(tokens, caches, lengths_B, end_B, last_BV, jax.random.key(seed))


def _step(graphdef, params, state: DecodeState, temperature, top_k: int | None, use_cache: bool,
          bucket: int, eos: int | None = None) -> DecodeState:
    """Sample the next token of every unfinished row, write it, and compute the logits for the one after it.

    With a cache, attention reads the whole cache (one bucket long). Without one, the step recomputes
    the first `bucket` (static, > index) tokens in full: its cost grows with the length.
    """
    model = nnx.merge(graphdef, params)
    rng, key = jax.random.split(state.rng)
    active_B = state.index < state.end
    with jax.named_scope("sample"):
        token_B = sample(state.logits, key, temperature, top_k)
    rows = jnp.arange(token_B.shape[0])
    at_B = jnp.where(active_B, state.index, state.tokens.shape[1])  # a finished row writes nothing
    tokens = state.tokens.at[rows, at_B].set(token_B, mode="drop")
    if use_cache:
        logits_B1V, caches = model.forward(token_B[:, None], state.caches, active_B[:, None])
        logits = logits_B1V[:, 0]
    else:
        logits_BTV, _ = model.forward(tokens[:, :bucket])  # causal: padding after `index` never leaks back
        pick = jnp.minimum(state.index, bucket - 1)[:, None, None]
        logits, caches = jnp.take_along_axis(logits_BTV, pick, axis=1)[:, 0], None
    end = state.end if eos is None else jnp.where(active_B & (token_B == eos), state.index + 1, state.end)
    return DecodeState(tokens, caches, state.index + active_B, end, logits, rng)


def _decode(graphdef, params, state: DecodeState, temperature, stop, top_k, use_cache, bucket, eos=None):
    """The one decode loop: step while a row is unfinished, below `stop`,
    and its next write fits the bucket."""
    def more(s: DecodeState) -> jax.Array:
        active = s.index < s.end
        furthest = jnp.max(jnp.where(active, s.index, 0))
        return jnp.any(active) & (furthest < stop) & (furthest < bucket)

    def step(s: DecodeState) -> DecodeState:
        return _step(graphdef, params, s, temperature, top_k, use_cache, bucket, eos)

    return jax.lax.while_loop(more, step, state)


_STATIC = dict(static_argnums=(0,), static_argnames=("top_k", "use_cache", "bucket", "eos"))
prefill_jit = jax.jit(_prefill, static_argnums=(0,), donate_argnames=("caches",))
_grow_jit = jax.jit(grow_cache, static_argnums=(1, 2))


@ops.takes_over("compiler_options")  # a backend may compile decode programs with options of its own
def compiler_options(batch: int, cfg: ModelConfig | None = None,
                     slots: int | None = None) -> dict[str, str] | None:
    """The XLA options a decode program for `batch` sequences of `cfg`, decoding up to `slots` tokens, is
    compiled with; None: XLA's defaults."""
    return None


@functools.cache
def _decode_jit(donate: bool, options: tuple[tuple[str, str], ...]):
    return jax.jit(_decode, donate_argnums=(2,) if donate else (), compiler_options=dict(options) or None,
                   **_STATIC)


def decode_loop_jit(donate: bool = False, compiler_options: dict[str, str] | None = None):
    """A fresh jit of the one decode loop (not shared with generate's), for A/B timing of compiler options or
    of code traced under another setting; called as decode_program's programs are."""
    # a new function: own traces
    return jax.jit(functools.partial(_decode), donate_argnums=(2,) if donate else (),
                   compiler_options=compiler_options, **_STATIC)


def decode_program(batch: int, donate: bool = True, cfg: ModelConfig | None = None, slots: int | None = None):
    """The compiled decode loop for `batch` sequences of `cfg` decoding up to `slots` tokens: one program per
    (batch, bucket), reused for any prompt, length and stop. generate and stream donate the state, so the
    cache is updated in place (a stream event's cache is valid until the next chunk)."""
    return _decode_jit(donate, tuple(sorted((compiler_options(batch, cfg, slots) or {}).items())))


def check_prompts(cfg: ModelConfig, prompt_ids: Any,
                  name: str = "prompt_ids") -> tuple[jax.Array, np.ndarray, bool]:
    """Prompts as (padded [B, T] ids, lengths [B], ragged): an array [B, T],
    or a list of token lists of any lengths."""
    if isinstance(prompt_ids, list | tuple) and prompt_ids and all(isinstance(p, list | tuple | np.ndarray)
                                                                  for p in prompt_ids):
        lengths = np.array([len(p) for p in prompt_ids])
        if (lengths != lengths[0]).any():
            if lengths.min() < 1:
                raise ValueError(f"{name}: every prompt needs at least one token, got lengths "
                                 f"{lengths.tolist()}")
            padded = np.zeros((len(prompt_ids), lengths.max()), np.int64)
            for b, p in enumerate(prompt_ids):
                padded[b, :len(p)] = p
            return check_ids(cfg.vocab_size, padded, name), lengths, True
    prompt = check_ids(cfg.vocab_size, prompt_ids, name)
    return prompt, np.full(prompt.shape[0], prompt.shape[1]), False


def check_request(cfg: ModelConfig, prompt_ids: Any, max_new_tokens: Any, temperature: Any,
                   top_k: Any, eos_id: Any = None) -> tuple[jax.Array, np.ndarray, np.ndarray, bool]:
    if cfg.paradigm != "autoregressive":
        raise ValueError(f"model: generate() decodes autoregressive models; this one has paradigm="
                         f"{cfg.paradigm!r} (use dantinox.diffusion_generate)")
    prompt, lengths, ragged = check_prompts(cfg, prompt_ids)
    new = positive_int("max_new_tokens", max_new_tokens, minimum=0)
    end = lengths + new
    if end.max() > cfg.max_context:
        raise ValueError(f"max_new_tokens: prompt ({lengths.max()}) + max_new_tokens ({max_new_tokens}) = "
                         f"{end.max()} exceeds max_context={cfg.max_context}")
    number = not isinstance(temperature, bool) and isinstance(temperature, int | float | np.number)
    if not number or temperature < 0:
        raise ValueError(f"temperature: expected a number >= 0, got {temperature!r}")
    if top_k is not None:
        top_k = positive_int("top_k", top_k)
        if top_k > cfg.vocab_size:
            raise ValueError(f"top_k: expected None or an integer in [1, {cfg.vocab_size}], got {top_k!r}")
    if eos_id is not None:
        eos_id = positive_int("eos_id", eos_id, minimum=0)
        if eos_id >= cfg.vocab_size:
            raise ValueError(f"eos_id: expected None or a token id in [0, {cfg.vocab_size}), got {eos_id}")
    return prompt, lengths, end, ragged


class _Pager:
    """Hands a paged cache's sequences their pages from one pool as their key bucket grows
    (page_manager.py)."""

    def __init__(self, cfg: ModelConfig, lengths: np.ndarray, end: np.ndarray):
        from dantinox.cache.page_manager import PageManager, pages_for

        self.ps, self.pages_for = cfg.page_size, pages_for
        self.manager = PageManager(int(sum(pages_for(int(e), self.ps) for e in end)), self.ps)
        self.seqs, self.end = list(range(len(lengths))), end
        for seq, n in zip(self.seqs, lengths, strict=True):
            self.manager.add(seq, int(n))

    def cache(self, cfg: ModelConfig, bucket: int) -> KVCache:
        return empty_cache(cfg, len(self.seqs), bucket, self.table(bucket), self.manager.num_pages)

    def table(self, bucket: int) -> np.ndarray:
        return self.manager.table_array(self.seqs, self.pages_for(bucket, self.ps))

    def grow(self, caches: KVCache, bucket: int) -> KVCache:
        for seq in self.seqs:
            self.manager.append(seq, max(0, min(bucket, int(self.end[seq])) - self.manager.lengths[seq]))
        return caches._replace(page_table=jnp.asarray(self.table(bucket), jnp.int32))


def _start(model: Transformer, prompt: jax.Array, lengths: np.ndarray, end: np.ndarray, seed: int,
           use_cache: bool, temperature: float, mesh: Any = None, cfg: ModelConfig | None = None):
    """Split the model, prefill, and return what the decode loop needs; the paged cache's pager if any.
    The cache is made for `cfg` (default the model's): the model's architecture with any cache config."""
    cfg = model.cfg if cfg is None else cfg
    graphdef, params = nnx.split(model)
    layout = None if mesh is None else sharding.plan(cfg, mesh, prompt.shape[0])
    if layout is not None:  # weights replicated, prompts over "data"; XLA partitions the programs
        if cfg.cache_layout == "paged":
            raise ValueError("mesh: the paged cache runs on one device (one pool, one page table); use "
                             "cache_layout='contiguous' with a mesh")
        params, prompt = sharding.place_inputs(layout, params, prompt)
    bucket = bucket_for(cfg.max_context, prompt.shape[1])
    pager = _Pager(cfg, lengths, end) if use_cache and cfg.cache_layout == "paged" else None
    caches = None
    if use_cache:
        caches = pager.cache(cfg, bucket) if pager else empty_cache(cfg, prompt.shape[0], bucket)
        if layout is not None:  # KV heads over "model"; the decode loops keep this placement
            caches = sharding.shard_cache(caches, cfg, layout)
    state = prefill_jit(graphdef, params, prompt, jnp.asarray(lengths, jnp.int32),
                        jnp.asarray(end, jnp.int32), seed, caches)
    temp = jnp.float32(temperature) if temperature > 0 else None  # None: greedy, fixed at trace time
    return graphdef, params, state, temp, pager


def advance(cfg: ModelConfig, decode, graphdef, params, state: DecodeState, stop: int, temp, top_k, use_cache,
             pager=None, eos=None) -> DecodeState:
    """Run the decode programs until every row is done or at `stop`, growing the cache at each key bucket."""
    while True:
        index, end = np.asarray(state.index), np.asarray(state.end)
        active = index < end
        if not active.any() or index[active].max() >= stop:
            return state
        # the step at index i writes slot i
        bucket = bucket_for(cfg.max_context, int(index[active].max()) + 1)
        if pager is not None:
            state = state._replace(caches=pager.grow(state.caches, bucket))
        elif use_cache and cache_length(cfg, state.caches) < bucket:
            state = state._replace(caches=_grow_jit(state.caches, cfg, bucket))
        state = decode(graphdef, params, state, temp, stop, top_k=top_k, use_cache=use_cache, bucket=bucket,
                       eos=eos)


def generate(model: Transformer, prompt_ids: Any, max_new_tokens: int, use_cache: bool = True,
             temperature: float = 0.0, top_k: int | None = None, seed: int = 0, mesh: Any = None,
             eos_id: int | None = None, cache_layout: str | None = None,
             page_size: int | None = None) -> jax.Array | list[list[int]]:
    """Continue `prompt_ids` by `max_new_tokens`: [B, T] in, [B, T + max_new_tokens] int32 out.

    Prompts of different lengths come as a list of token lists and go out as a list of token lists: each
    row gets the tokens its prompt gets alone. With `eos_id` a row stops after emitting it (a rectangular
    result repeats eos_id after that). Decoding runs in compiled `lax.while_loop`s, one per key bucket
    (128, 192, 256, 384, ... slots) the generation passes through, with the cache grown between them; no
    Python runs per token. The cache's layout (contiguous or paged, rings, int8) comes from the config;
    `cache_layout` and `page_size` choose another cache for this call: the same model decodes with it.
    `mesh` (a jax ("data", "model") Mesh) decodes with sequences and KV heads spread over its devices
    (dantinox/generation/sharding.py).
    """
    asked = dict(cache_layout=cache_layout, page_size=page_size)
    cfg = model.cfg.with_cache(**{k: v for k, v in asked.items() if v is not None})
    prompt, lengths, end, ragged = check_request(cfg, prompt_ids, max_new_tokens, temperature, top_k, eos_id)
    graphdef, params, state, temp, pager = _start(model, prompt, lengths, end, seed, use_cache, temperature,
                                                  mesh, cfg)
    decode = decode_program(prompt.shape[0], cfg=cfg, slots=int(end.max()))
    state = advance(cfg, decode, graphdef, params, state, int(end.max()), temp, top_k, use_cache, pager,
                    eos_id)
    return _result(state, lengths, end, ragged, eos_id)


def _result(state: DecodeState, lengths: np.ndarray, end: np.ndarray, ragged: bool, eos_id: int | None):
    stopped = np.asarray(state.end)
    if ragged:
        tokens = np.asarray(state.tokens)
        return [tokens[b, :stopped[b]].tolist() for b in range(len(lengths))]
    tokens = state.tokens[:, :int(end.max())]
    if eos_id is not None and (stopped < end).any():  # rows past their eos: eos_id, not whatever sat there
        tokens = jnp.where(jnp.arange(tokens.shape[1])[None, :] < jnp.asarray(stopped)[:, None], tokens,
                           eos_id)
    return tokens


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

    Each chunk runs the same compiled loop as `generate` (one while_loop per key bucket it touches),
    with the state donated, so the cache is updated in place: an event's `caches` is valid until the
    generator is resumed. `seconds` times only those calls (and a cache grow between buckets), to
    block_until_ready. The prefill is not part of any chunk. Without a cache every step recomputes the
    full forward over the tokens so far (rounded up to the key bucket), so its cost per token grows.
    """
    global _compile_counter
    prompt, lengths, end, ragged = check_request(model.cfg, prompt_ids, max_new_tokens, temperature, top_k)
    if ragged:
        raise ValueError("prompt_ids: stream decodes prompts of one length (an array [B, T]); "
                         "use generate for prompts of different lengths")
    chunk = positive_int("chunk_tokens", chunk_tokens)
    if _compile_counter is None:
        _compile_counter = _CompileCounter()
    graphdef, params, state, temp, pager = _start(model, prompt, lengths, end, seed, use_cache, temperature,
                                                  mesh)
    index, last, decode = prompt.shape[1], int(end.max()), decode_program(prompt.shape[0], cfg=model.cfg,
                                                                          slots=int(end.max()))
    while index < last:
        stop = min(index + chunk, last)
        compiles, start = _compile_counter.here(), time.perf_counter()
        state = jax.block_until_ready(advance(model.cfg, decode, graphdef, params, state, stop, temp, top_k,
                                               use_cache, pager))
        seconds = time.perf_counter() - start
        yield StreamEvent(np.asarray(state.tokens[:, index:stop]), state.caches, stop, seconds,
                          _compile_counter.here() > compiles)
        index = stop
