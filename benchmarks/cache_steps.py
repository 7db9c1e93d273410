"""Decode-step time of the cache layouts, each against its baseline in the same run (a benchmark, not a test).

    .venv/bin/python benchmarks/cache_steps.py          # prints the table, writes benchmarks/results/cache_steps.json
    .venv/bin/python benchmarks/cache_steps.py --doc    # also rewrites its section of docs/benchmarks.md

Every side is generate's decode loop (dantinox.accounting.roofline.run_decode) over a cache of CONTEXT slots of the
reference model: a step is (t(LONG steps) - t(SHORT steps)) / (LONG - SHORT), each length the best of
ROUNDS, the sides of a pair taking turns round by round. The pairs: an int8 cache against float32, a paged
cache (16-slot pages) against contiguous, in float32 and in int8, the paged step with the pool kernel
(dantinox/backend/pool_kernel.py) against XLA's read, at batch 1 the one-token write as a slice update against a
scatter (dantinox.cache.writes_as_slice), and XLA's two paged reads (dantinox.cache.paged.Paged.reads_pool)
forced on either side of POOL_READ_MAX. The load average is recorded with the numbers: on a shared
machine only the ratios within one row mean anything.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
from functools import partial
from pathlib import Path

import jax
from common import best_of
from flax import nnx

import dantinox
import dantinox.backend.pool_kernel as pool_kernel
import dantinox.cache
import dantinox.cache.paged as paged
from dantinox.accounting.roofline import run_decode, timing_state
from dantinox.generation.generate import compiler_options, decode_loop_jit

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "cache_steps.json"
DOC = ROOT / "docs" / "benchmarks.md"
CONTEXT, SHORT, LONG, ROUNDS = 1024, 4, 20, 5
PAGED = dict(cache_layout="paged", page_size=16)
WHOLE, GATHERED = 10**9, -1  # dantinox.cache.paged.POOL_READ_MAX forcing each paged read
# name: (baseline side, other side); a side is (config changes, write as a slice at batch 1, read limit,
# whether dantinox/backend/pool_kernel.py may read a paged pool)
PAIRS = {
    "int8 vs float32 cache": ((dict(), True, None, True), (dict(cache_dtype="int8"), True, None, True)),
    "paged (16-slot pages) vs contiguous": ((dict(), True, None, True), (PAGED, True, None, True)),
    "paged int8 vs contiguous int8": ((dict(cache_dtype="int8"), True, None, True),
                                      (PAGED | dict(cache_dtype="int8"), True, None, True)),
    "paged: pool kernel vs XLA's read": ((PAGED, True, None, False), (PAGED, True, None, True)),
    "one-token write: scatter vs slice": ((dict(), True, None, True), (dict(), False, None, True)),
    # XLA's two reads (the kernel off), either side of dantinox.cache.paged.POOL_READ_MAX: 15 and 28 extra scores
    "paged MHA, XLA: pool read whole vs gathered": ((PAGED, True, GATHERED, False), (PAGED, True, WHOLE, False)),
    "paged GQA (K=2), XLA: pool read whole vs gathered": ((PAGED | dict(kv_heads=2), True, GATHERED, False),
                                                          (PAGED | dict(kv_heads=2), True, WHOLE, False)),
}
BATCHES = {"int8 vs float32 cache": (1, 8), "paged (16-slot pages) vs contiguous": (1, 8),
           "paged int8 vs contiguous int8": (8,), "paged: pool kernel vs XLA's read": (8,),
           "one-token write: scatter vs slice": (1,), "paged MHA, XLA: pool read whole vs gathered": (16,),
           "paged GQA (K=2), XLA: pool read whole vs gathered": (8,)}


def _program(cfg: dantinox.ModelConfig, batch: int, as_slice: bool, pool_read_max: int | None = None,
             kernel: bool = True):
    """A fresh decode-loop program traced with the write formulation `as_slice` (and, for a paged cache, the
    paged read limit `pool_read_max`, None: the library's, and the pool kernel if `kernel` and it is built),
    and its timing states."""
    graphdef, params = nnx.split(dantinox.Transformer(cfg, rngs=nnx.Rngs(0)))
    states = {n: timing_state(cfg, batch, CONTEXT, CONTEXT - n) for n in (SHORT, LONG)}
    keep, keep_max, keep_kernel = dantinox.cache.writes_as_slice, paged.POOL_READ_MAX, pool_kernel.handles
    dantinox.cache.writes_as_slice = lambda B, T: as_slice and keep(B, T)
    paged.POOL_READ_MAX = keep_max if pool_read_max is None else pool_read_max
    pool_kernel.handles = keep_kernel if kernel else (lambda k_dtype, scale_layout: False)
    try:
        program = decode_loop_jit(compiler_options=compiler_options(batch, cfg, CONTEXT))
        jax.block_until_ready(run_decode(graphdef, params, states[SHORT], CONTEXT, CONTEXT, program))  # traces here
    finally:
        dantinox.cache.writes_as_slice, paged.POOL_READ_MAX, pool_kernel.handles = keep, keep_max, keep_kernel
    return {n: partial(run_decode, graphdef, params, states[n], CONTEXT, CONTEXT, program) for n in states}


def step_ms(sides: list, attempts: int = 3) -> list[float | None]:
    """Per-step milliseconds of each side; more rounds while a busy machine leaves a difference <= 0, then None."""
    best = [{n: float("inf") for n in (SHORT, LONG)} for _ in sides]
    for _ in range(attempts):
        for _ in range(ROUNDS):
            for side, b in zip(sides, best, strict=True):
                for n in (SHORT, LONG):
                    b[n] = min(b[n], best_of(side[n], 1, warmup=False))
        ms = [1e3 * (b[LONG] - b[SHORT]) / (LONG - SHORT) for b in best]
        if all(m > 0 for m in ms):
            return ms
    return [m if m > 0 else None for m in ms]


def measure() -> dict:
    rows = []
    load_before = os.getloadavg()[0]
    for name, (base, other) in PAIRS.items():
        for batch in BATCHES[name]:
            sides = [_program(dantinox.ModelConfig.preset("reference", **kw), batch, s, m, k)
                     for kw, s, m, k in (base, other)]
            base_ms, other_ms = step_ms(sides)
            ratio = other_ms / base_ms if base_ms and other_ms else None
            rows.append(dict(pair=name, batch=batch, base_ms=base_ms, other_ms=other_ms, ratio=ratio,
                             load=os.getloadavg()[0]))
            print(table_row(rows[-1]), flush=True)
    return dict(date=datetime.date.today().isoformat(), context=CONTEXT, steps=(SHORT, LONG), rounds=ROUNDS,
                load_before=load_before, rows=rows, pool_kernel=pool_kernel.available())


def table_row(r: dict) -> str:
    def num(x, digits):
        return "not measurable (busy machine)" if x is None else f"{x:.{digits}f}"
    return (f"| {r['pair']} | {r['batch']} | {num(r['base_ms'], 3)} | {num(r['other_ms'], 3)} | "
            f"{num(r['ratio'], 2)} | {r['load']:.1f} |")


def table(data: dict) -> str:
    head = ("| pair (baseline first) | batch | baseline ms/step | other ms/step | other / baseline | load average |\n"
            "|---|---:|---:|---:|---:|---:|")
    return "\n".join([head, *(table_row(r) for r in data["rows"])])


def write_doc(data: dict) -> None:
    """Replace the section between this script's markers in docs/benchmarks.md with the measured table."""
    text = DOC.read_text(encoding="utf-8")
    start, end = "<!-- cache_steps.py: start -->", "<!-- cache_steps.py: end -->"
    body = (f"{start}\n{table(data)}\n\nMeasured {data['date']} by `benchmarks/cache_steps.py`: reference model, a "
            f"cache of {data['context']} slots, steps timed as (t({data['steps'][1]}) - t({data['steps'][0]})) / "
            f"{data['steps'][1] - data['steps'][0]}, best of {data['rounds']} interleaved rounds; load average "
            f"{data['load_before']:.1f} on 2 cores when it started (last column: at the end of each row).\n{end}")
    if start in text:
        text = re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: body, text, flags=re.S)
    else:
        heading = "## Cache layouts, step against step (benchmarks/cache_steps.py)"
        text = f"{text.rstrip()}\n\n{heading}\n\n{body}\n"
    DOC.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--doc", action="store_true", help="rewrite this script's section of docs/benchmarks.md")
    args = parser.parse_args()
    data = measure()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(table(data))
    if args.doc:
        write_doc(data)
