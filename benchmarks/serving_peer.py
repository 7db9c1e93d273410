"""The serving engine against Hugging Face transformers' continuous batching: one trace replayed in real time.

    nice -n 10 .venv/bin/python benchmarks/serving_peer.py     # a few minutes on 2 CPU cores
    .venv/bin/python benchmarks/doc_tables.py                  # the docs table from its JSON

The trace is benchmarks/serving_engine.py's (SmolLM2-Instruct's chat template around one shared system
prompt, each request's own question or sentence to repeat, 16 to 32 new tokens each, seeded), with its
Poisson arrivals read in seconds: ARRIVALS_PER_S requests per second on average. Both servers honour them: a
request is handed over when its second comes (`Engine.add` between iterations here; `add_request` from the
peer's main thread while its manager's thread generates, benchmarks/peer_hf_serving.py). Both decode greedily
in float32 from the same GGUF file to each request's full length (no stop token), with the same paged KV
budget (NUM_PAGES pages of PAGE tokens), at most MAX_SEQS requests running and CHUNK tokens computed per
iteration; the peer's prefix sharing (`allow_block_sharing`, its default) is on. `dantinox.Engine` runs
with prefix caching on and off; every server gets a fresh engine or manager per replay, so no prefix cache
carries over.

Each server first serves the trace untimed (the engine twice: it compiles its programs, which also persist
in the compilation cache), then ROUNDS timed rounds go round-robin over the servers, in a rotating order; a
server's row is its fastest round (requests/s). TTFT: from a request's arrival second to its first token;
TPOT: the mean gap between its later tokens; p50 and p99 over the requests. Requests/s: requests over the
time from the replay's start to the last token. The engine's programs compiled (or read back from the cache)
during a timed round are counted: a schedule that meets a new shape bucket pays for it inside the round; and
the tokens its calls computed (each call's rows and length rounded up to its shape bucket) over the tokens it
fed. The peer runs in benchmarks/.peer-venv (benchmarks/decode.py builds it). Writes
benchmarks/data/serving-peer.json (committed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

import jax
import numpy as np
from decode import ensure_peer_env
from serving_engine import CHUNK, MAX_LEN, MAX_SEQS, NUM_PAGES, PAGE, RATE, SEED, arrival_times, make_trace

import dantinox
from dantinox.architectures.pretrained import catalogue_file

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "data" / "serving-peer.json"  # committed: benchmarks/doc_tables.py renders the docs from it
MODEL = "smollm2-135m"
ARRIVALS_PER_S, ROUNDS = 4.0, 2
WARMUP_REPLAYS = 2  # untimed replays per engine: real time varies the schedule, and with it the shapes met
ENGINES = {"dantinox.Engine, prefix caching on": dict(chunk_tokens=CHUNK),
           "dantinox.Engine, prefix caching off": dict(chunk_tokens=CHUNK, prefix_caching=False)}
PEER = "transformers continuous batching"


class Compiles:
    """Counts XLA compilations (a persistent-cache read included) from jax.monitoring's events."""

    def __init__(self):
        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self)

    def __call__(self, event: str, _seconds: float, **_) -> None:
        self.count += event == "/jax/core/compile/backend_compile_duration"


def serve_engine(model, trace, seconds: np.ndarray, kw: dict) -> tuple[list[dict], dict]:
    """One real-time replay through a new engine: each request's tokens and their times from the start; the
    prefix hit rate (prompt tokens found in the prefix cache over those looked up); the tokens its calls
    computed (rows x length of each call's shape bucket, padding included) over the tokens fed; and the
    seconds of its compiled calls in iterations that prefilled (a call longer than one token) and in the
    others (decodes only)."""
    engine = dantinox.Engine(model, num_pages=NUM_PAGES, page_size=PAGE, max_seqs=MAX_SEQS, max_len=MAX_LEN,
                             **{"prefix_caching": True, "speculate": 0, **kw})
    rids, computed, fed, start = [], 0, 0, time.perf_counter()
    call_s = {"prefill": 0.0, "decode": 0.0}
    while len(rids) < len(trace) or not engine.finished:
        while len(rids) < len(trace) and start + seconds[len(rids)] <= time.perf_counter():
            prompt, new, _ = trace[len(rids)]
            rids.append(engine.add(prompt, new, arrival_step=engine.steps))  # eligible in the next iteration
        if engine.finished:  # nothing to run until the next request arrives
            time.sleep(max(0.0, start + seconds[len(rids)] - time.perf_counter()))
        else:
            report = engine.step()
            computed += sum(b * t for b, t in report.calls)
            fed += report.fed
            call_s["prefill" if any(t > 1 for _, t in report.calls) else "decode"] += report.seconds
    done = [engine.requests[rid] for rid in rids]
    return ([dict(tokens=r.generated, times=[t - start for t in r.token_times]) for r in done],
            dict(hit_rate=engine.stats()["hit_rate"], computed_per_fed=computed / fed,
                 prefill_iterations_s=call_s["prefill"], decode_iterations_s=call_s["decode"]))


def summarise(requests: list[dict], seconds: np.ndarray) -> dict:
    ttft = np.array([r["times"][0] - s for r, s in zip(requests, seconds, strict=True)])
    tpot = np.array([(r["times"][-1] - r["times"][0]) / (len(r["times"]) - 1) for r in requests])
    wall = max(r["times"][-1] for r in requests)
    return dict(seconds=wall, requests_per_s=len(requests) / wall,
                output_tokens_per_s=sum(len(r["tokens"]) for r in requests) / wall,
                ttft_p50_ms=1e3 * float(np.percentile(ttft, 50)),
                ttft_p99_ms=1e3 * float(np.percentile(ttft, 99)),
                tpot_p50_ms=1e3 * float(np.percentile(tpot, 50)),
                tpot_p99_ms=1e3 * float(np.percentile(tpot, 99)))


class Peer:
    """benchmarks/peer_hf_serving.py in the peer venv: loads the model (while the engine compiles), then
    serves the trace per call."""

    def __init__(self, spec: dict):
        argv = [str(ensure_peer_env()), str(HERE / "peer_hf_serving.py"), json.dumps(spec)]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info: dict = {}

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"peer: exited with {self.proc.wait()} before answering")
        return json.loads(line)

    def serve(self) -> tuple[list[dict], dict]:
        """Each request's tokens and times, and the prefix hit rate; SystemExit with the peer's one-line error
        where serving failed."""
        if not self.info:  # its first line: loaded, and its versions
            self.info = self._answer()
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        out = self._answer()
        if "error" in out:
            raise SystemExit(f"peer: transformers' continuous batching failed here: {out['error']}")
        return out["requests"], dict(hit_rate=out["hit_rate"])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def results_file(rate: float) -> Path:
    """serving-peer.json at the default rate; serving-peer-R-per-s.json at another."""
    return RESULTS if rate == ARRIVALS_PER_S else RESULTS.with_name(f"serving-peer-{rate:g}-per-s.json")


def run(rounds: int, requests: int | None = None, rate: float = ARRIVALS_PER_S) -> dict:
    dantinox.enable_compilation_cache()  # persist compiled programs across runs, as the CLI does
    loads = [os.getloadavg()[0]]
    _, model, tok = dantinox.load_pretrained(MODEL)
    trace = make_trace(tok)[:requests]
    seconds = arrival_times(np.random.default_rng(SEED))[:requests] * RATE / rate  # iterations -> seconds
    cb = dict(page_size=PAGE, num_blocks=NUM_PAGES, max_requests_per_batch=MAX_SEQS, max_batch_tokens=CHUNK)
    peer = Peer(dict(gguf=str(catalogue_file(MODEL)), threads=os.cpu_count(), continuous_batching=cb,
                     trace=[dict(prompt=p, new=n, arrival_s=float(s)) for (p, n, _), s in zip(trace, seconds,
                                                                                             strict=True)]))
    servers = {name: (lambda kw=kw: serve_engine(model, trace, seconds, kw)) for name, kw in ENGINES.items()}
    servers[PEER] = peer.serve
    compiles = Compiles()
    try:
        start = time.perf_counter()
        for name, serve in servers.items():  # untimed: the engine compiles its programs, the peer warms up
            for _ in range(1 if name == PEER else WARMUP_REPLAYS):
                serve()
        warmup = time.perf_counter() - start
        loads.append(os.getloadavg()[0])
        best, outputs, compiled = {}, {}, {}
        names = list(servers)
        for i in range(rounds):  # round-robin, in a rotating order: background load hits every server alike
            for name in names[i % len(names):] + names[:i % len(names)]:
                before = compiles.count
                requests, counts = servers[name]()
                compiled[name] = compiled.get(name, 0) + compiles.count - before
                loads.append(os.getloadavg()[0])
                row = dict(summarise(requests, seconds), **counts)
                if name not in best or row["requests_per_s"] > best[name]["requests_per_s"]:
                    best[name], outputs[name] = row, [r["tokens"] for r in requests]
    finally:
        peer.close()
    for name in ENGINES:
        best[name]["compiles_in_timed_rounds"] = compiled[name]
    ours = outputs[next(iter(ENGINES))]
    out = dict(servers=best, peer=dict(name=PEER, continuous_batching=cb, **peer.info),
               engines_agree=all(outputs[name] == ours for name in ENGINES),
               same_tokens_as_peer=sum(a == b for a, b in zip(ours, outputs[PEER], strict=True)),
               same_first_token_as_peer=sum(a[0] == b[0] for a, b in zip(ours, outputs[PEER], strict=True)),
               model=MODEL, requests=len(trace), arrivals_per_s=rate, seed=SEED,
               arrival_span_s=float(seconds[-1]), rounds=rounds, page_size=PAGE, num_pages=NUM_PAGES,
               max_seqs=MAX_SEQS, chunk_tokens=CHUNK, prompt_tokens=[len(p) for p, _, _ in trace],
               new_tokens=[n for _, n, _ in trace], warmup_seconds=warmup,
               device=f"{jax.default_backend()} ({os.cpu_count()} cores)",
               date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               load_avg_1min=[round(x, 2) for x in loads])
    path = results_file(rate)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    import doc_tables

    print(doc_tables.serving_peer(out))
    print(f"\nwrote {path}; benchmarks/doc_tables.py renders it into docs/benchmarks.md")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--requests", type=int, default=None, help="the trace's first N requests (quick checks)")
    ap.add_argument("--arrivals-per-s", type=float, default=ARRIVALS_PER_S,
                    help="the offered load; above the servers' capacity, requests/s is their throughput")
    args = ap.parse_args()
    for name in ("rounds", "requests"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise SystemExit(f"--{name}: expected a whole number >= 1, got {value}")
    if not args.arrivals_per_s > 0:
        raise SystemExit(f"--arrivals-per-s: expected a number > 0, got {args.arrivals_per_s}")
    run(args.rounds, args.requests, args.arrivals_per_s)


if __name__ == "__main__":
    main()
