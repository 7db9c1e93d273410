"""Slider latency of the KV-cache lab (a benchmark, not a test).

    .venv/bin/python benchmarks/lab_latency.py              # about a minute on 2 CPU cores
    .venv/bin/python benchmarks/lab_latency.py --moves 20   # quicker, noisier

A "move" sets one control exactly as the browser does (`control.value = x`), which runs the lab's refresh
and the plot's in-place update synchronously; the time is from the assignment to its return. Scenarios
on the reference model:
  shapes               caches above the allocation budget: sizes from jax.eval_shape, nothing allocated
                       (goal < 100 ms)
  arrays, first visit  real caches allocated and freed, a few KiB up to the budget, each shape new
                       (includes JAX compiling init_cache's zero-fill for that shape) (goal < 300 ms)
  arrays, revisit      the same token counts again
  arrays, X to Y       the largest caches under the budget, back and forth
The peer of each scenario is the bare work measured in the same run: `tree_nbytes(cache_shapes(...))` or
`tree_nbytes(init_cache(...))` for the same settings; the ratio is the lab's overhead over it. The reading
column times `widgets.read_kv_cache` for the same settings right after the move (the pure function the lab
renders, no widget; warm: the move has already traced that setting's shapes), so on revisits lab / reading is
the cost of the widget itself, and on first visits it also holds the tracing and compiling of a new shape.
JAX's compile log is watched during all moves: no model program may compile (only `init_cache`'s zero-fill,
once per shape).
Prints a table and writes benchmarks/results/lab_latency.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
import statistics
import time
from pathlib import Path

import jax

import content
import dantinox
from widgets import CacheLab, CachePlot, read_kv_cache
from widgets.readings import DEFAULT_BUDGET

RESULTS = Path(__file__).resolve().parent / "results"
GOALS_MS = {"shapes": 100, "arrays": 300}
FILL_PROGRAMS = {"jit(broadcast_in_dim)", "jit(convert_element_type)"}  # what jnp.zeros compiles per shape


class CompileLog(logging.Handler):
    """Collects the names of programs JAX compiles while jax_log_compiles is on."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def emit(self, record):
        match = re.match(r"Compiling (\S+)", record.getMessage())
        if match:
            self.names.append(match.group(1))


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def peer_ms(cfg, batch: int, tokens: int, source: str) -> float:
    """The bare work the lab wraps: measure the cache from its shapes, or allocate, measure and free it."""
    if source == "shapes":
        return timed(lambda: dantinox.tree_nbytes(dantinox.cache_shapes(cfg, batch, tokens)))

    def allocate():
        cache = dantinox.init_cache(cfg, batch, tokens)
        jax.block_until_ready(cache)
        dantinox.tree_nbytes(cache)
        del cache
    return timed(allocate)


def summary(ms: list[float]) -> dict:
    ordered = sorted(ms)
    return {"n": len(ms), "median_ms": statistics.median(ms), "p95_ms": ordered[int(0.95 * (len(ms) - 1))],
            "max_ms": ordered[-1]}


def scenario(lab: CacheLab, name: str, mode: str, settings: dict, moves: list[tuple[str, int]]) -> dict:
    lab.update(**settings)
    lab_ms, bare_ms, reading_ms, sizes = [], [], [], []
    for control, value in moves:
        lab_ms.append(timed(lambda c=control, v=value: setattr(getattr(lab, c), "value", v)))
        r = lab.reading
        if lab.error:
            raise RuntimeError(f"{name}: the lab showed an error: {lab.error}")
        if r.source != mode or r.residual != 0:
            raise RuntimeError(f"{name}: expected {mode} with residual 0, got {r.source} / {r.residual}")
        sizes.append(r.measured_bytes)
        bare_ms.append(peer_ms(r.cfg, r.batch, r.tokens, r.source))
        reading_ms.append(timed(lambda r=r: read_kv_cache(lab.entry, r.cfg, r.batch, r.tokens, device=r.device.name,
                                                          budget=lab.budget_bytes)))
    out = {"scenario": name, "settings": settings, "lab": summary(lab_ms), "peer": summary(bare_ms),
           "reading": summary(reading_ms), "bytes_min": min(sizes), "bytes_max": max(sizes),
           "goal_ms": GOALS_MS[mode]}
    out["overhead_ratio_median"] = out["lab"]["median_ms"] / out["peer"]["median_ms"]
    out["widget_ratio_median"] = out["lab"]["median_ms"] / out["reading"]["median_ms"]
    return out


def explorer_scenario(moves: int, rng: random.Random) -> dict:
    """Formula explorer: `moves` random slider moves on every science item of every entry (goal < 100 ms median).

    A move sets one control as the browser does; the refresh evaluates the item, recomputes the curve and
    updates the plot in place. Peer: `read_formula` plus `curve` for the same values (the pure computation the
    widget draws), timed in the same run. Prints one row and writes benchmarks/results/formula_explorer.json.
    """
    from widgets.formula_explorer import FormulaExplorer, curve, read_formula

    widget_ms, peer_ms_, items = [], [], 0
    for entry in content.load_all().values():
        for index in range(len(entry.science)):
            explorer, items = FormulaExplorer(entry, index), items + 1
            for _ in range(moves):
                name = rng.choice(list(explorer.controls))
                control = explorer.controls[name]
                value = rng.choice([v for _, v in control.options if v != control.value])
                widget_ms.append(timed(lambda c=control, v=value: setattr(c, "value", v)))
                if explorer.error:
                    raise RuntimeError(f"{entry.id} / {explorer.item.title}: the explorer showed {explorer.error}")
                values = explorer.values
                peer_ms_.append(timed(lambda e=entry, i=index, v=values, x=explorer.x_axis.value: (
                    read_formula(e, i, v), curve(e, i, v, x))))
    out = {"scenario": "formula explorer, any slider", "science_items": items, "widget": summary(widget_ms),
           "peer": summary(peer_ms_), "goal_ms": 100}
    out["widget_ratio_median"] = out["widget"]["median_ms"] / out["peer"]["median_ms"]
    print(f"\n| scenario | science items | moves | median ms | p95 ms | max ms | goal ms | peer median ms | "
          f"widget / peer |\n|---|---|---|---|---|---|---|---|---|\n| {out['scenario']} | {items} | "
          f"{len(widget_ms)} | {out['widget']['median_ms']:.1f} | {out['widget']['p95_ms']:.1f} | "
          f"{out['widget']['max_ms']:.1f} | 100 | {out['peer']['median_ms']:.2f} | {out['widget_ratio_median']:.1f} |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "formula_explorer.json").write_text(json.dumps(out, indent=1) + "\n")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--moves", type=int, default=40, help="slider moves per scenario")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget-mib", type=int, default=None, help="allocation budget (default: the lab's)")
    args = parser.parse_args()
    dantinox.enable_compilation_cache()  # as the labs' first cell does
    rng = random.Random(args.seed)
    entry = content.load_entry("kv-cache")
    budget = args.budget_mib * 2**20 if args.budget_mib else DEFAULT_BUDGET
    lab = CacheLab(entry, preset="reference", budget_bytes=budget)
    plot = CachePlot(lab)  # the plot follows every move, as in the notebook
    mha32 = dantinox.ModelConfig.preset("reference", cache_dtype="float32")

    # Above the budget: B=200..256 sequences at any token count past the budget.
    big = dict(attention="mha", cache_dtype="float32", batch=256, tokens=1024)
    lowest = min(1024, budget // dantinox.kv_cache_bytes(mha32, 200, 1) + 1)
    shape_moves = [("tokens", rng.randint(lowest, 1024)) for _ in range(args.moves)]
    shape_moves += [("batch", rng.randint(200, 256)) for _ in range(args.moves // 2)]

    # Under the budget: the largest B whose full-context cache fits, so 1..1024 tokens spans KiB to ~budget.
    batch = budget // dantinox.kv_cache_bytes(mha32, 1, 1024)
    if batch < 1:
        raise SystemExit(f"--budget-mib: one full-context sequence ({dantinox.kv_cache_bytes(mha32, 1, 1024)} B) "
                         f"does not fit {budget} B")
    alloc = dict(attention="mha", cache_dtype="float32", batch=batch, tokens=1)
    tokens_all = list(range(1, 1025))
    rng.shuffle(tokens_all)
    new_moves = [("tokens", t) for t in tokens_all[: args.moves]]  # then revisited: shapes seen before
    top = [t for t in (1024, 1000) if dantinox.kv_cache_bytes(mha32, batch, t) <= budget]
    near_budget = [("tokens", t) for t in top * max(2, args.moves // 4)]
    near_label = f"arrays, {dantinox.format_bytes(dantinox.kv_cache_bytes(mha32, batch, min(top)))}" \
                 f" to {dantinox.format_bytes(dantinox.kv_cache_bytes(mha32, batch, max(top)))}"

    handler, logger = CompileLog(), logging.getLogger("jax")
    logger.addHandler(handler)
    jax.config.update("jax_log_compiles", True)
    try:
        results = [scenario(lab, "shapes", "shapes", big, shape_moves),
                   scenario(lab, "arrays, first visit", "arrays", alloc, new_moves),
                   scenario(lab, "arrays, revisit", "arrays", alloc, new_moves),
                   scenario(lab, near_label, "arrays", alloc, near_budget)]
    finally:
        jax.config.update("jax_log_compiles", False)
        logger.removeHandler(handler)
    compiled = sorted(set(handler.names))
    model_programs = [n for n in compiled if n not in FILL_PROGRAMS]

    rows = ["| scenario | cache bytes | lab median ms | lab p95 ms | lab max ms | goal ms | peer median ms | "
            "lab / peer | reading (warm) median ms | lab / reading |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        span = f"{dantinox.format_bytes(r['bytes_min'])} – {dantinox.format_bytes(r['bytes_max'])}"
        rows.append(f"| {r['scenario']} | {span} | {r['lab']['median_ms']:.1f} | {r['lab']['p95_ms']:.1f} | "
                    f"{r['lab']['max_ms']:.1f} | {r['goal_ms']} | {r['peer']['median_ms']:.1f} | "
                    f"{r['overhead_ratio_median']:.2f} | {r['reading']['median_ms']:.1f} | "
                    f"{r['widget_ratio_median']:.2f} |")
    print("\n".join(rows))
    print(f"\nprograms compiled during the moves: {', '.join(compiled) or 'none'}")
    print(f"programs other than init_cache's zero-fill (must be none): {', '.join(model_programs) or 'none'}")
    print(f"plot traces after the run: {len(plot.figure.data)} (updated in place)")
    explorer_scenario(args.moves, rng)
    RESULTS.mkdir(exist_ok=True)
    out = {"budget_bytes": budget, "moves": args.moves, "results": results, "compiled": compiled,
           "model_programs_compiled": model_programs, "jax": jax.__version__, "devices": str(jax.devices())}
    (RESULTS / "lab_latency.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {RESULTS / 'lab_latency.json'}")


if __name__ == "__main__":
    main()
