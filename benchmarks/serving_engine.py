"""The serving engine on SmolLM2: static batching, then continuous, + prefix caching, + chunked prefill, + speculation.

    nice -n 10 .venv/bin/python benchmarks/serving.py --part engine   # a few minutes on 2 CPU cores
    .venv/bin/python benchmarks/doc_tables.py                         # the README and docs tables from its JSON

One seeded trace: requests that share a system prompt (SmolLM2-Instruct's chat template and one instruction),
each with its own question; half of them ask the model to repeat a sentence, a workload where prompt lookup
finds drafts. Every configuration adds one technique to the one before. Each serves the trace once to compile
(programs also persist in the compilation cache across runs), then ROUNDS timed rounds, round-robin over the
configurations so background load hits all alike; a configuration's row is its fastest round. Calls are
rounded up to the engine's shape buckets (rows, table width, chunk length), so an iteration costs about what
its real rows compute: a prefix hit shortens its prefill call. Requests/s = requests / wall time of the run;
TTFT from the start of the iteration a request arrives in to its first token; TPOT the mean gap between its
later tokens; p50 and p99 over requests. The 1-minute load average is sampled before and after every run.

The simulator (dantinox/engine/simulator.py) is calibrated from the continuous run's own iterations: seconds of an
iteration = a per compiled call + b per token the call computes, padding included (least squares; a roofline's
two terms, the weights read once per call and the arithmetic per token), plus the host's scheduling time per
iteration. The simulator then serves the same trace (same arrivals, lengths, pool and batch limit) with its
paged policy and its static policy, and the calibrated model turns each schedule into seconds:
predicted / measured requests/s says how close it is, in-sample for continuous batching (the fit's own run,
the simulator's own schedule) and out-of-sample for static batching.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import jax
import numpy as np

import dantinox
from dantinox.cache.paged import pool_bytes
from dantinox.engine.runner import bucket_of, power_of_two, shape_buckets  # the engine's shape buckets
from dantinox.engine.simulator import TraceRequest, serve

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "data" / "serving-engine.json"  # committed: benchmarks/doc_tables.py renders the docs from it
N_REQUESTS, RATE, SEED, ROUNDS = 16, 0.5, 0, 2
PAGE, NUM_PAGES, MAX_SEQS, MAX_LEN, CHUNK, SPECULATE = 16, 56, 8, 128, 32, 4
QUESTIONS = ["What is the capital of France?", "Name a primary colour.", "What is two plus two?",
             "Which planet is closest to the sun?", "What do bees make?", "How many legs does a spider have?"]
SENTENCES = ["The quick brown fox jumps over the lazy dog.", "A cache stores keys and values for every token.",
             "Paged attention keeps the cache in fixed-size pages.", "Speculation drafts tokens and verifies them."]
SYSTEM = "You are a helpful assistant. Answer briefly and exactly."
CONFIGS = {  # each adds one technique to the one before
    "static batching": dict(batching="static", chunk_tokens=None, prefix_caching=False),
    "continuous batching": dict(chunk_tokens=None, prefix_caching=False),
    "+ prefix caching": dict(chunk_tokens=None),
    "+ chunked prefill": dict(chunk_tokens=CHUNK),
    "+ speculation": dict(chunk_tokens=CHUNK, speculate=SPECULATE),
}


def arrival_times(rng: np.random.Generator) -> np.ndarray:
    """When each request arrives, in iterations (Poisson, RATE per iteration): the trace's first draws."""
    return np.cumsum(rng.exponential(1 / RATE, N_REQUESTS))


def make_trace(tok) -> list[tuple[list[int], int, int]]:
    """(prompt ids, max new tokens, arrival step) per request: a shared system prompt, then the user's turn."""
    rng = np.random.default_rng(SEED)
    arrivals = np.floor(arrival_times(rng)).astype(int)
    trace = []
    for i, arrival in enumerate(arrivals):
        user = f"Repeat exactly: {SENTENCES[i // 2 % len(SENTENCES)]}" if i % 2 else QUESTIONS[i // 2 % len(QUESTIONS)]
        text = (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
                "<|im_start|>assistant\n")
        trace.append((tok.encode(text), int(rng.integers(16, 33)), int(arrival)))
    return trace


def serve_once(model, trace, kw):
    engine = dantinox.Engine(model, num_pages=NUM_PAGES, page_size=PAGE, max_seqs=MAX_SEQS, max_len=MAX_LEN,
                             **{"prefix_caching": True, "speculate": 0, **kw})
    for prompt, new, arrival in trace:
        engine.add(prompt, new, arrival_step=arrival)
    reports, start = [], time.perf_counter()
    while not engine.finished:
        reports.append(engine.step())
    return engine, reports, time.perf_counter() - start


def summarise(engine, seconds: float) -> dict:
    lat = engine.latencies()
    ttft = np.array([t for t, _ in lat.values()])
    tpot = np.array([p for _, p in lat.values() if p is not None])
    stats = engine.stats()
    generated = sum(len(v) for v in engine.outputs().values())
    return dict(seconds=seconds, requests_per_s=len(lat) / seconds, output_tokens_per_s=generated / seconds,
                ttft_p50_ms=1e3 * float(np.percentile(ttft, 50)), ttft_p99_ms=1e3 * float(np.percentile(ttft, 99)),
                tpot_p50_ms=1e3 * float(np.percentile(tpot, 50)), tpot_p99_ms=1e3 * float(np.percentile(tpot, 99)),
                iterations=stats["steps"], hit_rate=stats["hit_rate"], pages_saved=stats["pages_saved"],
                acceptance_rate=stats["acceptance_rate"], preemptions=stats["preemptions"],
                compiled_shapes=stats["compiled_shapes"])


def calibrate(reports, wall_seconds: float) -> dict:
    """The step-time model fitted to the engine's own iterations: a cost per compiled call (reading the weights)
    plus a cost per token it computes, padding included (B x T of the call's shape bucket)."""
    busy = [rep for rep in reports if rep.calls]
    X = np.array([[len(rep.calls), sum(b * t for b, t in rep.calls)] for rep in busy], float)
    (call_s, token_s), *_ = np.linalg.lstsq(X, np.array([rep.seconds for rep in busy]), rcond=None)
    host = (wall_seconds - sum(rep.seconds for rep in reports)) / len(reports)  # scheduling, not in the calls
    return dict(call_ms=1e3 * call_s, token_ms=1e3 * token_s, host_ms_per_iteration=1e3 * host)


def predict(cfg, trace, model: dict, policy: str) -> dict:
    """The simulator's `policy` on the same trace, its schedule turned into seconds by the calibrated model.

    Each simulated step runs the engine's calls: one for its decoding rows, one for the prompts that join
    (prefilled whole as they join), each rounded up to the engine's shape buckets.
    """
    requests = tuple(TraceRequest(i, a, len(p), n) for i, (p, n, a) in enumerate(trace))
    budget = NUM_PAGES * pool_bytes(cfg, 1, PAGE)
    res = serve(requests, policy, budget, cfg.replace(max_context=MAX_LEN), page_size=PAGE,
                reservation="oracle", max_running=MAX_SEQS)
    if res.recomputed_tokens:
        raise SystemExit("predict: the simulator preempted; the engine's runs here did not, so compare nothing")
    lengths = shape_buckets(MAX_LEN, 8)
    seconds = 0.0
    for step in range(res.steps):
        joining = [r.prompt for r in requests if res.first_token[r.id] == step]
        decoding = int(res.running[step]) - len(joining)
        calls = [(power_of_two(decoding, MAX_SEQS), 1)] if decoding else []
        if joining:
            calls.append((power_of_two(len(joining), MAX_SEQS), bucket_of(lengths, max(joining))))
        seconds += (model["host_ms_per_iteration"] + len(calls) * model["call_ms"]
                    + sum(b * t for b, t in calls) * model["token_ms"]) / 1e3
    return dict(steps=res.steps, seconds=seconds, requests_per_s=len(requests) / seconds)


def run() -> dict:
    dantinox.enable_compilation_cache()  # persist compiled programs across runs, as the CLI does
    loads = [os.getloadavg()[0]]
    cfg, model, tok = dantinox.load_pretrained("smollm2-135m")
    trace = make_trace(tok)
    start = time.perf_counter()
    for kw in CONFIGS.values():  # compile every program first
        serve_once(model, trace, kw)
    warmup = time.perf_counter() - start
    loads.append(os.getloadavg()[0])
    best = {}
    for _ in range(ROUNDS):  # round-robin: background load hits every configuration alike
        for name, kw in CONFIGS.items():
            engine, reports, seconds = serve_once(model, trace, kw)
            loads.append(os.getloadavg()[0])
            if name not in best or seconds < best[name][2]:
                best[name] = (engine, reports, seconds)
    results = {name: summarise(engine, seconds) for name, (engine, _, seconds) in best.items()}
    outputs = {name: engine.outputs() for name, (engine, _, _) in best.items()}
    alone = dantinox.generate(model, [p for p, _, _ in trace], max(n for _, n, _ in trace))  # ragged: rows alone
    want = {i: list(np.asarray(row)[len(p):len(p) + n])
            for i, (row, (p, n, _)) in enumerate(zip(alone, trace, strict=True))}
    same = all(out == want for out in outputs.values())
    _, reports, seconds = best["continuous batching"]
    step_model = calibrate(reports, seconds)
    simulator = {}
    for name, policy in (("continuous batching", "paged"), ("static batching", "static")):
        sim = predict(cfg, trace, step_model, policy)
        simulator[name] = dict(sim, ratio=sim["requests_per_s"] / results[name]["requests_per_s"])
    out = dict(configs=results, simulator=dict(step_model=step_model, predictions=simulator),
               tokens_equal_generate_alone=same,
               requests=N_REQUESTS, rate=RATE, seed=SEED, rounds=ROUNDS, page_size=PAGE, num_pages=NUM_PAGES,
               max_seqs=MAX_SEQS, max_len=MAX_LEN, chunk_tokens=CHUNK, speculate=SPECULATE,
               prompt_tokens=[len(p) for p, _, _ in trace], warmup_seconds=warmup,
               device=f"{jax.default_backend()} ({os.cpu_count()} cores)",
               date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               load_avg_1min=[round(x, 2) for x in loads])
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1))
    sys.path.insert(0, str(HERE))
    import doc_tables

    print(doc_tables.serving_engine(out))
    print(f"\nwrote {RESULTS}; benchmarks/doc_tables.py renders it into the README and docs/benchmarks.md")
    return out
