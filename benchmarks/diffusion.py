"""Diffusion decoding benchmark: NFE, tokens/s, cache bytes and agreement for none / prefix / dual caches.

    .venv/bin/python benchmarks/diffusion.py                 # trains runs/diffusion-bench once if missing
    .venv/bin/python benchmarks/diffusion.py --run_dir DIR   # any diffusion run directory

A benchmark, not a test. Every mode decodes the same prompts with the same model, block size and
threshold; the cached modes are compared with "none" (full recomputation at every step), the peer
measured in the same run. Prints a markdown table and writes benchmarks/results/diffusion.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx

import dantinox
from dantinox.architectures import tokenizer
from dantinox.generation import diffusion
from dantinox.rundir import load_run

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
PROMPT_TEXT = ("A diffusion language model fills in masked tokens. The KV cache of an autoregressive model "
               "keeps the keys and values of every earlier token, so each new token costs one step. ")
TRAIN = dict(preset="tiny", paradigm="diffusion", steps=1500, seq_len=128, batch_size=16, seed=0, progress=False)


def load_model(run_dir: Path, max_context: int) -> dantinox.Transformer:
    """The run's weights in a model whose max_context fits the longest generation (RoPE has no table)."""
    if not (run_dir / "weights.safetensors").exists():
        import content
        from dantinox.train import train

        print(f"training {run_dir} ({TRAIN}) ...", flush=True)
        train(run_dir, corpus=content.corpus_text(), **TRAIN)
    cfg, trained = load_run(run_dir)
    if cfg.paradigm != "diffusion":
        raise SystemExit(f"run_dir: {run_dir} holds a {cfg.paradigm} model; expected paradigm='diffusion'")
    model = dantinox.Transformer(cfg.replace(max_context=max(cfg.max_context, max_context)), rngs=nnx.Rngs(0))
    nnx.update(model, nnx.state(trained, nnx.Param))
    return model


def prompts(count: int, length: int) -> np.ndarray:
    """`count` different windows of PROMPT_TEXT, `length` bytes each."""
    data = np.array(tokenizer.encode(PROMPT_TEXT * 2), np.int32)
    return np.stack([data[i * 7:i * 7 + length] for i in range(count)])


def generate_all(model, prompt_BP: np.ndarray, gen: int, block: int, threshold: float, cache_mode: str):
    """Each prompt alone (batch 1, as Fast-dLLM reports throughput); returns seconds and the results."""
    start, results = time.perf_counter(), []
    for row in prompt_BP:
        results.append(diffusion.diffusion_generate(model, row[None], gen, block, threshold, cache_mode))
    return time.perf_counter() - start, results


def measure(model, prompt_BP: np.ndarray, gen: int, block: int, threshold: float, rounds: int) -> dict:
    """All modes on the same prompts; rounds interleave the modes and the fastest round counts."""
    for cache in diffusion.CACHE_MODES:  # compile: one step per block, same program as any threshold
        diffusion.diffusion_generate(model, prompt_BP[:1], gen, block, 1e-6, cache)
    best = dict.fromkeys(diffusion.CACHE_MODES, float("inf"))
    results = {}
    for _ in range(rounds):
        for cache in diffusion.CACHE_MODES:
            seconds, results[cache] = generate_all(model, prompt_BP, gen, block, threshold, cache)
            best[cache] = min(best[cache], seconds)
    count, out = len(prompt_BP), {}
    reference = np.stack([r.tokens[0] for r in results["none"]])
    for cache, rs in results.items():
        tokens, last = np.stack([r.tokens[0] for r in rs]), rs[-1]
        nfe = sum(r.nfe for r in rs)
        out[cache] = {
            "seconds": best[cache], "tok_s": count * gen / best[cache], "speedup": best["none"] / best[cache],
            "ms_per_step": 1e3 * best[cache] / nfe, "nfe": nfe / count,
            "positions_computed": sum(int(r.computed_tokens.sum()) for r in rs) / count,
            "agreement": float((tokens[:, -gen:] == reference[:, -gen:]).mean()),
            "peak_cache_bytes": last.peak_cache_bytes, "mean_cache_bytes": float(last.cache_bytes.mean()),
            "allocated_bytes": last.allocated_bytes, "ar_static_bytes": last.ar_static_bytes}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run_dir", type=Path, default=ROOT / "runs" / "diffusion-bench")
    ap.add_argument("--gen", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--prompts", type=int, nargs="+", default=[4, 1], help="prompts per generation length")
    ap.add_argument("--rounds", type=int, nargs="+", default=[2, 1], help="timing rounds per generation length")
    ap.add_argument("--prompt_len", type=int, default=64)
    ap.add_argument("--block_size", type=int, default=32)
    ap.add_argument("--threshold", type=float, default=0.9)
    args = ap.parse_args()
    dantinox.enable_compilation_cache()  # persist compiled programs across runs, as the CLI does
    if not len(args.prompts) == len(args.rounds) == len(args.gen):
        raise SystemExit("--prompts, --rounds: give one count per --gen length")

    model = load_model(args.run_dir, args.prompt_len + max(args.gen))
    cfg = model.cfg
    result: dict = {"machine": {"cpus": os.cpu_count(), "jax": jax.__version__, "backend": jax.default_backend()},
                    "model": {"run_dir": str(args.run_dir), **{k: getattr(cfg, k) for k in (
                        "d_model", "n_layers", "n_heads", "n_kv_heads", "head_size", "mlp_width", "max_context",
                        "dtype", "cache_dtype")}},
                    "settings": {"prompt_len": args.prompt_len, "block_size": args.block_size,
                                 "threshold": args.threshold, "batch": 1}, "runs": {}}
    lines = [f"Diffusion decoding, {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads of "
             f"{cfg.head_size}, {cfg.cache_dtype} cache; prompt {args.prompt_len}, block {args.block_size}, "
             f"threshold {args.threshold}, batch 1, {os.cpu_count()} CPU cores ({jax.default_backend()}):", "",
             "| gen | cache | NFE | positions run | ms/step | tok/s | vs none | same tokens as none | "
             "cache peak | cache mean | buffers allocated | AR static |", "|" + "---|" * 12]
    fmt = dantinox.format_bytes
    for gen, count, rounds in zip(args.gen, args.prompts, args.rounds, strict=True):
        runs = measure(model, prompts(count, args.prompt_len), gen, args.block_size, args.threshold, rounds)
        for cache, r in runs.items():
            lines.append(f"| {gen} | {cache} | {r['nfe']:.1f} | {r['positions_computed']:,.0f} | "
                         f"{r['ms_per_step']:.2f} | {r['tok_s']:.1f} | {r['speedup']:.2f}× | {r['agreement']:.1%} | "
                         f"{fmt(r['peak_cache_bytes'])} | {fmt(r['mean_cache_bytes'])} | "
                         f"{fmt(r['allocated_bytes'])} | {fmt(r['ar_static_bytes'])} |")
        result["runs"][str(gen)] = runs
    lines += ["", "Cache peak/mean = keys/values the steps read (prefix + suffix, measured per step). DualCache "
              "always holds T − block positions; buffers allocated = static prefix + suffix buffers."]
    for gen in args.gen:
        runs = result["runs"][str(gen)]
        dual, prefix, ar = runs["dual"], runs["prefix"], runs["dual"]["ar_static_bytes"]
        lines.append(f"gen {gen}: DualCache peak / AR static = {dual['peak_cache_bytes'] / ar:.3f}, mean "
                     f"DualCache / mean prefix cache = {dual['mean_cache_bytes'] / prefix['mean_cache_bytes']:.2f}, "
                     f"DualCache buffers / AR static = {dual['allocated_bytes'] / ar:.3f}")
    table = "\n".join(lines)
    print(table)
    result["table"] = table
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "diffusion.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
