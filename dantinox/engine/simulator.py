"""The serving simulator: request traces, and two ways to fit them into one KV-cache memory budget, stepped
without the model (dantinox/engine/ serves a real model).

Traces (`make_trace`): Poisson arrivals (`rate` requests per decode step, seeded) and prompt/output lengths
from a named distribution in LENGTHS, each documented with where its numbers come from.

Policies (`serve`), stepping one decode iteration at a time. After a sequence's k-th iteration its cache
holds prompt + k tokens and it has produced k of its `output` tokens; the prompt is prefilled in the
iteration that admits it.

* "static": request-level batching (FasterTransformer-style). A batch is formed only when the previous one
  has finished completely; each sample gets a contiguous region reserved up front (`reservation`: the
  maximum length, "max"; the output rounded up to a power of two, "pow2"; or the true length, "oracle").
* "contiguous": iteration-level batching (Orca, OSDI '22) with the same contiguous reservations: requests
  join and leave every step, but memory is still reserved per region, first fit.
* "paged": iteration-level batching over a PageManager pool (dantinox/cache/paged.py): pages are taken as
  tokens arrive, parallel samples share their prompt's pages, and when the pool runs out the most recently
  admitted request is preempted and later recomputed (vLLM, arXiv:2309.06180 §4.5).

Every step records bytes measured from the allocator's state times the bytes of one cached token measured
from the cache arrays' shapes (dantinox.cache.paged.pool_bytes): token states (slots holding a token of a
running sequence), reserved (slots set aside for tokens a running sequence will still produce), internal
fragmentation (allocated slots that will never hold a running sequence's token: beyond a request's final
length, regions of finished requests held until their static batch ends, the empty tail of last pages)
and external fragmentation (free slots in holes too small for the waiting request, while it waits).
The model is not run here: the lengths come from the trace; benchmarks/serving.py times real decode steps.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
from collections.abc import Hashable

import numpy as np

from dantinox.architectures.config import ModelConfig
from dantinox.cache.paged import PageManager, pages_for, pool_bytes
from dantinox.checks import positive_int

POLICIES = ("static", "contiguous", "paged")
RESERVATIONS = ("max", "pow2", "oracle")
SHAREGPT_SOURCE = "https://arxiv.org/abs/2309.06180"
# Mean prompt and output tokens of the two chat/instruction datasets in the vLLM paper (Fig. 11), for a model
# whose maximum length is 2048 tokens (OPT); traces scale them to the model's max_context.
CHAT_MEANS = {"sharegpt": (161.31, 337.99), "alpaca": (19.31, 58.45)}
LENGTHS = {
    "uniform": "prompt and output uniform on [1, max_context / 4] and [1, max_context / 2] tokens "
               "(illustrative)",
    "sharegpt": "lognormal (sigma 1, an assumption) with the ShareGPT means of the vLLM paper's Fig. 11, "
                "161.31 prompt and 337.99 output tokens at a 2048-token maximum, scaled to max_context",
    "alpaca": "lognormal (sigma 1, an assumption) with the Alpaca means of the vLLM paper's Fig. 11, "
              "19.31 prompt and 58.45 output tokens at a 2048-token maximum, scaled to max_context",
}
LENGTH_SIGMA = 1.0  # the spread of the lognormal lengths; the paper publishes histograms, not a parameter


@dataclasses.dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: when it arrives (decode step),
    its prompt and how many tokens it will produce."""

    id: int
    arrival: int
    prompt: int
    output: int


def _lognormal(rng: np.random.Generator, mean: float, size: int) -> np.ndarray:
    # mu chosen so the distribution's mean is `mean`: E = exp(mu + sigma^2 / 2)
    return rng.lognormal(math.log(mean) - LENGTH_SIGMA**2 / 2, LENGTH_SIGMA, size)


def make_trace(n_requests: int, rate: float, lengths: str, max_context: int,
               seed: int = 0) -> tuple[TraceRequest, ...]:
    """A seeded trace: Poisson arrivals at `rate` requests per step, lengths from LENGTHS[lengths].

    Lengths are rounded to whole tokens, at least 1, and a prompt + output longer than max_context has
    its output cut to fit (a server refuses to generate past the model's context as well).
    """
    n_requests, max_context = positive_int("n_requests", n_requests), positive_int("max_context", max_context)
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate > 0:
        raise ValueError(f"rate: expected requests per step > 0, got {rate!r}")
    if lengths not in LENGTHS:
        raise ValueError(f"lengths: expected one of {', '.join(LENGTHS)}, got {lengths!r}")
    rng = np.random.default_rng(seed)
    arrivals = np.floor(np.cumsum(rng.exponential(1 / rate, n_requests))).astype(int)
    if lengths == "uniform":
        prompt = rng.integers(1, max(1, max_context // 4) + 1, n_requests)
        output = rng.integers(1, max(1, max_context // 2) + 1, n_requests)
    else:
        scale = max_context / 2048
        p_mean, o_mean = CHAT_MEANS[lengths]
        prompt = np.rint(_lognormal(rng, p_mean * scale, n_requests))
        output = np.rint(_lognormal(rng, o_mean * scale, n_requests))
    prompt = np.clip(prompt, 1, max_context - 1).astype(int)
    output = np.clip(np.minimum(output, max_context - prompt), 1, None).astype(int)
    rows = zip(arrivals, prompt, output, strict=True)
    return tuple(TraceRequest(i, int(a), int(p), int(o)) for i, (a, p, o) in enumerate(rows))


@dataclasses.dataclass
class ServeResult:
    """Per-step bytes and counts of one policy serving one trace (arrays over steps),
    and per-request times."""

    policy: str
    budget_bytes: int
    token_bytes: int  # bytes of one token in every layer's cache, measured from the cache arrays' shapes
    token_states: np.ndarray
    reserved: np.ndarray
    internal: np.ndarray
    external: np.ndarray
    running: np.ndarray  # sequences (samples) generating in the step
    tokens: np.ndarray  # tokens produced in the step
    arrival: np.ndarray  # per request: arrival step
    first_token: np.ndarray  # per request: step of its first token
    finish: np.ndarray  # per request: step its last sample finished
    preemptions: int = 0
    recomputed_tokens: int = 0  # prompt and generated tokens prefilled again after a preemption
    peak_tables: dict = dataclasses.field(default_factory=dict)  # paged: page tables at the busiest step
    peak_shared: frozenset = frozenset()  # paged: pages held by more than one sequence at that step

    @property
    def steps(self) -> int:
        return len(self.tokens)

    def waste_bytes(self) -> dict[str, int]:
        """The four categories summed over all steps: what the stacked waste bar shows."""
        return {"token states": int(self.token_states.sum()), "reservation": int(self.reserved.sum()),
                "internal fragmentation": int(self.internal.sum()),
                "external fragmentation": int(self.external.sum())}

    def shares(self) -> dict[str, float]:
        """Each category as a share of all KV memory that was allocated or stranded, over the whole run."""
        waste = self.waste_bytes()
        total = sum(waste.values())
        return {k: v / total if total else 0.0 for k, v in waste.items()}

    @property
    def utilisation(self) -> float:
        """Token-state bytes over allocated bytes (token states + reservation + internal), over the run."""
        allocated = self.token_states.sum() + self.reserved.sum() + self.internal.sum()
        return float(self.token_states.sum() / allocated) if allocated else 0.0

    @property
    def tokens_per_step(self) -> float:
        return float(self.tokens.sum() / self.steps) if self.steps else 0.0

    @property
    def latency_steps(self) -> np.ndarray:
        """Per request: steps from arrival to its last token."""
        return self.finish - self.arrival + 1


def reservation_slots(request: TraceRequest, reservation: str, max_context: int) -> int:
    """Slots a contiguous policy reserves for one sample of `request`."""
    if reservation == "max":
        return max_context
    if reservation == "pow2":
        return min(max_context, request.prompt + 2 ** math.ceil(math.log2(request.output)))
    return request.prompt + request.output


class _Arena:
    """Contiguous first-fit allocation over `capacity` slots: regions [start, start + size)."""

    def __init__(self, capacity: int):
        self.capacity, self.regions = capacity, {}
        self.version = 0  # changes whenever a region is freed: a request that did not fit may fit now

    def holes(self) -> list[int]:
        edges, at = sorted(self.regions.values()), 0
        sizes = []
        for start, size in edges:
            sizes.append(start - at)
            at = start + size
        return [s for s in [*sizes, self.capacity - at] if s > 0]

    def allocate(self, key: Hashable, size: int) -> bool:
        at = 0
        for start, length in sorted(self.regions.values()):
            if start - at >= size:
                break
            at = start + length
        if at + size > self.capacity:
            return False
        self.regions[key] = (at, size)
        return True

    def free(self, key: Hashable) -> None:
        del self.regions[key]
        self.version += 1


@functools.lru_cache(maxsize=64)
def _token_bytes(cfg: ModelConfig) -> int:
    """Bytes of one cached token in every layer, measured from the shapes of a one-page, one-slot pool."""
    return pool_bytes(cfg, 1, 1)


def serve(trace: tuple[TraceRequest, ...], policy: str, budget_bytes: int, cfg: ModelConfig,
          page_size: int = 16, n: int = 1, reservation: str = "max", max_steps: int = 200_000,
          max_running: int | None = None) -> ServeResult:
    """Serve `trace` under a KV-cache budget of `budget_bytes` with `policy` (see the module docstring).

    `n` parallel samples per request (one prompt, n continuations of the request's output length);
    `max_running` caps the requests any policy runs at once (an engine's batch limit; None: memory only).
    Raises a one-line ValueError when a single request could never fit in the budget.
    """
    if policy not in POLICIES:
        raise ValueError(f"policy: expected one of {', '.join(POLICIES)}, got {policy!r}")
    if reservation not in RESERVATIONS:
        raise ValueError(f"reservation: expected one of {', '.join(RESERVATIONS)}, got {reservation!r}")
    budget_bytes, n = positive_int("budget_bytes", budget_bytes), positive_int("n", n)
    page_size = positive_int("page_size", page_size)
    if not trace:
        raise ValueError("trace: expected at least one request")
    token_bytes = _token_bytes(cfg)
    cap = None if max_running is None else positive_int("max_running", max_running)
    if policy == "paged":
        return _serve_paged(trace, budget_bytes, cfg, page_size, n, token_bytes, max_steps, cap)
    return _serve_contiguous(trace, policy, budget_bytes, cfg, n, reservation, token_bytes, max_steps, cap)


def _result(policy, budget, token_bytes, rows, trace, first, finish, **extra) -> ServeResult:
    cols = np.asarray(rows, np.int64).reshape(-1, 6).T
    byte = [c * token_bytes for c in cols[:4]]
    return ServeResult(policy, budget, token_bytes, *byte, cols[4], cols[5],
                       np.array([r.arrival for r in trace]), np.array([first[r.id] for r in trace]),
                       np.array([finish[r.id] for r in trace]), **extra)


def _serve_contiguous(trace, policy, budget, cfg, n, reservation, token_bytes, max_steps,
                      max_running=None) -> ServeResult:
    arena = _Arena(budget // token_bytes)
    need = {r.id: reservation_slots(r, reservation, cfg.max_context) for r in trace}
    worst = max(trace, key=lambda r: need[r.id])
    if n * need[worst.id] > arena.capacity:
        raise ValueError(f"budget_bytes: request {worst.id} reserves {n} x {need[worst.id]} slots of "
                         f"{token_bytes} B = {n * need[worst.id] * token_bytes} B, more than the budget of "
                         f"{budget} B")
    pending, running, done_in_batch = list(trace), 0, []
    # step -> requests producing their last token
    ends: dict[int, list[TraceRequest]] = collections.defaultdict(list)
    # sums over running requests, kept as they join and leave (no per-request loop per step):
    # prompt tokens, tokens produced, final output lengths, slots reserved past the final length
    prompt_sum = produced_sum = output_sum = over_sum = held_done = 0
    first, finish, rows, step = {}, {}, [], 0
    blocked, tried = None, None  # the waiting request that did not fit, and the arena state it failed on
    while pending or running or done_in_batch:
        if step >= max_steps:
            raise ValueError(f"max_steps: the trace did not finish in {max_steps} steps")
        batch_open = policy == "contiguous" or not running
        if policy == "static" and batch_open and done_in_batch:
            for r in done_in_batch:  # the whole batch has finished: its regions are released together
                for s in range(n):
                    arena.free((r.id, s))
            done_in_batch, held_done = [], 0
        if blocked is not None and (not batch_open or tried != (arena.version, blocked.id)):
            blocked = None  # memory changed (or the batch closed): try again
        while (batch_open and blocked is None and pending and pending[0].arrival <= step
               and (max_running is None or running < max_running)):
            r = pending[0]
            placed = [k for k in ((r.id, s) for s in range(n)) if arena.allocate(k, need[r.id])]
            if len(placed) < n:
                for k in placed:
                    arena.free(k)
                blocked, tried = r, (arena.version, r.id)
                break
            pending.pop(0)
            running += 1
            first[r.id] = step
            ends[step + r.output - 1].append(r)
            prompt_sum, output_sum = prompt_sum + r.prompt, output_sum + r.output
            over_sum += need[r.id] - r.prompt - r.output
        produced_sum += running
        external = sum(h for h in arena.holes() if h < need[blocked.id]) if blocked is not None else 0
        rows.append(((prompt_sum + produced_sum) * n, (output_sum - produced_sum) * n,
                     (over_sum + held_done) * n, external, running * n, running * n))
        for r in ends.pop(step, ()):
            running -= 1
            finish[r.id] = step
            prompt_sum -= r.prompt
            produced_sum -= r.output
            output_sum -= r.output
            over_sum -= need[r.id] - r.prompt - r.output
            if policy == "static":
                done_in_batch.append(r)
                held_done += need[r.id]
            else:
                for s in range(n):
                    arena.free((r.id, s))
        step += 1
    return _result(policy, budget, token_bytes, rows, trace, first, finish)


def _paged_pages(r: TraceRequest, n: int, page_size: int, tokens: int) -> int:
    """Pages a request's n samples hold with `tokens` tokens each: the full prompt pages once,
    the rest per sample."""
    # a partly filled prompt page is copied by every sample that writes into it
    shared = r.prompt // page_size
    return shared + n * (pages_for(tokens, page_size) - shared)


def _serve_paged(trace, budget, cfg, page_size, n, token_bytes, max_steps, max_running=None) -> ServeResult:
    num_pages = budget // (token_bytes * page_size)
    worst = max(trace, key=lambda r: _paged_pages(r, n, page_size, r.prompt + r.output))
    worst_pages = _paged_pages(worst, n, page_size, worst.prompt + worst.output)
    if num_pages < worst_pages:
        raise ValueError(f"budget_bytes: request {worst.id} needs {worst_pages} pages of {page_size} tokens "
                         f"({worst_pages * page_size * token_bytes} B), the budget of {budget} B holds "
                         f"{num_pages}")
    pool = PageManager(num_pages, page_size)
    pending, running = list(trace), {}  # running: id -> [request, produced], in admission order
    held: dict[int, int] = {}  # preempted request -> tokens it had produced (prefilled again on readmission)
    first, finish, rows, step = {}, {}, [], 0
    preemptions = recomputed = peak = 0
    peak_tables, peak_shared = {}, frozenset()
    while pending or running:
        if step >= max_steps:
            raise ValueError(f"max_steps: the trace did not finish in {max_steps} steps")
        for rid in list(running):  # every running sample takes one more slot; preempt the newest when short
            while rid in running:
                # one token takes at most one page per sample (a fresh page or a copy)
                needed = sum(pool.pages_needed((rid, s), 1) for s in range(n))
                if pool.num_free >= n or needed <= pool.num_free:
                    for s in range(n):
                        pool.append((rid, s), 1)
                    break
                victim = next(reversed(running))
                for s in range(n):
                    pool.release((victim, s))
                r, held[victim] = running.pop(victim)
                pending.insert(0, r)  # it arrived before anything still waiting
                preemptions += 1
        while pending and pending[0].arrival <= step and (max_running is None or len(running) < max_running):
            r = pending[0]
            produced = held.get(r.id, 0)
            if _paged_pages(r, n, page_size, r.prompt + produced + 1) > pool.num_free:
                break
            pool.add((r.id, 0), r.prompt)
            for s in range(1, n):
                pool.fork((r.id, 0), (r.id, s))
            for s in range(n):  # the first write into the shared partly filled page copies it
                pool.append((r.id, s), produced + 1)
            recomputed += r.prompt + n * produced if r.id in held else 0
            held.pop(r.id, None)
            running[r.id] = [r, produced]
            first.setdefault(r.id, step)
            pending.pop(0)
        for state in running.values():
            state[1] += 1
        filled = pool.filled_slots()
        rows.append((filled, 0, pool.num_used * page_size - filled, 0, len(running) * n, len(running) * n))
        if len(running) > peak:
            peak, peak_shared = len(running), frozenset(pool.shared_pages())
            peak_tables = {seq: list(t) for seq, t in pool.tables.items()}
        for rid, (r, k) in list(running.items()):
            if k == r.output:
                for s in range(n):
                    pool.release((rid, s))
                del running[rid]
                finish[rid] = step
        step += 1
    return _result("paged", budget, token_bytes, rows, trace, first, finish, preemptions=preemptions,
                   recomputed_tokens=recomputed, peak_tables=peak_tables, peak_shared=peak_shared)
