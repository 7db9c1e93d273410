"""Where a decode step's time goes: per-op timings from XLA's own profiler, sorted by what each op does.

    .venv/bin/python benchmarks/decode_profile.py                 # MHA and GQA (K=2), batch 1 and 8, 384 slots
    .venv/bin/python benchmarks/decode_profile.py --context 128 --cache-dtype bfloat16

Runs the compiled decode loop (the one dantinox.roofline times, compiled with generate's options) under
`jax.profiler.trace`, reads the per-op events back from the Perfetto trace, and sorts every op into
weight matmuls, attention over the cache, the cache write, and the rest, through the model's named
scopes (dantinox/model.py) in the compiled HLO's metadata. The matmuls and the attention are shown with
the bytes they must read and the bandwidth that implies, against the streaming-read bandwidth measured
in the same run. Prints a markdown table and writes benchmarks/results/decode_profile.json.
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
from dantinox.roofline import _decode_loop_jit, decode_step_seconds, measure_bandwidth, weight_count

HERE = Path(__file__).resolve().parent
VARIANTS = {"MHA": dict(attention="mha"), "GQA (K=2)": dict(attention="gqa", kv_heads=2)}
SCOPES = ("norm", "qkv", "cache_write", "attend", "out_proj", "mlp", "embed", "logits", "sample")
CATEGORIES = ("weight matmuls", "attention over the cache", "cache write", "norms, RoPE, SwiGLU, residual, sampling")
SKIP = ("while", "conditional", "call", "parameter", "get-tuple-element", "tuple", "constant")
STEPS = 40


def scope_of(op_name: str) -> str | None:
    """The model scope an HLO op came from, from its metadata op_name (e.g. .../while/body/mlp/dot_general)."""
    return next((part for part in reversed(op_name.split("/")) if part in SCOPES), None)


def categorize(hlo_text: str, slots: int) -> dict[str, str]:
    """HLO instruction name -> one of CATEGORIES, for the ops of a compiled decode loop.

    XLA keeps the op_name (and so the model scope) on most ops but drops it from some it rewrites; those
    are placed by shape: an op with a dimension of `slots` in its output or an operand works on the cache,
    any other dot on weights.
    Loop control (the while op itself, tuples, parameters) is left out.
    """
    instructions = re.findall(r"^\s*(?:ROOT )?%([\w.\-]+) = (\S+) ([\w\-]+)\((.*)$", hlo_text, re.MULTILINE)
    shapes = {name: shape for name, shape, _, _ in instructions}
    on_cache = re.compile(rf"[\[,]{slots}[,\]]")
    out = {}
    for name, shape, kind, rest in instructions:
        if kind in SKIP:
            continue
        op_name = re.search(r'op_name="([^"]+)"', rest)
        scope = scope_of(op_name.group(1)) if op_name else None
        operands = re.findall(r"%([\w.\-]+)", rest.split(")", 1)[0])
        reads_cache = any(on_cache.search(s) for s in [shape, *(shapes.get(o, "") for o in operands)])
        is_dot = kind == "dot" or (name.startswith("ynn_fusion") and op_name is not None
                                   and op_name.group(1).endswith("dot_general"))
        if scope == "attend" or (scope is None and reads_cache):
            out[name] = CATEGORIES[1]
        elif scope == "cache_write":
            out[name] = CATEGORIES[2]
        elif is_dot:
            out[name] = CATEGORIES[0]
        else:
            out[name] = CATEGORIES[3]
    return out


def read_bytes(cfg: dantinox.ModelConfig, batch: int, context: int) -> dict[str, int]:
    """Bytes a category must read per step: every weight for the matmuls, the whole cache for attention."""
    return {CATEGORIES[0]: weight_count(cfg) * 4, CATEGORIES[1]: dantinox.kv_cache_bytes(cfg, batch, context)}


def profile(variant: str, batch: int, context: int, cache_dtype: str) -> dict:
    cfg = dantinox.ModelConfig.preset("reference", **VARIANTS[variant], cache_dtype=cache_dtype)
    model = dantinox.Transformer(cfg, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    caches, tokens, index = init_cache(cfg, batch, context), jnp.zeros((batch,), jnp.int32), jnp.int32(context - 1)
    loop = _decode_loop_jit(batch)
    args = (graphdef, params, tokens, caches, jnp.int32(STEPS), index)
    category = categorize(loop.lower(*args).compile().as_text(), context)
    jax.block_until_ready(loop(*args))
    with tempfile.TemporaryDirectory() as out:
        with jax.profiler.trace(out, create_perfetto_trace=True):
            jax.block_until_ready(loop(*args))
        trace = json.load(gzip.open(next(Path(out).rglob("*perfetto_trace.json.gz"))))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    micros = collections.Counter()
    for e in events:
        args_ = e.get("args", {})
        if e.get("ph") == "X" and args_.get("hlo_op") in category and "_decode_loop" in args_.get("hlo_module", ""):
            micros[category[args_["hlo_op"]]] += e["dur"] / STEPS
    return {"step_ms": 1e3 * decode_step_seconds(model, batch, context), "us_per_step": dict(micros),
            "read_bytes": read_bytes(cfg, batch, context)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=384, help="cache slots each step attends over")
    ap.add_argument("--cache-dtype", default="float32", help="cache storage (compute stays float32)")
    args = ap.parse_args()
    dantinox.enable_compilation_cache()
    bandwidth = measure_bandwidth()
    result = {"machine": {"jax": jax.__version__, "bandwidth_B_s": bandwidth}, "context": args.context,
              "cache_dtype": args.cache_dtype, "profiles": {}}
    lines = [f"Reference model ({args.cache_dtype} cache), one decode step over {args.context} cache slots; "
             "per-op time from XLA's profiler "
             f"(jax {jax.__version__}, cpu); streaming read measured at {bandwidth / 1e9:.1f} GB/s in this run.", "",
             "| variant | batch | step (no profiler) | ops, profiled | " + " | ".join(CATEGORIES) + " |",
             "|---|---|---|---|" + "---|" * len(CATEGORIES)]
    for variant in VARIANTS:
        for batch in (1, 8):
            r = profile(variant, batch, args.context, args.cache_dtype)
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
    lines += ["", "Per step, all 12 layers. (GB/s): the bytes the category must read (every weight; the whole cache) "
              "over its time. The profiler adds a little to every op, so the ops may sum to more than the step."]
    table = "\n".join(lines)
    print(table)
    result["table"] = table
    (HERE / "results").mkdir(exist_ok=True)
    name = "decode_profile.json" if (args.context, args.cache_dtype) == (384, "float32") else \
        f"decode_profile_{args.context}_{args.cache_dtype}.json"
    (HERE / "results" / name).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
