"""Roofline benchmark: this machine measured, then the reference model's step times against its roofline.

    .venv/bin/python benchmarks/roofline.py [--repeats 3] [--context 128]

Measures the streaming-read bandwidth and the f32 matmul peak of this machine, then times one decode
step of the reference model at batch 1 … 256 (a cache of `--context` slots) and one prefill at prompt
lengths 16 … 1024 (batch 1), and sets each beside the roofline max(bytes / bandwidth, FLOPs / peak)
computed from the config (dantinox.accounting.roofline). Prints markdown tables and writes
benchmarks/results/roofline.json.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import jax
from flax import nnx

import dantinox
from dantinox.accounting import roofline

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = {"MHA, f32 cache": dict(),
            "GQA K=2, bf16 cache": dict(kv_heads=2, cache_dtype="bfloat16")}
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PROMPTS = (16, 32, 64, 128, 256, 512, 1024)


def knee(rows: list[dict]) -> float:
    """t(1) · B_max / t(B_max): where the batch-1 time meets the line through the largest batch's time."""
    return rows[0]["measured_ms"] * rows[-1]["x"] / rows[-1]["measured_ms"]


def sweep(machine: roofline.Machine, cfg: dantinox.ModelConfig, phase: str, xs: tuple[int, ...], context: int,
          repeats: int) -> list[dict]:
    model = dantinox.Transformer(cfg, rngs=nnx.Rngs(0))
    rows = []
    for x in xs:
        if phase == "decode":
            seconds, cost = roofline.decode_step_seconds(model, x, context, repeats=repeats), \
                roofline.decode_cost(cfg, x, context)
        else:
            seconds, cost = roofline.prefill_seconds(model, 1, x, repeats=repeats), roofline.prefill_cost(cfg, 1, x)
        rows.append(dict(x=x, measured_ms=1e3 * seconds, roofline_ms=1e3 * cost.time(machine),
                         memory_ms=1e3 * cost.memory_time(machine), compute_ms=1e3 * cost.compute_time(machine),
                         bound=cost.bound(machine), percent_of_roofline=100 * cost.time(machine) / seconds,
                         mbytes=cost.bytes / 1e6, gflops=cost.flops / 1e9))
        print(f"{phase} {x}: {rows[-1]['measured_ms']:.3f} ms ({rows[-1]['percent_of_roofline']:.0f}% of roofline)",
              flush=True)
    return rows


def table(rows: list[dict], x_name: str) -> list[str]:
    lines = [f"| {x_name} | measured | roofline (bound) | % of roofline | MB moved | GFLOP |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['x']} | {r['measured_ms']:.3f} ms | {r['roofline_ms']:.3f} ms ({r['bound']}) | "
              f"{r['percent_of_roofline']:.0f}% | {r['mbytes']:.1f} | {r['gflops']:.3f} |" for r in rows]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--context", type=int, default=128, help="cache slots each decode step reads")
    args = ap.parse_args()

    load_before = os.getloadavg()[0]  # timings on a shared machine: say how busy it was
    machine = roofline.measure_machine(repeats=20)
    result: dict = {"machine": dict(cpus=os.cpu_count(), jax=jax.__version__, backend=jax.default_backend(),
                                    bandwidth_GBps=machine.bandwidth / 1e9, matmul_GFLOPs=machine.peak_flops / 1e9,
                                    critical_batch_f32=machine.critical_batch(), source=machine.source)}
    lines = [f"This machine (measured): streaming read **{machine.bandwidth / 1e9:.1f} GB/s**, f32 matmul "
             f"**{machine.peak_flops / 1e9:.0f} GFLOP/s** ({machine.source}); critical batch for f32 weights "
             f"F/BW · 4/2 = **{machine.critical_batch():.1f}** tokens per step. {os.cpu_count()} CPU cores, "
             f"best of {args.repeats}. Roofline = max(bytes / measured bandwidth, FLOPs / measured peak), "
             "bytes and FLOPs from the config (dantinox.accounting.roofline)."]
    for label, kw in VARIANTS.items():
        cfg = dantinox.ModelConfig.preset("reference", **kw)
        decode = sweep(machine, cfg, "decode", BATCHES, args.context, args.repeats)
        prefill = sweep(machine, cfg, "prefill", PROMPTS, args.context, args.repeats)
        crossover = roofline.crossover_batch(cfg, args.context, machine)
        turns = f"B = {crossover}" if crossover else "no batch (the cache keeps it memory-bound)"
        result[label] = dict(decode=decode, prefill=prefill, measured_knee=knee(decode), crossover_batch=crossover)
        lines += ["", f"**Decode, reference model, {label}, {args.context} cache slots** — measured knee "
                  f"B ≈ {knee(decode):.0f}; the roofline turns compute-bound at {turns}:", ""]
        lines += table(decode, "batch")
        lines += ["", f"**Prefill, reference model, {label}, batch 1:**", ""]
        lines += table(prefill, "prompt tokens")
    load = (load_before, os.getloadavg()[0])
    result["machine"]["load_average_1min"] = load
    busy = max(load) > (os.cpu_count() or 1)  # the run itself keeps about the core count busy
    verdict = ("above the core count: other work shared the CPU and the times are upper bounds" if busy else
               "not above the core count: the run had the CPU to itself")
    lines.insert(1, f"\nLoad average (1 min) {load[0]:.1f} at the start and {load[1]:.1f} at the end, on "
                    f"{os.cpu_count()} cores: {verdict}.")
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    result["table"] = text
    (RESULTS / "roofline.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
