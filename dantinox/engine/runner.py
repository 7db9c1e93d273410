"""The engine's runner: the scheduled rows of one iteration through the model, their tokens chosen and kept.

`forward_rows` is the one program `dantinox.Engine` runs per iteration: every scheduled request's new tokens
(a prompt chunk, a sampled token, or drafts to verify) go through the model at once as a ragged batch over the
model's paged layout, sliding-window rings are read and written at each request's seat, and each row's next
tokens are chosen as `dantinox.generate` would choose them for that request alone (greedy, or drawn from the
request's own generator). The shapes it is compiled for are rounded up to a few buckets (`shape_buckets`,
`power_of_two`), so a long trace compiles a handful of programs. `ragged_feed` lays a group of requests out as
that program's padded host arrays. `Runner` splits a plan into its calls (short feeds: decodes and verifies;
prompt chunks) and advances each request by what its call computed: the drafts the model agreed with and its
own next token (dantinox/engine/speculation.py).
"""

from __future__ import annotations

import collections
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dantinox.architectures.config import CacheConfig, ModelConfig
from dantinox.cache import KVCache, layouts
from dantinox.engine.copies import put_seat_rows, seat_rows
from dantinox.engine.records import Request, Row
from dantinox.engine.speculation import accept_drafts


def shape_buckets(limit: int, small: int = 1) -> tuple[int, ...]:
    """small, ..., 8, 12, 16, 24, 32, 48, ...: powers of two and their 1.5x, capped at
    (and ending with) limit."""
    sizes, size = [], small
    while size < limit:
        sizes += [s for s in (size, size * 3 // 2) if size < s < limit or s == size]
        size *= 2
    return tuple(sorted(set(sizes))) + (limit,)


def bucket_of(buckets: tuple[int, ...], n: int) -> int:
    return next(b for b in buckets if b >= n)


def power_of_two(n: int, limit: int) -> int:
    """The smallest power of two >= n, capped at limit."""
    return min(1 << (n - 1).bit_length(), limit)


def _rows_of(layers: tuple, seat_B: jax.Array, ring: tuple[bool, ...]) -> tuple:
    return tuple(seat_rows(layer, seat_B) if r else layer for layer, r in zip(layers, ring, strict=True))


def _put_rows(layers: tuple, rows: tuple, seat_B: jax.Array, ring: tuple[bool, ...]) -> tuple:
    return tuple(put_seat_rows(full, part, seat_B) if r else part
                 for full, part, r in zip(layers, rows, ring, strict=True))


def _sample_rows(logits_BPV, temp_B, top_k_B, rng_B2, first_B):
    """Each row's tokens at its P positions, drawn as `dantinox.generate` draws them for that request alone.

    A request's generator state is split once per token it produces (generate's chain from key(seed)), so
    position j of a row, its (j - first)-th new token, uses the state after j - first + 1 splits; the top-k
    mask and the temperature come first, as in `sample`. Returns the tokens and the chain's states after 1..P
    splits (the host keeps the one after its last new token).
    """
    V = logits_BPV.shape[-1]
    kth_BP1 = jnp.take_along_axis(jnp.sort(logits_BPV, axis=-1), (V - top_k_B)[:, None, None], axis=-1)
    masked_BPV = jnp.where(logits_BPV < kth_BP1, -jnp.inf, logits_BPV)
    keys, states, rng_B = [], [], jax.random.wrap_key_data(rng_B2)
    for _ in range(logits_BPV.shape[1]):
        pair_B2 = jax.vmap(jax.random.split)(rng_B)
        rng_B = pair_B2[:, 0]
        keys.append(pair_B2[:, 1])
        states.append(jax.random.key_data(rng_B))
    nth_BP = jnp.clip(jnp.arange(logits_BPV.shape[1])[None, :] - first_B[:, None], 0)
    keys_BP = jnp.take_along_axis(jnp.stack(keys, axis=1), nth_BP, axis=1)
    scaled_BPV = masked_BPV / jnp.maximum(temp_B, 1e-6)[:, None, None]
    drawn_BP = jax.vmap(jax.vmap(jax.random.categorical))(keys_BP, scaled_BPV)
    greedy_BP = jnp.argmax(logits_BPV, axis=-1)
    return jnp.where(temp_B[:, None] > 0, drawn_BP, greedy_BP).astype(jnp.int32), jnp.stack(states, axis=1)


class Feed(NamedTuple):
    """The host arrays of one ragged call, padded to its shape bucket [B, T] with table width M
    and P picks."""

    ids: np.ndarray  # [B, T] each row's tokens to compute: its uncomputed tokens, then its drafts
    lengths: np.ndarray  # [B] tokens already in the cache
    live: np.ndarray  # [B] tokens of the row that are real (the rest, and padding rows, are not written)
    drafted: np.ndarray  # [B] how many of them are drafts
    table: np.ndarray  # [B, M] page table
    seat: np.ndarray  # [B] ring seat (padding rows: one past the last seat)
    at: np.ndarray  # [B, P] feed positions whose next token is chosen
    temp: np.ndarray  # [B] sampling temperature, 0 for greedy
    top_k: np.ndarray  # [B]
    rng: np.ndarray  # [B, 2] generator key data
    first: np.ndarray  # [B] position of the row's first new token (where its sampling starts)


def ragged_feed(group, B: int, T: int, M: int, every: bool, vocab_size: int, seats: int) -> Feed:
    """The arrays for (request, tokens to feed, drafts) triples: a token chosen after every feed position
    (`every`: decodes and verifies) or after the last only (prompt chunks)."""
    P = T if every else 1
    f = Feed(np.zeros((B, T), np.int32), np.zeros(B, np.int32), np.zeros(B, np.int32), np.zeros(B, np.int32),
             np.zeros((B, M), np.int32), np.full(B, seats, np.int32), np.zeros((B, P), np.int32),
             np.zeros(B, np.float32), np.full(B, vocab_size, np.int32), np.zeros((B, 2), np.uint32),
             np.zeros(B, np.int32))
    for b, (req, n, drafts) in enumerate(group):
        if req.rng is not None:
            f.temp[b], f.top_k[b], f.rng[b] = req.temperature, req.top_k, req.rng
            f.first[b] = n - len(drafts) - 1 if every else 0
        f.ids[b, :n] = req.tokens[req.computed:req.computed + n - len(drafts)] + drafts
        f.lengths[b], f.live[b], f.drafted[b], f.seat[b] = req.computed, n, len(drafts), req.seat
        f.table[b, :len(req.pages)] = req.pages
        f.at[b] = np.minimum(np.arange(P), n - 1) if every else n - 1
    return f


def forward_rows(graphdef, params, layers, ids_BT, lengths_B, live_B, drafts_B, table_BM, seat_B, at_BP,
                  temp_B, top_k_B, rng_B2, first_B, sampling: bool, cache: CacheConfig | None = None):
    """One ragged batch through the model: write every row's live tokens, return its tokens at `at_BP`
    (greedy, or drawn per row where `sampling`) and, where sampling, each row's generator state after each.

    Ring layers are read at each row's seat and written back; where a row verifies drafts, the ring slots
    its rejected drafts overwrote get their old contents back.
    """
    model = nnx.merge(graphdef, params)
    addressing = tuple(lay.addressing for lay in layouts(model.cfg.with_cache(cache)))  # the engine's cache
    ring = tuple(not addr.pooled for addr in addressing)
    T = ids_BT.shape[1]
    live_BT = jnp.arange(T)[None, :] < live_B[:, None]
    before = _rows_of(layers, seat_B, ring)
    logits_BPV, cache = model.forward(ids_BT, KVCache(before, lengths_B, table_BM, cache), live_BT,
                                      logits_at_BP=at_BP)
    if sampling:
        chosen_BP, rng_BP2 = _sample_rows(logits_BPV, temp_B, top_k_B, rng_B2, first_B)
    else:
        chosen_BP, rng_BP2 = jnp.argmax(logits_BPV, axis=-1).astype(jnp.int32), None
    after = cache.layers
    if T > 1 and any(ring):  # restore what rejected drafts overwrote
        j = jnp.arange(T - 1)[None, :]
        agree = (ids_BT[:, 1:] == chosen_BP[:, :T - 1]) & (j < drafts_B[:, None])
        accepted_B = jnp.sum(jnp.cumprod(agree, axis=1), axis=1)
        kept_B = jnp.where(drafts_B > 0, 1 + accepted_B, live_B)
        t = jnp.arange(T)[None, :]
        rejected_BT = (t >= kept_B[:, None]) & live_BT
        pos_BT = lengths_B[:, None] + t

        def restore(old, new, addr):
            S = old.slots  # the slots the rejected tokens were written to, by the ring's own addressing rule
            _, slots_BT = addr.locate(pos_BT, rejected_BT, lengths_B + live_B, S, None)
            hit_BS = jnp.any(slots_BT[:, :, None] == jnp.arange(S), axis=1)

            def pick(o, n, axis):
                shape = [o.shape[0]] + [1] * (o.ndim - 1)
                shape[axis] = S
                return jnp.where(hit_BS.reshape(shape), o, n)
            return type(old)(*(None if o is None else pick(o, n, ax)
                               for o, n, ax in zip(old, new, old.SEQ_AXES, strict=True)))
        after = tuple(restore(o, n, a) if r and o.SEQ_AXES else n  # a state: no slot to restore (no drafts)
                      for o, n, a, r in zip(before, after, addressing, ring, strict=True))
    return _put_rows(layers, after, seat_B, ring), chosen_BP, rng_BP2


forward_rows_jit = jax.jit(forward_rows, static_argnums=(0,), static_argnames=("sampling", "cache"),
                           donate_argnums=(2,))


def generator_state(seed: int) -> np.ndarray:
    """Key data of the generator `dantinox.generate(..., seed=seed)` starts a request's sampling from."""
    return np.asarray(jax.random.key_data(jax.random.key(seed)))


class Ran(NamedTuple):
    """What one iteration's calls did."""

    seconds: float  # wall time of the compiled calls, to block_until_ready
    rows: list[Row]
    emitted: dict[int, list[int]]  # tokens produced per request
    calls: list[tuple[int, int]]  # (rows B, tokens T) of each call, padding included


class Runner:
    """Runs an iteration's feeds, (request, tokens to feed, drafts among them),
    through the compiled iteration.

    Owns the model (split once: nnx stays out of the loop) and the shape rule: calls are padded to a few
    buckets of B rows, T tokens and M table entries, or with `fixed_shapes` to max_seqs rows, the full table
    width and a decode to the verify's 1 + speculate tokens.
    """

    def __init__(self, model, speculate: int, max_seqs: int, max_len: int, max_pages: int,
                 chunk_tokens: int | None, fixed_shapes: bool, cfg: ModelConfig | None = None):
        self.graphdef, self.params = nnx.split(model)
        # the model's architecture, the engine's cache
        self.cfg: ModelConfig = model.cfg if cfg is None else cfg
        self.speculate, self.max_seqs, self.max_len, self.max_pages = speculate, max_seqs, max_len, max_pages
        self.chunk_tokens, self.fixed_shapes = chunk_tokens, fixed_shapes
        self.shapes: set[tuple] = set()  # (B, T, M, P, sampling) of every compiled call
        self.counts = collections.Counter()  # drafts, accepted

    def run(self, layers: tuple, feeds: list[tuple[Request, int, list[int]]]) -> tuple[tuple, Ran]:
        """Run the feeds as up to two ragged calls, short ones (decodes, verifies) then prompt chunks; returns
        the layers after them (the ones passed in are donated) and what the calls did."""
        short = [f for f in feeds if f[1] <= 1 + self.speculate]
        long = [f for f in feeds if f[1] > 1 + self.speculate]
        rows, emitted, seconds, calls = [], {}, 0.0, []
        for group, every in ((short, True), (long, False)):
            if not group:
                continue
            start = time.perf_counter()
            layers, chosen, states, shape = self._call(layers, group, every)
            calls.append(shape)
            seconds += time.perf_counter() - start
            for b, (req, n, drafts) in enumerate(group):
                rows.append(self._accept(req, n, drafts, chosen[b], None if states is None else states[b],
                                         emitted))
        return layers, Ran(seconds, rows, emitted, calls)

    def _call(self, layers: tuple, group, every: bool):
        n_max = max(n for _, n, _ in group)
        if every:  # decodes (one token) or verifies (1 + speculate)
            T = 1 if n_max == 1 and not (self.fixed_shapes and self.speculate) else 1 + self.speculate
        elif self.fixed_shapes:
            T = min(self.chunk_tokens or self.max_len, self.max_len)
        else:
            T = bucket_of(shape_buckets(self.max_len, 8), n_max)
        if self.fixed_shapes:
            B, M = self.max_seqs, self.max_pages
        else:
            B = power_of_two(len(group), self.max_seqs)
            M = power_of_two(max(len(r.pages) for r, _, _ in group), self.max_pages)
        feed = ragged_feed(group, B, T, M, every, self.cfg.vocab_size, self.max_seqs)
        sampling = any(req.rng is not None for req, _, _ in group)
        self.shapes.add((B, T, M, feed.at.shape[1], sampling))
        layers, chosen, states = forward_rows_jit(self.graphdef, self.params, layers, *feed,
                                                  sampling=sampling, cache=self.cfg.cache)
        chosen = np.asarray(jax.block_until_ready(chosen))[:len(group)]
        return layers, chosen, (None if states is None else np.asarray(states)[:len(group)]), (B, T)

    def _accept(self, req: Request, n: int, drafts: list[int], greedy: np.ndarray, states, emitted) -> Row:
        """Advance `req` by what its feed computed; keep the agreed drafts and the model's next token.

        `greedy[j]` is the model's token after feed position j (a prompt chunk's call keeps only the last),
        greedy or drawn; a draft is kept when it is the token the model chose there, so a sampled request
        gets the tokens it would get without drafts. `states[j]` is its generator after that token.
        """
        start, real = req.computed, n - len(drafts)
        if real < len(req.tokens) - start:  # a prompt chunk short of the end: no token yet
            req.computed += n
            return Row(req.rid, "prefill", start, n)

        accepted, new = accept_drafts(drafts, lambda j: int(greedy[j] if len(greedy) > 1 else greedy[0]),
                                      real, req.max_new - len(req.generated), req.stop)
        kind = "verify" if drafts else ("decode" if real == 1 and start >= len(req.prompt) else "prefill")
        # accepted drafts' keys are valid, rejected past fill
        req.computed = start + real + min(accepted, len(new))
        req.tokens += new
        if req.rng is not None and new:
            req.rng = states[len(new) - 1]
        req.token_times += [time.perf_counter()] * len(new)
        emitted[req.rid] = new
        self.counts["drafts"] += len(drafts)
        self.counts["accepted"] += accepted
        return Row(req.rid, kind, start, n, len(drafts), accepted)
