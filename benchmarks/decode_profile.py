"""Where a decode step's time goes: per-op timings from XLA's own profiler, sorted by what each op does.

    .venv/bin/python benchmarks/decode_profile.py                 # MHA and GQA (K=2), batch 1 and 8, 384 slots
    .venv/bin/python benchmarks/decode_profile.py --context 128 --cache-dtype bfloat16
    .venv/bin/python benchmarks/decode_profile.py --smollm2 --context 8192 --cache-dtype bfloat16 --batches 1

dantinox.accounting.profile runs the compiled decode loop under `jax.profiler.trace` and sorts every op into weight
matmuls, attention over the cache, the cache write, and the rest (the roofline lab's "where does a
step's time go?" button shows the same). The matmuls and the attention are shown with the bytes they must
read and the bandwidth that implies, against the streaming-read bandwidth measured in the same run.
Prints a markdown table and writes benchmarks/results/decode_profile.json (with --smollm2 the committed
benchmarks/data/decode-profile-smollm2-CONTEXT-DTYPE.json, which docs/benchmarks.md renders).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import jax
from flax import nnx

import dantinox
from dantinox.accounting.profile import CATEGORIES, profile_decode_step
from dantinox.accounting.roofline import decode_step_seconds, measure_bandwidth
from dantinox.generation.quality import with_changes

HERE = Path(__file__).resolve().parent
VARIANTS = {"MHA": dict(), "GQA (K=2)": dict(kv_heads=2)}


def models(smollm2: bool, cache_dtype: str) -> dict[str, nnx.Module]:
    """The models profiled: the reference model's MHA and GQA, or SmolLM2-135M with bf16-stored weights."""
    if smollm2:
        model = dantinox.load_pretrained("smollm2-135m", param_dtype="bfloat16")[1]
        return {"SmolLM2-135M bf16-stored": with_changes(model, cache_dtype=cache_dtype)}
    return {variant: dantinox.Transformer(dantinox.ModelConfig.preset("reference", **kw, cache_dtype=cache_dtype),
                                          rngs=nnx.Rngs(0)) for variant, kw in VARIANTS.items()}


def profile(model: nnx.Module, batch: int, context: int) -> dict:
    p = profile_decode_step(model, batch, context, steps=40)
    return {"step_ms": 1e3 * decode_step_seconds(model, batch, context),
            "us_per_step": {c: 1e6 * t for c, t in p.seconds.items()}, "read_bytes": p.read_bytes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=384, help="cache slots each step attends over")
    ap.add_argument("--cache-dtype", default="float32", help="cache storage (compute stays float32)")
    ap.add_argument("--smollm2", action="store_true", help="SmolLM2-135M (bf16-stored weights) instead")
    ap.add_argument("--batches", default="1,8", help="batch sizes, comma-separated")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    dantinox.enable_compilation_cache()
    load = os.getloadavg()[0]
    bandwidth = measure_bandwidth()
    result = {"machine": {"jax": jax.__version__, "bandwidth_B_s": bandwidth}, "context": args.context,
              "cache_dtype": args.cache_dtype, "profiles": {}}
    what = "SmolLM2-135M" if args.smollm2 else "Reference model"
    lines = [f"{what} ({args.cache_dtype} cache), one decode step over {args.context} cache slots; per-op time "
             f"from XLA's profiler (jax {jax.__version__}, cpu); streaming read measured at "
             f"{bandwidth / 1e9:.1f} GB/s in this run.", "",
             "| variant | batch | step (no profiler) | ops, profiled | " + " | ".join(CATEGORIES) + " |",
             "|---|---|---|---|" + "---|" * len(CATEGORIES)]
    for variant, model in models(args.smollm2, args.cache_dtype).items():
        for batch in batches:
            r = profile(model, batch, args.context)
            result["profiles"][f"{variant}/{batch}"] = r
            cells = []
            for cat in CATEGORIES:
                us = r["us_per_step"].get(cat, 0.0)
                cell = f"{us / 1e3:.2f} ms"
                if cat in r["read_bytes"] and us > 0:
                    cell += f" ({r['read_bytes'][cat] / (us * 1e-6) / 1e9:.0f} GB/s)"
                cells.append(cell)
            total = sum(r["us_per_step"].values()) / 1e3
            lines.append(f"| {variant} | {batch} | {r['step_ms']:.2f} ms | {total:.2f} ms | {' | '.join(cells)} |")
    lines += ["", "Per step, all layers. (GB/s): the bytes the category must read (every weight; the whole cache) "
              "over its time. The profiler adds a little to every op, so the ops may sum to more than the step."]
    table = "\n".join(lines)
    print(table)
    result["table"] = table
    (HERE / "results").mkdir(exist_ok=True)
    result.update(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), load_avg_1min=[load, os.getloadavg()[0]])
    if args.smollm2:  # committed: docs/benchmarks.md renders it (benchmarks/doc_tables.py)
        path = HERE / "data" / f"decode-profile-smollm2-{args.context}-{args.cache_dtype}.json"
    else:
        path = HERE / "results" / ("decode_profile.json" if (args.context, args.cache_dtype) == (384, "float32")
                                   else f"decode_profile_{args.context}_{args.cache_dtype}.json")
    path.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
