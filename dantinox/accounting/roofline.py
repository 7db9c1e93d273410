"""The roofline of one decode or prefill step: bytes moved and FLOPs from a config,
and the timings that test it.

    machine = measure_machine()                          # streaming read B/s, f32 matmul FLOP/s: timed here
    cost = decode_cost(cfg, batch=8, context=128)        # bytes and FLOPs of one decode step
    cost.time(machine)                                   # the roofline: max(bytes / BW, FLOPs / peak)
    decode_step_seconds(model, batch=8, context=128)     # measured: compiled steps, fixed costs cancelled

What is counted (per step): every weight read once; the cache slots attention reads (every slot of the
cache it is given) and the slots the step writes; 2 FLOPs per multiply-add of every matmul, and the
4·N·H FLOPs per query per key slot of attention (scores and weighted values). Activations, attention
scores included, are not counted. MLA (attention="latent") reads and writes C + R elements per slot and
layer; its absorbed decode scores every cached row C + R wide and sums the latents C wide, 2·N·(2C + R)
FLOPs per query per slot, and multiplies each query by W_UK and W_UV once (weights like the others); its
materialized decode instead up-projects every cached latent to per-head keys and values at every step.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dantinox.accounting.memory import DEVICE_PRESETS, kv_cache_bytes, kv_read_bytes
from dantinox.architectures.config import ModelConfig
from dantinox.cache import init_cache
from dantinox.checks import positive_int
from dantinox.generation.generate import DecodeState, decode_program

# Datasheet devices: the DEVICE_PRESETS name (capacity) and the prefill-and-decode spec holding F and BW.
DATASHEET_SPECS = {
    "A100 80GB": "Critical batch on an A100 80GB SXM in dense bf16",
    "H100 80GB": "Critical batch on an H100 SXM in dense bf16",
    "H200 141GB": "Critical batch on an H200 SXM in dense bf16",
}
BANDWIDTH_BYTES = 256 * 2**20  # streamed by the bandwidth probe: several times any CPU's last-level cache
MATMUL_SIZE = 1024  # n of the n×n f32 matmul probe: large enough for the BLAS kernels to reach full speed


@dataclasses.dataclass(frozen=True)
class Machine:
    """A memory bandwidth and a matmul peak: timed on this machine, or a datasheet's figures."""

    name: str
    bandwidth: float  # B/s read from main memory (HBM on an accelerator)
    peak_flops: float  # FLOP/s of dense matmul in `compute_dtype`
    compute_dtype: str  # the number format the peak is for
    kind: str  # "measured" (timed here) | "derived" (datasheet figures from content)
    source: str  # how the numbers were obtained
    memory_bytes: int  # capacity, for the largest batch that fits

    def critical_batch(self, bytes_per_weight: int | None = None) -> float:
        """Tokens per step at which the weight matmuls turn compute-bound
        (defaults to compute_dtype's size)."""
        size = jnp.dtype(self.compute_dtype).itemsize if bytes_per_weight is None else bytes_per_weight
        return critical_batch(self.peak_flops, self.bandwidth, size)


def critical_batch(peak_flops: float, bandwidth: float, bytes_per_weight: int = 2) -> float:
    """F / BW · bytes / 2: a weight of `bytes_per_weight` bytes gives 2 FLOPs
    (one multiply-add) per token."""
    return peak_flops / bandwidth * bytes_per_weight / 2


@dataclasses.dataclass(frozen=True)
class StepCost:
    """Bytes moved and FLOPs of one compiled step (one forward call) of a model."""

    phase: str  # "decode" (one new token per sequence) | "prefill" (the whole prompt)
    batch: int  # B
    tokens: int  # new tokens per sequence in this step: 1 for decode, the prompt length for prefill
    context: int  # S, key slots attention reads per sequence
    weight_bytes: int
    cache_read_bytes: int
    cache_write_bytes: int
    matmul_flops: int
    attention_flops: int
    page_gather_bytes: int = 0  # a paged read's contiguous copy of its pages: written, then read by attention

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.cache_read_bytes + self.cache_write_bytes + self.page_gather_bytes

    @property
    def flops(self) -> int:
        return self.matmul_flops + self.attention_flops

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved."""
        return self.flops / self.bytes

    def memory_time(self, machine: Machine) -> float:
        return self.bytes / machine.bandwidth

    def compute_time(self, machine: Machine) -> float:
        return self.flops / machine.peak_flops

    def time(self, machine: Machine) -> float:
        """The roofline: the step cannot be faster than its bytes at full bandwidth or its FLOPs at peak."""
        return max(self.memory_time(machine), self.compute_time(machine))

    def bound(self, machine: Machine) -> str:
        return "memory" if self.memory_time(machine) >= self.compute_time(machine) else "compute"


def check_variant(cfg: ModelConfig) -> None:
    if not cfg.uniform_heads:
        raise ValueError("layer_specs: the roofline counts one K and H for every layer; "
                         "this config's layers differ")


def _latent_up_weights(cfg: ModelConfig) -> int:
    """W_UK and W_UV of one latent layer: the latent C up to each head's unrotated key and to its value."""
    return cfg.kv_latent_dim * cfg.n_heads * (cfg.qk_nope_dim + cfg.head_size)


def _attention_matrices(cfg: ModelConfig) -> int:
    """Weights of one layer's attention matmuls: QKV and output, or MLA's query, latent, RoPE key, W_UK, W_UV
    and output projections (a converted model's query head is its nope width plus its share of R)."""
    D, N, H = cfg.d_model, cfg.n_heads, cfg.head_size
    if cfg.attention != "latent":
        return D * (N + 2 * cfg.n_kv_heads) * H + N * H * D
    C, R = cfg.kv_latent_dim, cfg.rope_head_dim
    X = cfg.qk_nope_dim + R // cfg.mla_rope_heads
    Cq = cfg.q_latent_dim
    query = D * N * X if Cq is None else D * Cq + Cq * N * X
    return query + D * C + D * R + _latent_up_weights(cfg) + N * H * D


def weight_count(cfg: ModelConfig) -> int:
    """Parameters of the model: L blocks (attention, gated MLP, two norms; MLA's latent and query-latent norms
    where it has them), the embedding, the final norm."""
    check_variant(cfg)
    D, F, V = cfg.d_model, cfg.mlp_width, cfg.vocab_size
    norms = 2 * D
    if cfg.attention == "latent":
        norms += (cfg.kv_latent_dim if cfg.mla_latent_norm else 0) + (cfg.q_latent_dim or 0)
    block = _attention_matrices(cfg) + D * 2 * F + F * D + norms
    return cfg.n_layers * block + V * D + D + (0 if cfg.tie_embeddings else D * V)


def _materialized(cfg: ModelConfig) -> bool:
    return cfg.attention == "latent" and cfg.mla_decode == "materialized"


def matmul_weights_per_token(cfg: ModelConfig) -> int:
    """Weights each token multiplies by: every block's matmuls and the output head (the embedding when
    tied). MLA's materialized path multiplies W_UK and W_UV by the cached latents instead
    (`_up_projection_flops`)."""
    check_variant(cfg)
    D, F, V = cfg.d_model, cfg.mlp_width, cfg.vocab_size
    attention = _attention_matrices(cfg) - (_latent_up_weights(cfg) if _materialized(cfg) else 0)
    return cfg.n_layers * (attention + 3 * D * F) + D * V


def _up_projection_flops(cfg: ModelConfig, batch: int, slots: int) -> int:
    """MLA's materialized path: every step up-projects each sequence's `slots` cached latents to keys and
    values."""
    return 2 * batch * slots * cfg.n_layers * _latent_up_weights(cfg) if _materialized(cfg) else 0


def _score_flops_per_slot(cfg: ModelConfig) -> int:
    """FLOPs of one query against one cached slot in one layer: a score and a weighted sum per head.

    K/V heads: H wide each (4·N·H). MLA absorbed: the score runs over the cached row, C + R wide (a
    converted model's query faces its group's RoPE channels and zeros elsewhere: still R), the sum over the
    latent, C wide. MLA materialized: a head's unrotated key and its RoPE share, then its value."""
    N, H = cfg.n_heads, cfg.head_size
    if cfg.attention != "latent":
        return 4 * N * H
    C, R = cfg.kv_latent_dim, cfg.rope_head_dim
    if _materialized(cfg):
        return 2 * N * (cfg.qk_nope_dim + R // cfg.mla_rope_heads + H)
    return 2 * N * (2 * C + R)


def _attention_flops(cfg: ModelConfig, queries: int, context: int) -> int:
    return queries * context * cfg.n_layers * _score_flops_per_slot(cfg)


def _paged_read(cfg: ModelConfig, batch: int, context: int) -> tuple[int, int, str]:
    """(paged layers, slots of whole pages per sequence, how a decode step reads the pool) for a private pool
    of `batch` sequences of `context` slots (init_cache's), as dantinox/cache/paged.py decides it: "in place"
    (a backend's kernel, each sequence's own slots), "whole" (every query against the whole pool) or
    "gathered" (each sequence's pages copied into slot order)."""
    if cfg.cache_layout != "paged":
        return 0, context, "in place"
    from dantinox.cache import LatentCache, LayerCache, layouts
    from dantinox.cache.page_manager import pages_for

    paged = [lay.addressing for lay in layouts(cfg) if lay.addressing.pooled]
    M = pages_for(context, cfg.page_size)
    payload = LatentCache if cfg.attention == "latent" else LayerCache
    layout = payload.SCALE_LAYOUT if cfg.quantized_cache else None
    if not paged or batch > 1 and paged[0].reads_in_place(1, payload, cfg.cache_jnp_dtype, layout):
        read = "in place"
    else:
        read = "whole" if paged[0].reads_pool(1, batch * M, M) else "gathered"
    return len(paged), M * cfg.page_size, read


def page_gather_bytes(cfg: ModelConfig, batch: int, context: int) -> int:
    """Bytes a paged step moves beyond reading its pages: where a paged layer gathers each sequence's pages
    into a contiguous copy (dantinox/cache/paged.py, `Paged.reads_pool` False) the copy is written once and
    read once by attention; a pool read whole or in place moves none."""
    layers, slots, read = _paged_read(cfg, batch, context)
    if read != "gathered":
        return 0
    one = cfg.replace(n_layers=1, cache_layout="contiguous", sliding_windows=None, attention_chunks=None)
    return 2 * layers * kv_cache_bytes(one, batch, slots)


def decode_cost(cfg: ModelConfig, batch: int, context: int) -> StepCost:
    """One decode step: B new tokens, each attending over `context` cached slots (plus a paged read's copy,
    or, for a paged pool read whole, each query's scores over every sequence's pages)."""
    batch, context = positive_int("batch", batch), positive_int("context", context)
    layers, slots, read = _paged_read(cfg, batch, context)
    others = batch * slots - context  # the pool beyond its own slots, which each query scores too
    pool_scores = batch * others * layers * _score_flops_per_slot(cfg) if read == "whole" else 0
    return StepCost(
        phase="decode", batch=batch, tokens=1, context=context,
        weight_bytes=weight_count(cfg) * jnp.dtype(cfg.param_jnp_dtype).itemsize,
        cache_read_bytes=kv_read_bytes(cfg, batch, context), cache_write_bytes=kv_cache_bytes(cfg, batch, 1),
        matmul_flops=2 * batch * matmul_weights_per_token(cfg) + _up_projection_flops(cfg, batch, context),
        attention_flops=_attention_flops(cfg, batch, context) + pool_scores,
        page_gather_bytes=page_gather_bytes(cfg, batch, context))


def prefill_cost(cfg: ModelConfig, batch: int, prompt: int) -> StepCost:
    """Prefill of B prompts of `prompt` tokens into a cache of as many slots.

    Attention computes the full prompt × slots score matrix (the causal mask is applied, not skipped),
    and reads back the slots it has just written, so both are counted.
    """
    batch, prompt = positive_int("batch", batch), positive_int("prompt", prompt)
    cache = kv_cache_bytes(cfg, batch, prompt)
    return StepCost(
        phase="prefill", batch=batch, tokens=prompt, context=prompt,
        weight_bytes=weight_count(cfg) * jnp.dtype(cfg.param_jnp_dtype).itemsize,
        cache_read_bytes=cache, cache_write_bytes=cache,
        matmul_flops=(2 * batch * prompt * matmul_weights_per_token(cfg)
                      + _up_projection_flops(cfg, batch, prompt)),
        attention_flops=_attention_flops(cfg, batch * prompt, prompt))


def generate_seconds(cfg: ModelConfig, batch: int, prompt: int, new_tokens: int, machine: Machine) -> float:
    """The roofline of one generate() call: the prefill of `prompt` tokens, then `new_tokens` decode steps,
    each over the slots it has filled (prompt + 1, ..., prompt + new_tokens),
    the least any cache layout reads."""
    new_tokens = positive_int("new_tokens", new_tokens, minimum=0)
    steps = sum(decode_cost(cfg, batch, filled).time(machine)
                for filled in range(prompt + 1, prompt + new_tokens + 1))
    return prefill_cost(cfg, batch, prompt).time(machine) + steps


def crossover_batch(cfg: ModelConfig, context: int, machine: Machine, limit: int = 1 << 20) -> int | None:
    """Smallest decode batch whose step is compute-bound on `machine`, or None if none up to `limit` is."""
    if decode_cost(cfg, limit, context).bound(machine) == "memory":
        return None
    lo, hi = 1, limit  # the compute share grows with the batch, so bisect
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if decode_cost(cfg, mid, context).bound(machine) == "compute" else (mid + 1, hi)
    return lo


# Measuring -------------------------------------------------------------------------------------------------
def best_of(fn: Callable[[], object], repeats: int, warmup: bool = True) -> float:
    """Fastest of `repeats` timed calls in seconds, after one untimed call that compiles
    (unless warmup=False)."""
    repeats = positive_int("repeats", repeats)
    if warmup:
        jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return min(times)


def measure_bandwidth(nbytes: int = BANDWIDTH_BYTES, repeats: int = 5) -> float:
    """Streaming-read bandwidth in B/s: a jitted sum over `nbytes` of float32, best of `repeats`."""
    x = jnp.ones((positive_int("nbytes", nbytes) // 4,), jnp.float32)
    total = jax.jit(jnp.sum)
    return x.nbytes / best_of(lambda: total(x), repeats)


def measure_matmul_flops(n: int = MATMUL_SIZE, repeats: int = 5) -> float:
    """Dense float32 matmul throughput in FLOP/s: a jitted n×n by n×n product (2·n³ FLOPs),
    best of `repeats`."""
    a = jax.random.normal(jax.random.key(0), (positive_int("n", n), n), jnp.float32)
    product = jax.jit(jnp.matmul)
    return 2 * n**3 / best_of(lambda: product(a, a), repeats)


def measure_machine(repeats: int = 5) -> Machine:
    """This machine's bandwidth and f32 matmul peak, timed now (labelled measured)."""
    return Machine(
        name="this machine", bandwidth=measure_bandwidth(repeats=repeats),
        peak_flops=measure_matmul_flops(repeats=repeats), compute_dtype="float32", kind="measured",
        source=f"jitted sum over {BANDWIDTH_BYTES // 2**20} MiB of f32 and a {MATMUL_SIZE}×{MATMUL_SIZE} "
               f"f32 matmul on {jax.default_backend()}, best of {repeats} each",
        memory_bytes=DEVICE_PRESETS["this machine (RAM)"].memory_bytes)


def datasheet_machines(specs: Iterable) -> list[Machine]:
    """A100, H100 and H200: dense bf16 FLOP/s and bandwidth from datasheet specs.

    `specs` are the prefill-and-decode entry's (`content.load_entry("prefill-and-decode").specs`), loaded by
    the caller: each has a `label`, a `source` and `compute.with_` holding BW (bytes/s) and F (FLOP/s).
    """
    specs = {s.label: s for s in specs}
    out = []
    for name, label in DATASHEET_SPECS.items():
        if label not in specs or specs[label].compute is None:
            raise ValueError(f"prefill-and-decode.specs: expected a computed spec labelled {label!r}")
        values = specs[label].compute.with_
        out.append(Machine(name=name, bandwidth=float(values["BW"]), peak_flops=float(values["F"]),
                           compute_dtype="bfloat16", kind="derived", source=specs[label].source,
                           memory_bytes=DEVICE_PRESETS[name].memory_bytes))
    return out


def timing_state(cfg: ModelConfig, batch: int, context: int, filled: int) -> DecodeState:
    """A decode state over a cache of `context` slots that claims `filled` tokens (zeros), for timing.

    Run by generate's one decode loop (`decode_program`) up to `context`, every step attends over all
    `context` slots (one key bucket), so every step does the same work whatever `filled` is.
    """
    cache = init_cache(cfg, batch, context)
    at = jnp.full((batch,), filled, jnp.int32)
    return DecodeState(jnp.zeros((batch, cfg.max_context), jnp.int32), cache._replace(lengths=at), at,
                       jnp.full((batch,), context, jnp.int32),
                       jnp.zeros((batch, cfg.vocab_size), jnp.float32),
                       jax.random.key(0))


def run_decode(graphdef, params, state: DecodeState, stop: int, bucket: int, program=None) -> DecodeState:
    """generate's greedy decode loop from `state` until `stop` tokens are held, in a cache of `bucket` slots:
    the same program and XLA options as generate's (or `program`, from generate.decode_loop_jit), not
    donated, so a timing state can be run again."""
    if program is None:
        cfg = nnx.merge(graphdef, params).cfg
        program = decode_program(state.index.shape[0], donate=False, cfg=cfg, slots=bucket)
    return program(graphdef, params, state, None, stop, top_k=None, use_cache=True, bucket=bucket)


@partial(jax.jit, static_argnums=0)
def _prefill(graphdef, params, prompt_BT):
    model = nnx.merge(graphdef, params)
    B, T = prompt_BT.shape
    return model.forward(prompt_BT, init_cache(model.cfg, B, T))


def check_fits(cfg: ModelConfig, name: str, value: int) -> int:
    value = positive_int(name, value)
    if value > cfg.max_context:
        raise ValueError(f"{name}: expected at most max_context={cfg.max_context}, got {value}")
    return value


def decode_step_seconds(model: nnx.Module, batch: int, context: int, short: int = 4, long: int = 20,
                        repeats: int = 3, attempts: int = 3) -> float:
    """Seconds per decode step with a cache of `context` slots: (t(long) - t(short)) / (long - short).

    Both loop lengths run generate's compiled decode loop (the same program: the start is an argument),
    so compiling, dispatch and copying the input cache cancel out. The two lengths are timed in alternation
    and each keeps its best of `repeats`; if a busy machine makes the difference non-positive, the long loop
    is doubled and timed again, up to `attempts` times. The loop writes one slot per step, so neither length
    exceeds `context`.
    """
    cfg = model.cfg
    check_variant(cfg)
    batch, context = positive_int("batch", batch), check_fits(cfg, "context", context)
    if not 0 <= short < long:
        raise ValueError(f"short, long: expected 0 <= short < long, got {short}, {long}")
    repeats, attempts = positive_int("repeats", repeats), positive_int("attempts", attempts)
    # a loop writes one slot per step, so a cache of `context` slots holds that many
    long = min(long, context)
    short = min(short, long - 1)
    graphdef, params = nnx.split(model)
    states = {}

    def run(steps: int) -> Callable[[], object]:
        if steps not in states:  # the last `steps` slots are written, every step attends over all of them
            states[steps] = timing_state(cfg, batch, context, context - steps)
        return lambda: run_decode(graphdef, params, states[steps], context, context)

    jax.block_until_ready(run(short)())  # compiles
    for _ in range(attempts):
        best = {short: math.inf, long: math.inf}
        for _ in range(repeats):
            for steps in best:
                best[steps] = min(best[steps], best_of(run(steps), 1, warmup=False))
        per_step = (best[long] - best[short]) / (long - short)
        if per_step > 0:
            return per_step
        long = min(context, short + 2 * (long - short))
    raise RuntimeError(f"timing: longer loops were not slower than {short} steps in {attempts} attempts "
                       "(machine too busy); raise `repeats`")


def prefill_seconds(model: nnx.Module, batch: int, prompt: int, repeats: int = 3) -> float:
    """Seconds of one compiled prefill of B prompts of `prompt` tokens into a fresh cache,
    best of `repeats`."""
    cfg = model.cfg
    check_variant(cfg)
    batch, prompt = positive_int("batch", batch), check_fits(cfg, "prompt", prompt)
    graphdef, params = nnx.split(model)
    ids = jnp.asarray(np.random.RandomState(0).randint(0, cfg.vocab_size, (batch, prompt)), jnp.int32)
    return best_of(lambda: _prefill(graphdef, params, ids), repeats)
