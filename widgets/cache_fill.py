"""A published model's cache filling while its working model decodes, layer by layer and step by step.

    plan = fill_plan(load_architecture("gpt-oss-20b"), tokens=256)
    for step, cache in decode_fill(plan):   # one decode step per token, with a cache of `tokens` slots
        step.tokens, step.held, step.bytes, step.ledger, step.read_bytes

The model is the architecture's working model (dantinox/accounting/working_model.py: the real layer pattern,
KV heads, head sizes, windows, chunks, latent widths, shared layers and states; narrow widths and random
weights). It decodes greedily, one token per call of one compiled step, into a cache allocated for `tokens`
slots per full layer, as the ledger's T. After each step, per layer:

- measured: the slots that hold a position, from the cache's own fill (its `lengths`) and the layer's addressing
  (the rule its attention masks by: a ring of W wraps, a chunk's ring keeps the last C); the bytes they take,
  from the bytes per slot of the layer's arrays; a state's arrays, whole (they do not grow); a shared layer, 0;
- measured: the slots its query read in that step (a chunked layer reads only its own chunk, a shared layer
  reads its source's, a DeepSeek-V3.2 layer the latents of its top k of them and every indexer key), and their
  bytes;
- derived: the ledger's formula at that T (dantinox/accounting/kv_ledger.py: slots_held · slot_bytes + state).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import dantinox
from dantinox.accounting.kv_ledger import slot_bytes, slots_held, state_bytes
from dantinox.accounting.working_model import MEMORY_GUARD, VOCAB, working_config
from dantinox.architectures.catalogue import Architecture
from dantinox.cache import IndexedLatentCache, cache_shapes, init_cache, layouts, tree_nbytes
from dantinox.checks import positive_int

FIRST_TOKEN = 1  # the decode starts from one token id; the rest are the model's own greedy choices


@dataclasses.dataclass(frozen=True)
class FillStep:
    """One decode step's cache, per layer."""

    tokens: int  # tokens the cache holds after the step (its own `lengths`)
    held: tuple[int, ...]  # measured: slots holding a position (0 for shared and state layers)
    bytes: tuple[int, ...]  # measured: held slots x bytes per slot of the layer's arrays, + a state's arrays
    read: tuple[int, ...]  # measured: slots the step's query read (a shared layer: its source's)
    read_bytes: tuple[int, ...]  # measured: their bytes (a state layer reads its whole state)
    ledger: tuple[int, ...]  # derived: the ledger's bytes for one sequence at T = tokens
    seconds: float  # wall time of the step (the first one compiles)


@dataclasses.dataclass(frozen=True)
class FillPlan:
    """What is decoded: the architecture, its working model's config and the layers' arrays, measured once."""

    arch: Architecture
    tokens: int  # slots of a full layer: the decode's length
    cache_dtype: str
    cfg: dantinox.ModelConfig
    kinds: tuple[str, ...]  # per layer, the catalogue's kind (full, sliding, chunked, latent, shared, linear)
    allocated: tuple[int, ...]  # measured: bytes of each layer's arrays as allocated for `tokens` slots
    per_slot: tuple[int, ...]  # measured: bytes of one slot (allocated / slots; 0 without a slot axis)
    constant: tuple[int, ...]  # measured: bytes of arrays that do not grow with tokens (a state layer's)
    sources: tuple[int | None, ...]  # the layer a shared layer reads
    index_per_slot: tuple[int, ...] = ()  # measured: bytes of one slot's indexer key (DeepSeek-V3.2), per layer

    @property
    def total_allocated(self) -> int:
        return sum(self.allocated)


def fill_plan(arch: Architecture, tokens: int, cache_dtype: str = "bfloat16",
              guard: int = MEMORY_GUARD) -> FillPlan:
    """Check that the decode can run here (the working model builds every layer; the cache fits the labs'
    allocation guard) and measure each layer's arrays from the cache's shapes; ValueError in one line."""
    tokens = positive_int("tokens", tokens)
    if tokens > arch.max_context:
        raise ValueError(f"tokens: {arch.name} reads at most max_position_embeddings = {arch.max_context:,} tokens, "
                         f"got {tokens:,}")
    cfg = working_config(arch, tokens, cache_dtype)  # refuses a kind it does not build in one line
    shapes = cache_shapes(cfg, 1, tokens)
    need = tree_nbytes(shapes)
    if need > guard:
        raise ValueError(f"tokens: a cache of {tokens:,} slots for {arch.name} takes {dantinox.format_bytes(need)}, "
                         f"above the labs' {dantinox.format_bytes(guard)} allocation guard; lower the tokens")
    allocated, per_slot, constant, index = [], [], [], []
    for layer in shapes.layers:
        nbytes = tree_nbytes(layer)
        allocated.append(nbytes)
        per_slot.append(nbytes // layer.slots if layer.slots else 0)
        keys = tree_nbytes((layer.idx_k, layer.idx_scale)) if isinstance(layer, IndexedLatentCache) else 0
        index.append(keys // layer.slots if layer.slots else 0)
        constant.append(0 if layer.slots else nbytes)
        if layer.slots and nbytes % layer.slots:
            raise ValueError(f"{arch.name}: a layer's {nbytes} B do not divide into its {layer.slots} slots")
    return FillPlan(arch, tokens, cache_dtype, cfg, tuple(layer.kind for layer in arch.layers), tuple(allocated),
                    tuple(per_slot), tuple(constant), tuple(layer.shares for layer in arch.layers), tuple(index))


@functools.lru_cache(maxsize=4)
def _compiled(cfg: dantinox.ModelConfig, seed: int):
    """The working model's one-token step, split once and compiled on first call (kept for the next decode)."""
    graph, state = nnx.split(dantinox.Transformer(cfg, rngs=nnx.Rngs(seed)))

    @jax.jit
    def step(state, ids_B1, cache):
        logits, cache = nnx.merge(graph, state).forward(ids_B1, cache)
        return jnp.argmax(logits[:, -1:], axis=-1).astype(jnp.int32), cache

    return state, step


def _occupancy(addressing, slots: int, tokens: int) -> tuple[int, int]:
    """(slots holding a position, slots the last query read) after `tokens` tokens: the addressing's own rule."""
    if slots == 0:
        return 0, 0
    k_pos = np.asarray(addressing.positions(jnp.asarray([tokens]), slots))[0]
    q_pos = tokens - 1
    seen = (k_pos >= 0) & (k_pos <= q_pos) & np.asarray(addressing.visible(q_pos, k_pos), bool)
    return int((k_pos >= 0).sum()), int(seen.sum())


def decode_fill(plan: FillPlan, seed: int = 0) -> Iterator[tuple[FillStep, dantinox.KVCache]]:
    """Decode `plan.tokens` tokens one at a time; yield each step's reading and the cache it left (see the module)."""
    state, step = _compiled(plan.cfg, seed)
    lays = layouts(plan.cfg)
    arch, dtype = plan.arch, plan.cache_dtype
    cache = init_cache(plan.cfg, 1, plan.tokens)
    slots = tuple(layer.slots for layer in cache.layers)
    ids = jnp.full((1, 1), FIRST_TOKEN % VOCAB, jnp.int32)
    for _ in range(plan.tokens):
        start = time.perf_counter()
        ids, cache = step(state, ids, cache)
        tokens = int(dantinox.filled_slots(cache)[0])  # the cache's own fill (blocks until the step is done)
        seconds = time.perf_counter() - start
        groups = {}  # layers with the same addressing and slots share one answer
        for lay, s in zip(lays, slots, strict=True):
            key = (lay.addressing, s)
            if key not in groups:
                groups[key] = _occupancy(lay.addressing, s, tokens)
        held, read = zip(*(groups[(lay.addressing, s)] for lay, s in zip(lays, slots, strict=True)), strict=True)
        read_bytes = []
        for i, kind in enumerate(plan.kinds):
            src = plan.sources[i] if kind == "shared" else i
            read_bytes.append(read[src] * plan.per_slot[src] + plan.constant[src])
        if plan.cfg.index_topk is not None:  # every indexer key is scored, only the top k latents are read
            chosen = tuple(min(r, plan.cfg.index_topk) for r in read)
            read_bytes = [r * key + k * (slot - key) for r, k, key, slot in zip(read, chosen, plan.index_per_slot,
                                                                                plan.per_slot, strict=True)]
            read = chosen
        if "shared" in plan.kinds:
            read = tuple(read[plan.sources[i]] if kind == "shared" else r
                         for i, (kind, r) in enumerate(zip(plan.kinds, read, strict=True)))
        yield FillStep(
            tokens=tokens, held=tuple(held),
            bytes=tuple(h * b + c for h, b, c in zip(held, plan.per_slot, plan.constant, strict=True)),
            read=tuple(read), read_bytes=tuple(read_bytes),
            ledger=tuple(slots_held(layer, tokens) * slot_bytes(layer, dtype) + state_bytes(layer, dtype)
                         for layer in arch.layers),
            seconds=seconds), cache


def disagreements(plan: FillPlan, steps: list[FillStep]) -> list[str]:
    """Where the measured bytes differ from the ledger's, one line each (none: they agree at every step)."""
    return [f"step {s.tokens}, layer {i} ({plan.kinds[i]}): measured {m:,} B, ledger {d:,} B"
            for s in steps for i, (m, d) in enumerate(zip(s.bytes, s.ledger, strict=True)) if m != d]


def kind_summary(plan: FillPlan, step: FillStep) -> list[tuple[str, str]]:
    """Per kind, what its layers hold and read after `step`: (label, one line)."""
    fmt, out = dantinox.format_bytes, []
    for kind in dict.fromkeys(plan.kinds):
        idx = [i for i, k in enumerate(plan.kinds) if k == kind]
        i = idx[0]
        layer = plan.arch.layers[i]
        held = sorted({step.held[j] for j in idx})
        each = fmt(step.bytes[i]) if len({step.bytes[j] for j in idx}) == 1 else "bytes vary by layer"
        label = f"{len(idx)} {kind} layer{'s' if len(idx) > 1 else ''}"
        if kind == "shared":
            reads = ", ".join(f"layer {j} ({step.read[j]:,} slots)"
                              for j in sorted({plan.sources[j] for j in idx}))
            line = f"0 slots, 0 B: each reads again the cache of {reads}"
        elif kind in ("linear", "conv", "mamba"):
            line = f"a constant state of {each} each, whatever the tokens (0 slots)"
        elif kind == "mlp":
            line = "no token mixer: 0 slots, 0 B"
        elif kind == "sliding":
            wraps = (step.tokens - 1) // layer.window
            line = (f"{'/'.join(map(str, held))} of W = {layer.window:,} slots ({each} each); "
                    + (f"the ring has wrapped {wraps}x: slot p mod W was overwritten" if wraps else
                       "the ring has not wrapped yet"))
        elif kind == "chunked":
            line = (f"{'/'.join(map(str, held))} of C = {layer.window:,} slots ({each} each); the query read "
                    f"{step.read[i]:,} (its own chunk only)")
        elif kind == "latent" and layer.indexer:
            line = (f"{step.held[i]:,} slots of C + R + I = {layer.latent + layer.rope + layer.indexer} "
                    f"elements ({each} each): the query scored every indexer key and read {step.read[i]:,} "
                    f"latents (its top k = {layer.index_topk:,})")
        elif kind == "latent":
            line = (f"{step.held[i]:,} slots of C + R = {layer.latent + layer.rope} elements ({each} each): "
                    "one latent per token, no K/V pair per head")
        else:
            line = f"{step.held[i]:,} slots, one per token ({each} each)"
        out.append((label, line))
    return out
