"""Decode benchmark for the reference model (a benchmark, not a test).

    .venv/bin/python benchmarks/decode.py            # dantinox only
    .venv/bin/python benchmarks/decode.py --peer     # also Hugging Face LlamaForCausalLM (static cache, torch CPU)
    .venv/bin/python benchmarks/decode.py --model smollm2-135m --peer   # a published model, three weight modes
    .venv/bin/python benchmarks/decode.py --grid --peer --rounds 5   # the tok/s grid alone, taking turns

Prints a markdown table and writes benchmarks/results/decode.json (a published model: the committed
benchmarks/data/decode-NAME.json, which benchmarks/doc_tables.py renders into the docs). The peer runs in its own
virtual environment (benchmarks/.peer-venv, created on first use with torch==2.13.0 and transformers) so the
project's environment never holds torch.

"% of roofline" is the roofline time of the whole generate() call, the prefill plus every decode step
at the length it has filled (max(bytes / bandwidth, FLOPs / peak), dantinox/accounting/roofline.py, with the
bandwidth and matmul peak measured in the same run), divided by the measured time. Two A/B tables time
the choices dantinox makes for decode steps, each against the alternative in the same run, interleaved:
the attention arrangements for one new token (dantinox/architectures/attention.py: the general one, _attend_one_token as
matmuls or as reductions, and the kernel of dantinox/backend/pool_kernel.py), each forced through
dantinox.architectures.attention's arrangement rules, and
the batch-1 XLA option (dantinox/generation/generate.py, compiler_options) against the defaults.

`--grid --peer` times the grid alone: the peer is a long-lived process answering one timed generate() per
request, and dantinox (this process) and the peer take turns cell by cell, each first every other round,
`--rounds` rounds, the bandwidth probe once a round; the table gives each side's median tok/s and its spread
over the rounds and is stored in the committed benchmarks/data/decode-reference.json.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import doc_tables
import jax
import numpy as np
from common import best_of
from flax import nnx

import dantinox
import dantinox.backend.cpu as cpu
import dantinox.backend.pool_kernel as pool_kernel
from dantinox.accounting.roofline import generate_seconds, measure_machine, run_decode, timing_state
from dantinox.backend.xla_cpu import VECTOR_512
from dantinox.generation.generate import bucket_for, compiler_options, decode_loop_jit

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
PEER_VENV = HERE / ".peer-venv"
PEER_PACKAGES = ("torch==2.13.0", "transformers", "gguf", "accelerate", "jinja2")
VARIANTS = {"MHA": dict(), "GQA (K=2)": dict(kv_heads=2)}
MORE_VARIANTS = {**VARIANTS, "MQA": dict(kv_heads=1)}  # the attention-arrangement A/B also covers K = 1
BATCHES = (1, 8)
PROMPT, NEW = 32, 256


def model_for(variant: str, **kw) -> dantinox.Transformer:
    cfg = dantinox.ModelConfig.preset("reference", **MORE_VARIANTS[variant], **kw)
    return dantinox.Transformer(cfg, rngs=nnx.Rngs(0))


def prompt(batch: int, length: int = PROMPT) -> np.ndarray:
    return np.random.RandomState(0).randint(0, 256, (batch, length)).astype(np.int32)


def decode_grid(repeats: int) -> dict[str, float]:
    out = {}
    for variant in VARIANTS:
        model = model_for(variant)
        for batch in BATCHES:
            p = prompt(batch)
            seconds = best_of(lambda: dantinox.generate(model, p, NEW), repeats)  # noqa: B023
            out[f"{variant}/{batch}"] = batch * NEW / seconds
    return out


ARRANGEMENTS = ("general", "one-token", "reduction", "kernel")  # kernel: dantinox/backend/pool_kernel.py


@contextlib.contextmanager
def _arrangement(name: str | None):
    """Trace with attention arrangement `name` (one of ARRANGEMENTS) forced; None: as dantinox chooses."""
    att = cpu  # the rules of dantinox/backend/cpu.py
    keep = att.uses_one_token_arrangement, att.uses_reduction_arrangement, att.uses_kernel
    if name is not None:
        att.uses_one_token_arrangement = lambda B, T, K, G: T == 1 and name == "one-token"
        att.uses_reduction_arrangement = lambda B, T, G: T == 1 and name == "reduction"
        att.uses_kernel = lambda B, T, G, rows, k_dtype, scale_layout: (
            T == 1 and name == "kernel" and pool_kernel.handles(k_dtype, scale_layout))
    try:
        yield
    finally:
        att.uses_one_token_arrangement, att.uses_reduction_arrangement, att.uses_kernel = keep


def arrangement_used(batch: int, cfg: dantinox.ModelConfig) -> str:
    """The arrangement dantinox.architectures.attention.attend takes for one new token per sequence of `batch`."""
    layout = dantinox.LayerCache.SCALE_LAYOUT if cfg.quantized_cache else None
    if cpu.uses_kernel(batch, 1, cfg.groups, batch, cfg.cache_jnp_dtype, layout):
        return "kernel"
    if cpu.uses_reduction_arrangement(batch, 1, cfg.groups):
        return "reduction"
    one_token = cpu.uses_one_token_arrangement(batch, 1, cfg.n_kv_heads, cfg.groups)
    return "one-token" if one_token else "general"


def ab_step_ms(variant: str, batch: int, context: int, sides: dict, rounds: int = 7) -> dict[str, float]:
    """Milliseconds per decode step for each side {name: (arrangement, XLA options)}, timed interleaved.

    Each side is its own compiled loop (traced under its arrangement); a step is (t(24) - t(4)) / 20
    steps of that loop, each length the best of `rounds`, the sides taking turns round by round.
    """
    model = model_for(variant)
    graphdef, params = nnx.split(model)
    # generate's decode loop over the last n slots of a `context`-slot cache: every step reads all of them
    states = {n: timing_state(model.cfg, batch, context, context - n) for n in (4, 24)}
    loops = {}
    for name, (arrangement, options) in sides.items():
        # a fresh program per side: jax caches traces by function, and each side must be traced on its own
        loops[name] = decode_loop_jit(compiler_options=options)
        with _arrangement(arrangement):  # traced (and compiled) here, under this arrangement
            jax.block_until_ready(run_decode(graphdef, params, states[4], context, context, loops[name]))
    best = {(name, n): float("inf") for name in sides for n in (4, 24)}
    for _ in range(rounds):
        for name, loop in loops.items():
            for n in (4, 24):
                run = partial(run_decode, graphdef, params, states[n], context, context, loop)
                best[name, n] = min(best[name, n], best_of(run, 1, warmup=False))
    return {name: 1e3 * (best[name, 24] - best[name, 4]) / 20 for name in sides}


def ab_tables() -> dict:
    """The two A/B tables: attention arrangement (MHA, GQA, MQA) and the batch-1 XLA option (MHA)."""
    out = {"arrangement": {}, "vector_512": {}}
    for variant in MORE_VARIANTS:
        for batch in BATCHES:
            for context in (128, 384):
                opts = compiler_options(batch)  # as generate compiles it
                out["arrangement"][f"{variant}/{batch}/{context}"] = ab_step_ms(
                    variant, batch, context, {name: (name, opts) for name in ARRANGEMENTS})
    for batch in BATCHES:
        for context in (128, 384):
            out["vector_512"][f"MHA/{batch}/{context}"] = ab_step_ms(
                "MHA", batch, context, {"512-bit": (None, VECTOR_512), "default": (None, None)})
    return out


def cached_vs_uncached(new: int) -> dict[str, float]:
    model = model_for("MHA")
    p = prompt(1)
    cached = best_of(lambda: dantinox.generate(model, p, new), 1)
    uncached = best_of(lambda: dantinox.generate(model, p, new, use_cache=False), 1)
    return {"new_tokens": new, "cached_tok_s": new / cached, "uncached_tok_s": new / uncached,
            "speedup": uncached / cached}


def step_times(filled: tuple[int, ...], max_context: int, short: int = 8, long: int = 40) -> dict[int, float]:
    """Milliseconds per decode step with `filled` tokens already cached, in a cache of `max_context` slots.

    Timed as (t(long steps) - t(short steps)) / (long - short), so the one-off costs of a call (copying
    the input state, dispatch) cancel out and only the per-step cost remains.
    """
    model = model_for("MHA", max_context=max_context)
    graphdef, params = nnx.split(model)
    out = {}
    for n in filled:
        window = bucket_for(max_context, n + long)  # the key bucket generate() uses once n + long tokens are held
        state = timing_state(model.cfg, 1, window, n)  # generate's decode loop from n tokens held
        t_short = best_of(lambda: run_decode(graphdef, params, state, n + short, window), 5)  # noqa: B023
        t_long = best_of(lambda: run_decode(graphdef, params, state, n + long, window), 5)  # noqa: B023
        out[n] = 1e3 * (t_long - t_short) / (long - short)
    return out


_COMPILE_PROBE = """
import time, numpy as np
import dantinox
from flax import nnx
dantinox.enable_compilation_cache()
m = dantinox.Transformer(dantinox.ModelConfig.preset("reference"), rngs=nnx.Rngs(0))
p = np.zeros((1, 32), np.int32)
t = time.perf_counter(); dantinox.generate(m, p, 1).block_until_ready(); first = time.perf_counter() - t
t = time.perf_counter(); dantinox.generate(m, p, 256).block_until_ready(); more = time.perf_counter() - t
print(first, more)
"""


def compile_times() -> dict[str, float]:
    """generate() calls in a fresh process, with an empty then a filled persistent compilation cache.

    `first` is the first call (prefill + the first key bucket's decode loop); `rest` is a following
    256-token call, which compiles the decode loops of the three further windows it passes through.
    """
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "DANTINOX_JAX_CACHE_DIR": cache}
        for label in ("cold", "warm"):
            res = subprocess.run([sys.executable, "-c", _COMPILE_PROBE], env=env, check=True, capture_output=True,
                                 text=True)
            first, rest = map(float, res.stdout.split()[-2:])
            out[f"{label}_first_s"], out[f"{label}_rest_s"] = first, rest
    return out


def ensure_peer_env() -> Path:
    python = PEER_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
    check = subprocess.run([str(python), "-c", "import torch, transformers, gguf, accelerate, jinja2"],
                           capture_output=True)
    if check.returncode:  # gguf and accelerate: transformers' GGUF loader; jinja2: its chat templates
        print(f"installing the peer ({', '.join(PEER_PACKAGES)}) into benchmarks/.peer-venv ...", flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PEER_PACKAGES], check=True)
    return python


def peer_grid(repeats: int) -> dict[str, float]:
    cfg = dantinox.ModelConfig.preset("reference")
    spec = dict(vocab=cfg.vocab_size, d_model=cfg.d_model, mlp=cfg.mlp_width, layers=cfg.n_layers,
                heads=cfg.n_heads, head_size=cfg.head_size, max_context=cfg.max_context,
                variants={v: dantinox.ModelConfig.preset("reference", **kw).n_kv_heads for v, kw in VARIANTS.items()},
                batches=list(BATCHES), prompt=PROMPT, new=NEW, repeats=repeats, threads=os.cpu_count())
    res = subprocess.run([str(ensure_peer_env()), str(HERE / "peer_hf.py"), json.dumps(spec)], check=True,
                         capture_output=True, text=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


WEIGHT_MODES = {  # label -> (compute dtype, storage dtype) as load_pretrained takes them
    "float32": ("float32", None),
    "bf16 stored (f32 compute)": ("float32", "bfloat16"),
    "bfloat16": ("bfloat16", None),
}
PROBE_BYTES = 1 << 30  # the bandwidth probe streams 1 GiB: 30x this CPU's L3, twice the float32 weights


class Peer:
    """Hugging Face on the same file, a long-lived process answering one timed generate() per request."""

    def __init__(self, spec: dict):
        self.proc = subprocess.Popen([str(ensure_peer_env()), str(HERE / "peer_hf.py"), json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.versions = json.loads(self._read())  # its "ready" line after loading and warming up

    def _read(self) -> str:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"peer: exited with {self.proc.wait()} before answering")
        return line.strip()

    def tok_s(self, name: str, batch: int) -> float:
        self.proc.stdin.write(f"{name} {batch}\n")
        self.proc.stdin.flush()
        return float(self._read())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def pretrained_main(name: str, peer: bool, repeats: int, modes: list[str], warmup: bool) -> None:
    """A published model in three weight modes against Hugging Face on float32, all timed in one interleaved run.

    Each round times every (mode, batch) once, then the peer at each batch, then the bandwidth probe; every
    figure is the best over the rounds, the bandwidth included, so the roofline uses the fastest streaming
    read this machine showed while the decodes ran.
    """
    from dantinox.accounting.roofline import measure_bandwidth, measure_matmul_flops
    from dantinox.architectures.pretrained import catalogue_file, load_pretrained

    loads = [os.getloadavg()[0]]
    unknown = sorted(set(modes) - set(WEIGHT_MODES))
    if unknown:
        raise SystemExit(f"--modes: expected some of {', '.join(WEIGHT_MODES)}, got {', '.join(unknown)}")
    models = {mode: load_pretrained(name, dtype=WEIGHT_MODES[mode][0], param_dtype=WEIGHT_MODES[mode][1])[:2]
              for mode in modes}
    cfg = next(iter(models.values()))[0]
    prompts = {b: np.random.RandomState(0).randint(0, cfg.vocab_size, (b, PROMPT)).astype(np.int32) for b in BATCHES}
    for _, model in models.values() if warmup else ():  # compile every window once, untimed
        for b in BATCHES:
            jax.block_until_ready(dantinox.generate(model, prompts[b], NEW))
    hf = Peer(dict(gguf=str(catalogue_file(name)), name=name, batches=list(BATCHES), prompt=PROMPT, new=NEW,
                   threads=os.cpu_count(), serve=True)) if peer else None
    best = {f"{mode}/{b}": float("inf") for mode in models for b in BATCHES}
    peer_best = {f"{name}/{b}": 0.0 for b in BATCHES}
    bandwidths = []
    for _ in range(repeats):
        for mode, (_, model) in models.items():
            for b in BATCHES:
                best[f"{mode}/{b}"] = min(best[f"{mode}/{b}"],
                                          best_of(lambda: dantinox.generate(model, prompts[b], NEW), 1,  # noqa: B023
                                                  warmup=False))
        if hf is not None:
            for b in BATCHES:
                peer_best[f"{name}/{b}"] = max(peer_best[f"{name}/{b}"], hf.tok_s(name, b))
        bandwidths.append(measure_bandwidth(PROBE_BYTES, repeats=5))
        loads.append(os.getloadavg()[0])
    if hf is not None:
        hf.close()
    machine = dataclasses.replace(measure_machine(), bandwidth=max(bandwidths),
                                  peak_flops=measure_matmul_flops(repeats=10))
    result: dict = {
        "model": name, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "prompt": PROMPT, "new": NEW,
        "rounds": repeats, "warmup": warmup, "modes": {mode: list(WEIGHT_MODES[mode]) for mode in modes},
        "machine": {"cpus": os.cpu_count(), "jax": jax.__version__, "bandwidth_B_s": machine.bandwidth,
                    "bandwidth_samples_B_s": bandwidths, "matmul_flop_s": machine.peak_flops,
                    "load_avg_1min": loads},
        "weight_bytes": {mode: dantinox.param_bytes(model) for mode, (_, model) in models.items()},
        "decode_tok_s": {key: int(key.split("/")[1]) * NEW / s for key, s in best.items()},
        "roofline_s": {f"{mode}/{b}": generate_seconds(c, b, PROMPT, NEW, machine)
                       for mode, (c, _) in models.items() for b in BATCHES}}
    if peer:
        result["peer_tok_s"] = peer_best
    stored = doc_tables.DATA / f"decode-{name}.json"  # committed: the docs' table is rendered from it
    stored.write_text(json.dumps(result, indent=2) + "\n")
    print(doc_tables.decode_pretrained(result))
    print(f"stored in {stored.relative_to(doc_tables.ROOT)}; python benchmarks/doc_tables.py rewrites the docs")


def grid_main(rounds: int) -> None:
    """The reference grid against the peer, taking turns (see the module's docstring)."""
    from dantinox.accounting.roofline import measure_bandwidth

    loads = [os.getloadavg()[0]]
    cfg = dantinox.ModelConfig.preset("reference")
    spec = dict(vocab=cfg.vocab_size, d_model=cfg.d_model, mlp=cfg.mlp_width, layers=cfg.n_layers,
                heads=cfg.n_heads, head_size=cfg.head_size, max_context=cfg.max_context,
                variants={v: dantinox.ModelConfig.preset("reference", **kw).n_kv_heads for v, kw in VARIANTS.items()},
                batches=list(BATCHES), prompt=PROMPT, new=NEW, threads=os.cpu_count(), serve=True)
    hf = Peer(spec)  # loads and warms up every model at every batch before answering
    models = {variant: model_for(variant) for variant in VARIANTS}
    for model in models.values():  # compiles every window once, untimed
        for b in BATCHES:
            jax.block_until_ready(dantinox.generate(model, prompt(b), NEW))
    loads.append(os.getloadavg()[0])
    ours = {f"{v}/{b}": [] for v in VARIANTS for b in BATCHES}
    theirs = {k: [] for k in ours}
    bandwidths = []
    for i in range(rounds):
        for k in ours:
            variant, batch = k.split("/")
            b = int(batch)
            for side in ("ours", "theirs")[::1 if i % 2 == 0 else -1]:
                if side == "ours":
                    p = prompt(b)
                    seconds = best_of(lambda: dantinox.generate(models[variant], p, NEW), 1,  # noqa: B023
                                      warmup=False)
                    ours[k].append(b * NEW / seconds)
                else:
                    theirs[k].append(hf.tok_s(variant, b))
        bandwidths.append(measure_bandwidth(PROBE_BYTES, repeats=5))
        loads.append(os.getloadavg()[0])
        print(f"round {i + 1}/{rounds}: load {loads[-1]:.1f}, "
              + ", ".join(f"{k} {ours[k][-1]:.0f} / {theirs[k][-1]:.0f}" for k in ours), flush=True)
    hf.close()
    machine = dataclasses.replace(measure_machine(repeats=10), bandwidth=max(bandwidths))
    result = {
        "model": "reference", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "prompt": PROMPT,
        "new": NEW, "rounds": rounds, "load_avg_1min": loads,
        "machine": {"cpus": os.cpu_count(), "jax": jax.__version__, "bandwidth_B_s": machine.bandwidth,
                    "bandwidth_samples_B_s": bandwidths, "matmul_flop_s": machine.peak_flops},
        "peer": hf.versions, "decode_tok_s": ours, "peer_tok_s": theirs,
        "roofline_s": {k: generate_seconds(models[k.split("/")[0]].cfg, int(k.split("/")[1]), PROMPT, NEW, machine)
                       for k in ours}}
    stored = doc_tables.DATA / "decode-reference.json"
    stored.write_text(json.dumps(result, indent=2) + "\n")
    print(doc_tables.decode_reference(result))
    print(f"stored in {stored.relative_to(doc_tables.ROOT)}; python benchmarks/doc_tables.py rewrites the docs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", action="store_true", help="also measure Hugging Face transformers (torch CPU)")
    ap.add_argument("--model", default=None, help="a published model (dantinox models) instead of the reference")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--uncached_new", type=int, default=512)
    ap.add_argument("--modes", default=",".join(WEIGHT_MODES), help="published model: weight modes, comma-separated")
    ap.add_argument("--grid", action="store_true",
                    help="reference model: the tok/s grid alone against the peer (--peer), taking turns")
    ap.add_argument("--rounds", type=int, default=5, help="--grid: rounds of turns")
    ap.add_argument("--no_warmup", action="store_true",
                    help="published model: no untimed first call (the persistent compilation cache already holds "
                         "every program from an earlier run)")
    args = ap.parse_args()
    dantinox.enable_compilation_cache()  # persist compiled programs across runs, as the CLI does
    if args.grid:
        if not args.peer or args.model is not None or args.rounds < 1:
            raise SystemExit("--grid: expected --peer, no --model and --rounds >= 1")
        return grid_main(args.rounds)
    if args.model is not None:
        return pretrained_main(args.model, args.peer, args.repeats, args.modes.split(","), not args.no_warmup)

    result: dict = {"machine": {"cpus": os.cpu_count(), "jax": jax.__version__, "backend": jax.default_backend()}}
    machine = measure_machine()
    result["machine"].update(bandwidth_B_s=machine.bandwidth, matmul_flop_s=machine.peak_flops)
    result["decode_tok_s"] = decode_grid(args.repeats)
    result["roofline_s"] = {key: generate_seconds(model_for(key.split("/")[0]).cfg, int(key.split("/")[1]), PROMPT,
                                                  NEW, machine) for key in result["decode_tok_s"]}
    if args.peer:
        result["peer_tok_s"] = peer_grid(args.repeats)
    result["ab_step_ms"] = ab_tables()
    result["cache_vs_no_cache"] = cached_vs_uncached(args.uncached_new)
    result["step_ms"] = {str(mc): step_times((64, 1024), mc) for mc in (1088, 4096)}
    result["compile"] = compile_times()

    lines = [f"Reference model (12 layers, d_model 256, 8 heads, head 32, f32), prompt {PROMPT}, {NEW} new tokens, "
             f"{os.cpu_count()} CPU cores, best of {args.repeats}; this machine measured in the same run at "
             f"{machine.bandwidth / 1e9:.1f} GB/s streaming read and {machine.peak_flops / 1e9:.0f} GFLOP/s f32 "
             f"matmul:", "",
             "| variant | batch | dantinox tok/s | % of roofline |"
             + (" HF Llama tok/s | ratio |" if args.peer else ""),
             "|---|---|---|---|" + ("---|---|" if args.peer else "")]
    for key, ours in result["decode_tok_s"].items():
        variant, batch = key.split("/")
        share = result["roofline_s"][key] / (int(batch) * NEW / ours)
        row = f"| {variant} | {batch} | {ours:,.0f} | {share:.0%} |"
        if args.peer:
            theirs = result["peer_tok_s"][key]
            row += f" {theirs:,.0f} | {ours / theirs:.2f}× |"
        lines.append(row)
    lines += ["", "Attention arrangement for one new token, ms per decode step (interleaved A/B):", "",
              "| variant | batch | cache slots | " + " | ".join(ARRANGEMENTS) + " | fastest | dantinox uses | "
              "used / fastest |", "|---|---|---|" + "---|" * (len(ARRANGEMENTS) + 3)]
    for key, t in result["ab_step_ms"]["arrangement"].items():
        variant, batch, context = key.split("/")
        used, fastest = arrangement_used(int(batch), model_for(variant).cfg), min(ARRANGEMENTS, key=t.get)
        lines.append(f"| {variant} | {batch} | {context} | " + " | ".join(f"{t[a]:.2f}" for a in ARRANGEMENTS)
                     + f" | {fastest} | {used} | {t[used] / t[fastest]:.2f}× |")
    lines += ["", "XLA option `xla_cpu_prefer_vector_width=512`, MHA, ms per decode step (interleaved A/B; "
              "generate uses it at batch 1 only):", "",
              "| batch | cache slots | 512-bit | default | default / 512-bit |",
              "|---|---|---|---|---|"]
    for key, t in result["ab_step_ms"]["vector_512"].items():
        _, batch, context = key.split("/")
        lines.append(f"| {batch} | {context} | {t['512-bit']:.2f} | {t['default']:.2f} | "
                     f"{t['default'] / t['512-bit']:.2f}× |")
    cv = result["cache_vs_no_cache"]
    lines += ["", f"KV cache vs recompute, MHA batch 1, {cv['new_tokens']} new tokens: {cv['cached_tok_s']:,.0f} vs "
              f"{cv['uncached_tok_s']:,.1f} tok/s = **{cv['speedup']:.1f}×**", "",
              "| cache slots (max_context) | step at 64 filled | step at 1024 filled |", "|---|---|---|"]
    for mc, times in result["step_ms"].items():
        lines.append(f"| {int(mc):,} | {times[64]:.2f} ms | {times[1024]:.2f} ms |")
    c = result["compile"]
    lines += ["", "| new process | first generate() (1 token: compiles prefill + first window) | then 256 tokens "
              "(3 more windows) |", "|---|---|---|",
              f"| empty compilation cache | {c['cold_first_s']:.2f} s | {c['cold_rest_s']:.2f} s |",
              f"| persistent cache filled | {c['warm_first_s']:.2f} s | {c['warm_rest_s']:.2f} s |"]
    table = "\n".join(lines)
    print(table)
    RESULTS.mkdir(exist_ok=True)
    result["table"] = table
    (RESULTS / "decode.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
