"""`Engine`: the serving engine's front, which wires the scheduler, the KV manager and the runner
(dantinox/engine/__init__.py describes the engine; each part's module, what it owns).

    engine = dantinox.Engine(model, num_pages=64, page_size=16, prefix_caching=True, chunk_tokens=64)
    rid = engine.add(prompt_ids, max_new_tokens=32, arrival_step=0)
    report = engine.step()          # one iteration: what was scheduled, emitted, hit, preempted
    outputs = engine.run()          # {rid: generated token ids}

One `step()`: the scheduler plans the iteration (allocating pages through the KV manager as it goes), the
runner runs the plan over the KV manager's layers, the scheduler takes out finished requests, and the KV
manager checks its pool; the report is read from all three.
"""

from __future__ import annotations

import collections
from typing import Any

from dantinox.architectures.model import Transformer
from dantinox.cache.page_pool import pages_for
from dantinox.checks import positive_int
from dantinox.engine.kv_manager import KVManager
from dantinox.engine.records import Request, RequestState, StepReport
from dantinox.engine.runner import Runner, generator_state
from dantinox.engine.scheduler import Scheduler

PREEMPT = ("recompute", "swap")


class Engine:
    """Continuous batching over a paged pool, with prefix caching,
    chunked prefill and prompt-lookup speculation.

    `num_pages` pages of `page_size` tokens per paged layer; `chunk_tokens` tokens fed per iteration (None:
    whole prompts); `speculate` drafts verified per decode (0: off); at most `max_seqs` requests run at once.
    `batching="static"` admits a new batch only when the running one has finished (the baseline).
    `fixed_shapes=True` pads every call to max_seqs rows and the full table width, and a decode to the
    verify's 1 + speculate tokens, so a run compiles at most two programs (decode or verify, prompt chunk):
    for small models and tests, where compiling dominates.
    `max_len` (default the model's max_context) is the longest request (prompt + new tokens) it accepts.
    Sliding-window layers with prefix caching hold chunk_tokens slots past their window per running request
    (so with chunk_tokens=None, max_len slots: pass a chunk size, or prefix_caching=False, to keep rings
    small). Greedy or sampled per request (`add`); a request stops after `max_new_tokens` or at a token of its
    `stop_ids`. A call with a sampling row is a program of its own (greedy calls draw no random numbers).
    Its parts: `engine.scheduler`, `engine.kv` (the KV manager) and `engine.runner`.
    """

    def __init__(self, model: Transformer, num_pages: int, page_size: int = 16, prefix_caching: bool = True,
                 chunk_tokens: int | None = 64, speculate: int = 0, max_seqs: int = 8,
                 batching: str = "continuous", preempt: str = "recompute", ngram: int = 3,
                 fixed_shapes: bool = False, max_len: int | None = None):
        cfg = model.cfg
        if cfg.paradigm != "autoregressive":
            raise ValueError("model: the engine serves autoregressive models; this one has "
                             f"paradigm={cfg.paradigm!r}")
        self.page_size = positive_int("page_size", page_size)
        self.chunk_tokens = None if chunk_tokens is None else positive_int("chunk_tokens", chunk_tokens)
        speculate = positive_int("speculate", speculate, minimum=0)
        max_seqs = positive_int("max_seqs", max_seqs)
        ngram = positive_int("ngram", ngram)
        if preempt not in PREEMPT:
            raise ValueError(f"preempt: expected one of {', '.join(PREEMPT)}, got {preempt!r}")
        self.model = model  # decoded as it is: the engine's caches are paged, the model is not rebuilt
        self.cfg = cfg.with_cache(cache_layout="paged", page_size=self.page_size)
        if self.cfg.state_layers and (prefix_caching or speculate):
            name = "prefix_caching" if prefix_caching else "speculate"
            raise ValueError(f"{name}: layer {self.cfg.state_layers[0]} keeps a recurrent state, which "
                             "cannot be cut back to a page boundary or past rejected drafts; pass "
                             "prefix_caching=False and speculate=0")
        rings = [w for w in (*self.cfg.layer_windows, *self.cfg.layer_chunks) if w is not None]
        if rings and speculate + 1 > min(min(rings), self.cfg.max_context):
            raise ValueError(f"speculate: 1 + {speculate} tokens per verify must fit the smallest ring "
                             f"({min(rings)} slots)")
        self.max_len = cfg.max_context if max_len is None else positive_int("max_len", max_len)
        if self.max_len > cfg.max_context:
            raise ValueError(f"max_len: at most the model's max_context={cfg.max_context}, "
                             f"got {self.max_len}")
        self.kv = KVManager(self.cfg, num_pages, self.page_size, max_seqs, self.max_len, prefix_caching,
                            self.chunk_tokens, swap=preempt == "swap")
        self.scheduler = Scheduler(self.kv, max_seqs, self.chunk_tokens, speculate, ngram, batching)
        max_pages = min(pages_for(self.max_len, self.page_size), self.kv.pool.num_pages)  # table width
        self.runner = Runner(model, speculate, max_seqs, self.max_len, max_pages, self.chunk_tokens,
                             fixed_shapes, self.cfg)

    # What the parts hold, read through the engine.
    @property
    def pool(self):
        return self.kv.pool

    @property
    def requests(self) -> dict[int, Request]:
        return self.scheduler.requests

    @property
    def shapes(self) -> set[tuple]:
        return self.runner.shapes

    @property
    def steps(self) -> int:
        return self.scheduler.steps

    # Requests.
    def add(self, prompt_ids: Any, max_new_tokens: int, arrival_step: int = 0, stop_ids: Any = (),
            temperature: float = 0.0, top_k: int | None = None, seed: int = 0) -> int:
        """Queue a request; returns its id. It becomes eligible at iteration `arrival_step`.

        temperature 0 is greedy; above it, tokens are drawn (after a top-k cut when top_k is set) from a
        generator seeded with `seed`, as `dantinox.generate(model, prompt, n, temperature=, top_k=, seed=)`
        draws them for this request alone.
        """
        req = Request.checked(len(self.requests), prompt_ids, max_new_tokens, arrival_step, stop_ids,
                              temperature, top_k, seed, vocab_size=self.cfg.vocab_size, max_len=self.max_len,
                              page_size=self.page_size, num_pages=self.pool.num_pages)
        if req.temperature > 0:
            req.rng = generator_state(req.seed)
        self.scheduler.add(req)
        return req.rid

    @property
    def finished(self) -> bool:
        return self.scheduler.finished

    def run(self, max_steps: int = 1_000_000) -> dict[int, list[int]]:
        """Step until every request has finished; {rid: generated token ids}."""
        while not self.finished:
            if self.steps >= max_steps:
                raise RuntimeError(f"max_steps: {max_steps} iterations did not finish the queue")
            self.step()
        return self.outputs()

    def outputs(self) -> dict[int, list[int]]:
        return {rid: r.generated for rid, r in self.requests.items()}

    # The iteration.
    def step(self) -> StepReport:
        """Schedule and run one iteration; returns what happened in it."""
        plan = self.scheduler.schedule()
        self.kv.layers, ran = self.runner.run(self.kv.layers, plan.feeds)
        finished = self.scheduler.finish()
        running = self.scheduler.running
        self.kv.end_step(running)
        held = collections.Counter(b for r in running for b in r.pages)
        return StepReport(
            step=self.steps - 1, rows=tuple(ran.rows), emitted=ran.emitted, admitted=tuple(plan.admitted),
            finished=tuple(finished), preempted=tuple(plan.preempted), hits=plan.hits,
            budget=self.chunk_tokens, fed=plan.fed, tables={r.rid: tuple(r.pages) for r in running},
            shared=frozenset(b for b, c in held.items() if c > 1), free=self.pool.num_free,
            cached_free=self.pool.num_cached_free, waiting=tuple(r.rid for r in self.scheduler.waiting),
            seconds=ran.seconds, calls=tuple(ran.calls))

    # Reports.
    def stats(self) -> dict[str, float]:
        """Counts over the whole run: prefix hits, pages saved, drafts accepted, preemptions, swaps.

        hit_rate is the tokens found in the prefix cache over the tokens looked up at every admission (a
        recomputed request is looked up again); pages_saved counts the pages those hits did not compute.
        """
        c = self.kv.counts + self.runner.counts + self.scheduler.counts
        return {
            "steps": self.steps,
            "prompt_tokens": c["prompt_tokens"],
            "hit_tokens": c["hit_tokens"],
            "hit_rate": c["hit_tokens"] / c["prompt_tokens"] if c["prompt_tokens"] else 0.0,
            "pages_saved": c["hit_pages"],
            "drafts": c["drafts"],
            "accepted": c["accepted"],
            "acceptance_rate": c["accepted"] / c["drafts"] if c["drafts"] else 0.0,
            "preemptions": c["preemptions"],
            "swaps_out": c["swaps_out"],
            "swap_bytes": self.kv.swap_bytes,
            "swap_seconds": self.kv.swap_seconds,
            "evicted_pages": self.pool.evicted,
            "compiled_shapes": len(self.shapes),
        }

    def latencies(self) -> dict[int, tuple[float, float | None]]:
        """Per finished request: (time to first token, mean time per output token after it), in seconds."""
        return {rid: r.latency() for rid, r in self.requests.items()
                if r.state is RequestState.FINISHED and r.token_times}
