"""The serving engine on SmolLM2: static batching, then continuous, + prefix caching, + chunked prefill, + speculation.

    .venv/bin/python benchmarks/serving.py --part engine          # about 5 minutes on 2 CPU cores
    .venv/bin/python benchmarks/serving.py --part engine --docs   # and rewrite the tables in docs/ and the README

One seeded trace: requests that share a system prompt (SmolLM2-Instruct's chat template and one instruction),
each with its own question; half of them ask the model to repeat a sentence, a workload where prompt lookup
finds drafts. Every configuration serves the same trace once to compile, then once timed; each adds one
technique to the one before. Requests/s = requests / wall time of the timed run; TTFT from the start of the
iteration a request arrives in to its first token; TPOT the mean gap between its later tokens; p50 and p99
over requests. Every call is padded to the engine's fixed shapes (8 rows, a 128-slot table), so a step's cost
does not depend on how many rows are real; that favours neither configuration.

The simulator (dantinox/serving.py) is then calibrated from the continuous run's own iterations: a decode
iteration's seconds, and the prefill tokens per second of prompt chunks, least squares; its paged policy serves
the same trace (same arrivals, lengths, pool and batch limit) and the calibrated model turns its schedule into
seconds. The ratio predicted / measured requests/s says how close the simulator is.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import jax
import numpy as np

import dantinox
from dantinox.paged import pool_bytes
from dantinox.serving import Request, serve

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "data" / "serving_engine.json"  # committed: docs/benchmarks.md and the README are written from it
N_REQUESTS, RATE, SEED = 16, 0.5, 0
BLOCK, NUM_BLOCKS, MAX_SEQS, MAX_LEN, CHUNK, SPECULATE = 16, 56, 8, 128, 32, 4
QUESTIONS = ["What is the capital of France?", "Name a primary colour.", "What is two plus two?",
             "Which planet is closest to the sun?", "What do bees make?", "How many legs does a spider have?"]
SENTENCES = ["The quick brown fox jumps over the lazy dog.", "A cache stores keys and values for every token.",
             "Paged attention keeps the cache in fixed-size blocks.", "Speculation drafts tokens and verifies them."]
SYSTEM = "You are a helpful assistant. Answer briefly and exactly."
CONFIGS = {  # each adds one technique to the one before
    "static batching": dict(batching="static", chunk_tokens=None, prefix_caching=False),
    "continuous batching": dict(chunk_tokens=None, prefix_caching=False),
    "+ prefix caching": dict(chunk_tokens=None),
    "+ chunked prefill": dict(chunk_tokens=CHUNK),
    "+ speculation": dict(chunk_tokens=CHUNK, speculate=SPECULATE),
}


def make_trace(tok) -> list[tuple[list[int], int, int]]:
    """(prompt ids, max new tokens, arrival step) per request: a shared system prompt, then the user's turn."""
    rng = np.random.default_rng(SEED)
    arrivals = np.floor(np.cumsum(rng.exponential(1 / RATE, N_REQUESTS))).astype(int)
    trace = []
    for i, arrival in enumerate(arrivals):
        user = f"Repeat exactly: {SENTENCES[i // 2 % len(SENTENCES)]}" if i % 2 else QUESTIONS[i // 2 % len(QUESTIONS)]
        text = (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
                "<|im_start|>assistant\n")
        trace.append((tok.encode(text), int(rng.integers(16, 33)), int(arrival)))
    return trace


def serve_once(model, trace, kw):
    engine = dantinox.Engine(model, num_blocks=NUM_BLOCKS, block_size=BLOCK, max_seqs=MAX_SEQS, max_len=MAX_LEN,
                             fixed_shapes=True, **{"prefix_caching": True, "speculate": 0, **kw})
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
                iterations=stats["steps"], hit_rate=stats["hit_rate"], blocks_saved=stats["blocks_saved"],
                acceptance_rate=stats["acceptance_rate"], preemptions=stats["preemptions"],
                compiled_shapes=stats["compiled_shapes"])


def calibrate(reports) -> tuple[float, float]:
    """(seconds of a decode iteration, prefill tokens per second) fitted to the engine's own iterations."""
    rows = [(sum(r.tokens for r in rep.rows if r.kind == "prefill"), rep.seconds) for rep in reports if rep.rows]
    fed, secs = np.array(rows, float).T
    A = np.stack([np.ones_like(fed), fed], axis=1)
    (step_s, per_token), *_ = np.linalg.lstsq(A, secs, rcond=None)
    return float(step_s), float(1 / max(per_token, 1e-12))


def predict(cfg, trace, step_s: float, prefill_rate: float) -> dict:
    """The simulator's paged policy on the same trace, its schedule turned into seconds by the calibrated model."""
    requests = tuple(Request(i, a, len(p), n) for i, (p, n, a) in enumerate(trace))
    budget = NUM_BLOCKS * pool_bytes(cfg, 1, BLOCK)
    res = serve(requests, "paged", budget, cfg.replace(max_context=MAX_LEN), block_size=BLOCK,
                max_running=MAX_SEQS)
    prefill = sum(r.prompt for r in requests) + res.recomputed_tokens
    busy = int((res.running > 0).sum())
    seconds = busy * step_s + prefill / prefill_rate
    return dict(steps=res.steps, seconds=seconds, requests_per_s=len(requests) / seconds,
                preemptions=res.preemptions)


def table(results: dict) -> str:
    rows = results["configs"]
    lines = ["| configuration | requests/s | vs previous | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) | iterations | "
             "prefix hit rate | draft acceptance | preemptions |", "|---|---|---|---|---|---|---|---|---|"]
    prev = None
    for name, r in rows.items():
        ratio = "" if prev is None else f"{r['requests_per_s'] / prev:.2f}×"
        lines.append(f"| {name} | {r['requests_per_s']:.2f} | {ratio} | {r['ttft_p50_ms']:,.0f} / "
                     f"{r['ttft_p99_ms']:,.0f} | {r['tpot_p50_ms']:,.0f} / {r['tpot_p99_ms']:,.0f} | "
                     f"{r['iterations']} | "
                     f"{r['hit_rate']:.0%} | {r['acceptance_rate']:.0%} | {r['preemptions']} |")
        prev = r["requests_per_s"]
    sim = results["simulator"]
    lines.append("")
    lines.append(f"Simulator calibrated from the continuous run ({sim['step_ms']:.0f} ms per decode iteration, "
                 f"{sim['prefill_tokens_per_s']:,.0f} prefill tokens/s): it predicts {sim['requests_per_s']:.2f} "
                 f"requests/s for continuous batching, {sim['ratio']:.2f}× the engine's measured "
                 f"{rows['continuous batching']['requests_per_s']:.2f}.")
    return "\n".join(lines)


def summary_line(results: dict) -> str:
    rows = results["configs"]
    first, last = rows["static batching"], rows["+ speculation"]
    return (f"SmolLM2-135M served by `dantinox.Engine` on {results['device']}, {N_REQUESTS} requests sharing a "
            f"system prompt: {first['requests_per_s']:.2f} requests/s with static batching, "
            f"{last['requests_per_s']:.2f} with continuous batching + prefix caching + chunked prefill + "
            f"speculation ({last['requests_per_s'] / first['requests_per_s']:.2f}×); every request's tokens equal "
            f"`dantinox.generate` alone (measured {results['date']}, docs/benchmarks.md).")


def write_docs(results: dict, root: Path) -> None:
    """Replace the marked sections of docs/benchmarks.md and README.md with tables from the stored results."""
    for path, text in ((root / "docs" / "benchmarks.md", table(results)), (root / "README.md", summary_line(results))):
        doc = path.read_text()
        start, end = "<!-- serving-engine:start -->", "<!-- serving-engine:end -->"
        if start not in doc:
            raise SystemExit(f"{path}: no {start} marker")
        head, rest = doc.split(start, 1)
        path.write_text(head + start + "\n" + text + "\n" + end + rest.split(end, 1)[1])


def run(docs: bool = False) -> dict:
    load_start = os.getloadavg()[0]
    cfg, model, tok = dantinox.load_pretrained("smollm2-135m")
    trace = make_trace(tok)
    for kw in CONFIGS.values():  # compile every program first
        serve_once(model, trace, kw)
    results, reports_of = {}, {}
    for name, kw in CONFIGS.items():
        engine, reports, seconds = serve_once(model, trace, kw)
        results[name], reports_of[name] = summarise(engine, seconds), reports
    step_s, prefill_rate = calibrate(reports_of["continuous batching"])
    sim = predict(cfg, trace, step_s, prefill_rate)
    sim.update(step_ms=1e3 * step_s, prefill_tokens_per_s=prefill_rate,
               ratio=sim["requests_per_s"] / results["continuous batching"]["requests_per_s"])
    out = dict(configs=results, simulator=sim, requests=N_REQUESTS, rate=RATE, seed=SEED, block_size=BLOCK,
               num_blocks=NUM_BLOCKS, max_seqs=MAX_SEQS, chunk_tokens=CHUNK, speculate=SPECULATE,
               device=f"{jax.default_backend()} ({os.cpu_count()} cores)", date=time.strftime("%Y-%m-%d %H:%M"),
               load_average_start_end=[round(load_start, 1), round(os.getloadavg()[0], 1)])
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1))
    print(table(out))
    print("\n" + summary_line(out))
    print(f"\nwrote {RESULTS}")
    if docs:
        write_docs(out, HERE.parent)
    return out
