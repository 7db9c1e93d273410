"""Where a decode step's time goes: per-op timings from XLA's own profiler, grouped by the model's named scopes.

    .venv/bin/python benchmarks/decode_profile.py                 # MHA and GQA (K=2), batch 1 and 8, 384 slots
    .venv/bin/python benchmarks/decode_profile.py --context 128

Runs the compiled decode loop under `jax.profiler.trace`, reads the per-op events back from the Perfetto
trace, and maps every op to its scope in the model (norm, qkv, cache_write, attend, out_proj, mlp, embed,
logits; dantinox/model.py names them) through the compiled HLO's metadata. Each scope is shown with the
bytes it must read (weights or cache) and the bandwidth that implies, against the streaming-read bandwidth
measured in the same run. Profiling adds a little to every op; the step time without it is printed too.
Prints a markdown table and writes benchmarks/results/decode_profile.json.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

import dantinox
from dantinox.cache import init_cache
from dantinox.roofline import _decode_loop_jit, decode_step_seconds, measure_bandwidth

HERE = Path(__file__).resolve().parent
VARIANTS = {"MHA": dict(attention="mha"), "GQA (K=2)": dict(attention="gqa", kv_heads=2)}
SCOPES = ("norm", "qkv", "cache_write", "attend", "out_proj", "mlp", "embed", "logits")
STEPS = 40


def scope_of(op_name: str) -> str:
    """The model scope an HLO op came from, from its metadata op_name (e.g. .../while/body/mlp/dot_general)."""
    parts = op_name.split("/")
    return next((p for p in reversed(parts) if p in SCOPES), "other")


def op_scopes(hlo_text: str) -> dict[str, str]:
    """HLO instruction name -> scope, for every instruction of a compiled module that carries an op_name."""
    out = {}
    for m in re.finditer(r"^\s*(?:ROOT )?%?([\w.\-]+) = .*?op_name=\"([^\"]+)\"", hlo_text, re.MULTILINE):
        out[m.group(1)] = scope_of(m.group(2))
    return out


def read_bytes(cfg: dantinox.ModelConfig, batch: int, context: int) -> dict[str, int]:
    """Bytes each scope must read per step: its weights, or the cache for attend."""
    D, N, K, H, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_size, cfg.mlp_width
    f32, L = 4, cfg.n_layers
    return {"qkv": L * D * (N + 2 * K) * H * f32, "out_proj": L * N * H * D * f32, "mlp": L * 3 * D * F * f32,
            "attend": dantinox.kv_cache_bytes(cfg, batch, context), "logits": cfg.vocab_size * D * f32}


def profile(variant: str, batch: int, context: int) -> dict:
    cfg = dantinox.ModelConfig.preset("reference", **VARIANTS[variant])
    model = dantinox.Transformer(cfg, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    caches, tokens, index = init_cache(cfg, batch, context), jnp.zeros((batch,), jnp.int32), jnp.int32(context - 1)
    loop = _decode_loop_jit(batch)
    args = (graphdef, params, tokens, caches, jnp.int32(STEPS), index)
    scopes = op_scopes(loop.lower(*args).compile().as_text())
    jax.block_until_ready(loop(*args))
    with tempfile.TemporaryDirectory() as out:
        with jax.profiler.trace(out, create_perfetto_trace=True):
            jax.block_until_ready(loop(*args))
        trace = json.load(gzip.open(next(Path(out).rglob("*perfetto_trace.json.gz"))))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    micros = collections.Counter()
    for e in events:
        op = e.get("args", {}).get("hlo_op")
        if e.get("ph") == "X" and op in scopes and "_decode_loop" in e["args"].get("hlo_module", ""):
            micros[scopes[op]] += e["dur"] / STEPS
    return {"step_ms": 1e3 * decode_step_seconds(model, batch, context), "us_per_step": dict(micros),
            "read_bytes": read_bytes(cfg, batch, context)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=384, help="cache slots each step attends over")
    args = ap.parse_args()
    dantinox.enable_compilation_cache()
    bandwidth = measure_bandwidth()
    result = {"machine": {"cpus": jax.device_count(), "jax": jax.__version__, "bandwidth_B_s": bandwidth},
              "context": args.context, "profiles": {}}
    lines = [f"Reference model, one decode step over {args.context} cache slots; per-op time from XLA's profiler "
             f"(jax {jax.__version__}, cpu), streaming read measured at {bandwidth / 1e9:.1f} GB/s in this run.", "",
             "| variant | batch | step (no profiler) | " + " | ".join(SCOPES[:6]) + " | other |",
             "|---|---|---|" + "---|" * 7]
    for variant in VARIANTS:
        for batch in (1, 8):
            r = profile(variant, batch, args.context)
            result["profiles"][f"{variant}/{batch}"] = r
            cells = []
            for scope in (*SCOPES[:6], "other"):
                us = r["us_per_step"].get(scope, 0.0) + (sum(r["us_per_step"].get(s, 0.0) for s in SCOPES[6:])
                                                        if scope == "other" else 0.0)
                cell = f"{us:,.0f} µs"
                if scope in r["read_bytes"] and us > 0:
                    cell += f" ({r['read_bytes'][scope] / (us * 1e-6) / 1e9:.0f} GB/s)"
                cells.append(cell)
            lines.append(f"| {variant} | {batch} | {r['step_ms']:.2f} ms | " + " | ".join(cells) + " |")
    lines += ["", "µs per step summed over the 12 layers; (GB/s) = the weights (or, for attend, the cache) that scope "
              "must read, divided by its time."]
    table = "\n".join(lines)
    print(table)
    result["table"] = table
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "decode_profile.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
