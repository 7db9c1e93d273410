"""MLA vs MHA vs GQA decode benchmark on the reference model (a benchmark, not a test).

    .venv/bin/python benchmarks/mla.py                 # about 5 minutes on 2 CPU cores
    .venv/bin/python benchmarks/mla.py --max-batch-steps 2 --repeats 1   # quicker, noisier

Reproduces the trade-off "MLA is slower per decode step but fits far more sequences":
  1. decode tokens/s at batch 1 and 8 (32-token prompt, 256 new tokens, dantinox.generate, after a
     warm-up compile; the prefill is timed separately with 0 new tokens and subtracted);
  2. the largest batch whose 512-token cache fits a 2 GiB budget (dantinox.max_batch_size, weights
     subtracted), and decode measured at that batch for a fixed number of steps at positions 480+ of
     a 512-slot cache (the same compiled step generate() loops over; the cache holds zeros, which
     costs the same as real keys; a full 512-token generation at these batches would take too long
     on a 2-core CPU).
Prints a markdown table and writes benchmarks/results/mla.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from common import best_of
from flax import nnx

import dantinox
from dantinox.generation.generate import DecodeState, _step

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
C, R = 64, 16  # C = 2·H, R = H/2 (DeepSeek-V2: 4·d_h, d_h/2): 80 numbers per token per layer, GQA with 1.25 KV heads
VARIANTS = {
    "MHA": dict(),
    "GQA (K=2)": dict(kv_heads=2),
    "MLA absorbed": dict(attention="latent", kv_latent_dim=C, rope_head_dim=R, mla_decode="absorbed"),
    "MLA materialized": dict(attention="latent", kv_latent_dim=C, rope_head_dim=R, mla_decode="materialized"),
}
BATCHES = (1, 8)
PROMPT, NEW = 32, 256
BUDGET, TOKENS = 2 * 2**30, 512  # 2 GiB of cache for sequences of 512 tokens
FIRST_STEP = 480  # max-batch steps run at positions 480.., inside the 512-slot window


def config(variant: str) -> dantinox.ModelConfig:
    # f32 compute, bf16 cache storage (bf16 arithmetic is slow on XLA:CPU); 512 slots so the budget is exact
    return dantinox.ModelConfig.preset("reference", max_context=TOKENS, cache_dtype="bfloat16", **VARIANTS[variant])


def prompt(batch: int) -> np.ndarray:
    return np.random.RandomState(0).randint(0, 256, (batch, PROMPT)).astype(np.int32)


def decode_grid(models: dict[str, dantinox.Transformer], repeats: int) -> dict[str, dict[int, float]]:
    """Decode tok/s per variant and batch. Repeats go round-robin over the variants, so load from other
    processes on a shared machine lands on all of them alike, and each keeps its best time."""
    prompts = {batch: prompt(batch) for batch in BATCHES}
    for model in models.values():
        for p in prompts.values():
            dantinox.generate(model, p, NEW).block_until_ready()  # compile: one program for any step count
    best = {(v, b, n): np.inf for v in models for b in BATCHES for n in (0, NEW)}
    for _ in range(repeats):
        for batch, p in prompts.items():
            for variant, model in models.items():
                for new in (0, NEW):  # 0 new tokens times the prefill alone, subtracted below
                    seconds = best_of(lambda: dantinox.generate(model, p, new), 1, warmup=False)  # noqa: B023
                    best[variant, batch, new] = min(best[variant, batch, new], seconds)
    return {v: {b: b * NEW / (best[v, b, NEW] - best[v, b, 0]) for b in BATCHES} for v in models}


@partial(jax.jit, static_argnums=(0,), donate_argnums=(2,))
def _decode_steps(graphdef, params, state: DecodeState, n_steps):
    """`n_steps` greedy steps of generate()'s own step function; the state is donated so writes are in place."""
    step = lambda _, s: _step(graphdef, params, s, None, None, True, TOKENS)  # noqa: E731  (generate's own step)
    return jax.lax.fori_loop(0, n_steps, step, state)


def filled_state(cfg: dantinox.ModelConfig, batch: int) -> DecodeState:
    """A decode state at position FIRST_STEP of a zeroed 512-slot cache."""
    tokens = jnp.zeros((batch, cfg.max_context), jnp.int32)
    logits = jnp.zeros((batch, cfg.vocab_size), jnp.float32)
    cache = dantinox.init_cache(cfg, batch)
    held = jnp.full((batch,), FIRST_STEP, jnp.int32)
    return DecodeState(tokens, cache._replace(lengths=held), held, jnp.full((batch,), cfg.max_context, jnp.int32),
                       logits, jax.random.key(0))


def max_batch_steps(models: dict[str, dantinox.Transformer], batches: dict[str, int], steps: int,
                    repeats: int) -> dict[str, float]:
    """Seconds per decode step at each variant's largest batch, best of round-robin repeats."""
    split = {v: nnx.split(models[v]) for v in batches}
    for v, (graphdef, params) in split.items():
        jax.block_until_ready(_decode_steps(graphdef, params, filled_state(models[v].cfg, batches[v]), 1))  # compile
    best = dict.fromkeys(batches, np.inf)
    for _ in range(repeats):
        for v, (graphdef, params) in split.items():
            state = jax.block_until_ready(filled_state(models[v].cfg, batches[v]))
            start = time.perf_counter()
            jax.block_until_ready(_decode_steps(graphdef, params, state, steps))
            best[v] = min(best[v], (time.perf_counter() - start) / steps)
            del state  # donated; free the 2 GiB before the next variant allocates its own
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="best-of repeats, round-robin over the variants")
    ap.add_argument("--max-batch-steps", type=int, default=4, help="decode steps timed at the largest batch")
    ap.add_argument("--skip-materialized-max-batch", action="store_true",
                    help="skip the slowest row (materialized MLA at its largest batch)")
    args = ap.parse_args()
    dantinox.enable_compilation_cache()  # persist compiled programs across runs, as the CLI does

    models = {v: dantinox.Transformer(config(v), rngs=nnx.Rngs(0)) for v in VARIANTS}
    rows = {v: {"kv_elements_per_token_per_layer": m.cfg.kv_elements_per_token_per_layer,
                "kv_bytes_per_sequence": dantinox.kv_cache_bytes(m.cfg, 1, TOKENS),
                "param_bytes": dantinox.param_bytes(m),
                "max_batch": dantinox.max_batch_size(m.cfg, BUDGET, TOKENS)} for v, m in models.items()}
    for v, tok_s in decode_grid(models, args.repeats).items():
        rows[v].update({f"decode_tok_s_batch{b}": t for b, t in tok_s.items()})
        print(v, {b: round(t) for b, t in tok_s.items()}, flush=True)
    measured = [v for v in VARIANTS if not (args.skip_materialized_max_batch and v == "MLA materialized")]
    step_s = max_batch_steps(models, {v: rows[v]["max_batch"] for v in measured}, args.max_batch_steps,
                             args.repeats)
    for v, seconds in step_s.items():
        rows[v].update(step_s_at_max_batch=seconds, tok_s_at_max_batch=rows[v]["max_batch"] / seconds)

    mha = rows["MHA"]
    lines = [f"Reference model (12 layers, d_model 256, 8 heads of 32; f32 compute, bf16 cache), MLA with "
             f"C = {C}, R = {R}; {os.cpu_count()} CPU cores, jax {jax.__version__} ({jax.default_backend()}).",
             f"Decode tok/s: {PROMPT}-token prompt, {NEW} new tokens via dantinox.generate, prefill subtracted. "
             f"Max batch: {TOKENS}-token sequences whose cache fits {dantinox.format_bytes(BUDGET)} (weights "
             f"subtracted), {args.max_batch_steps} decode steps timed at positions {FIRST_STEP}+ of the "
             f"{TOKENS}-slot cache.",
             f"Every timing is the best of {args.repeats} round-robin repeats; all numbers measured in one run.", "",
             "| variant | cached numbers / token / layer | cache / 512-token sequence | tok/s batch 1 | "
             "tok/s batch 8 | max batch in 2 GiB | step at max batch | tok/s at max batch | vs MHA |",
             "|---|---|---|---|---|---|---|---|---|"]
    for variant, row in rows.items():
        at_max = ("not run | not run | –" if "step_s_at_max_batch" not in row else
                  f"{row['step_s_at_max_batch']:.2f} s | {row['tok_s_at_max_batch']:,.0f} | "
                  f"{row['tok_s_at_max_batch'] / mha['tok_s_at_max_batch']:.2f}×")
        lines.append(f"| {variant} | {row['kv_elements_per_token_per_layer']} | "
                     f"{dantinox.format_bytes(row['kv_bytes_per_sequence'])} | {row['decode_tok_s_batch1']:,.0f} | "
                     f"{row['decode_tok_s_batch8']:,.0f} | {row['max_batch']:,} | {at_max} |")
    table = "\n".join(lines)
    print(table)
    RESULTS.mkdir(exist_ok=True)
    result = {"machine": {"cpus": os.cpu_count(), "jax": jax.__version__, "backend": jax.default_backend()},
              "mla": {"kv_latent_dim": C, "rope_head_dim": R}, "budget_bytes": BUDGET, "tokens": TOKENS,
              "prompt": PROMPT, "new_tokens": NEW, "max_batch_steps": args.max_batch_steps, "rows": rows,
              "table": table}
    (RESULTS / "mla.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
