"""SmolLM2-135M as MHA, GQA (the published model), MQA and MLA, converted without retraining, measured side by side.

    nice -n 10 .venv/bin/python benchmarks/variants.py             # ~30 min on two busy cores
    .venv/bin/python benchmarks/variants.py --rounds 2 --no-long   # shorter

The design document this project grew from compared MHA, GQA and MLA in one table (cache at 512 tokens,
decode at batch 1 and 8, prefill, largest batch on a 40 GB device); this script measures that table on a real
model. Every variant is `dantinox.convert_attention` of the published weights (dantinox/architectures/
convert.py says which choice follows which paper): MHA repeats each KV head (exact), MQA mean-pools the three
(Ainslie et al. §2.1), MLA keeps RoPE on r = 4 frequency pairs per KV head chosen by MHA2MLA's 2-norm and
compresses the other key channels and the values by one joint SVD (MHA2MLA, arXiv:2502.14837; its SmolLM-135M
setting: 8 RoPE channels per head, latent 32/16/8 per KV head, i.e. C = 96/48/24). C = 336 is the full rank:
that row costs only what removing RoPE from 28 of 32 pairs costs. No variant is fine-tuned afterwards, as both
papers do.

Per variant, all in one process:
  cache        bytes of `init_cache(cfg, 1, 512)` (float32, measured from the arrays) and per token; equal to
               `kv_cache_bytes` (checked)
  quality      against the published model on the first 1,024 tokens of benchmarks/data/heldout_smollm2.txt
               (two rows of 512; text written in 2026, after SmolLM2's release): perplexity, mean
               KL(original || variant) of the next-token distributions, top-1 agreement with the original
  speed        decode seconds per step over a 512-slot cache at batch 1 and 8 ((t(20 steps) - t(4 steps)) / 16
               of generate's compiled loop, dantinox.accounting.roofline.run_decode), and one 512-token prefill at
               batch 1; every round times every variant once (interleaved), each figure is the best over rounds
  long context decode at batch 8 over 2,048 slots, after the rounds, best of two (--no-long skips it): there
               the cache of MHA, GQA and MQA is larger than the weights, so its size shows in the step time
  largest batch derived: `max_batch_size` with a bfloat16 cache and bfloat16 weights (half the measured float32
               parameter bytes) on dantinox.DEVICE_PRESETS' A100 40GB, H100 80GB and H200, at 512 and 8,192 tokens
  crossover    derived: the context T* at which one decode step reads as many cache bytes as weight bytes,
               weights / (B x cache bytes per token), float32, batch 1 and 8
The MLA calibration text (for the 2-norm choice) is the first 512 tokens of benchmarks/data/heldout.txt
(README prose), not the evaluation text. Conversions are cached in the user cache directory
(dantinox.architectures.convert.load_converted). Writes benchmarks/data/variants_smollm2.json (read by
labs/mla.ipynb) and prints the markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from common import best_of
from flax import nnx

import dantinox
from dantinox.accounting.roofline import run_decode, timing_state
from dantinox.architectures.convert import load_converted

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "data" / "variants_smollm2.json"
SOURCE = "smollm2-135m"
RANK_PAIRS = 4  # r: RoPE pairs kept per KV head (MHA2MLA's SmolLM-135M runs: rope_dim_for_mla 8)
# (label, convert_attention target, its options); None: the published model itself
VARIANTS = [
    ("MHA", "mha", {}),
    ("GQA (published)", None, {}),
    ("MQA", "mqa", {}),
    *[(f"MLA C={c}", "mla", dict(latent_dim=c, rope_pairs=RANK_PAIRS)) for c in (336, 192, 96, 48)],
]
CONTEXT = 512  # the seed's cache column, the decode cache and the prefill length
LONG_CONTEXT = 2048  # at batch 8 the cache outgrows the weights for every variant but the narrow MLAs
BATCHES = (1, 8)
EVAL_TOKENS, EVAL_ROWS = 512, 2
CALIBRATION_TOKENS = 512
SHORT, LONG = 4, 20  # decode loop lengths whose difference gives a step
DEVICES = ("A100 40GB", "H100 80GB", "H200 141GB")
BATCH_CONTEXTS = (512, 8192)
# The design document's claims, as ratios to GQA (decode, prefill) and absolute batches on a 40 GB device.
SEED = {"decode_vs_gqa": {"GQA (published)": 1.0, "MHA": 1.0, "MLA": 0.8},
        "prefill_slowdown_mla": "10-30 %", "batch_40gb": {"MHA": 100, "GQA (published)": 400, "MLA": 1500}}


def text_ids(tok, name: str, n: int) -> np.ndarray:
    ids = np.asarray(tok.encode((ROOT / "benchmarks" / "data" / name).read_text(encoding="utf-8")), np.int32)
    if len(ids) < n:
        raise SystemExit(f"benchmarks/data/{name}: needs {n} tokens, has {len(ids)}")
    return ids[:n]


def quality_scores(logits_BTV: np.ndarray, ref_BTV: np.ndarray, ids_BT: np.ndarray) -> dict:
    """Perplexity, mean KL(reference || this) and top-1 agreement over every predicted position."""
    logp = jax.nn.log_softmax(jnp.asarray(logits_BTV[:, :-1], jnp.float32), axis=-1)
    ref = jax.nn.log_softmax(jnp.asarray(ref_BTV[:, :-1], jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, jnp.asarray(ids_BT[:, 1:])[..., None], axis=-1).mean()
    kl = (jnp.exp(ref) * (ref - logp)).sum(-1).mean()
    return dict(perplexity=float(jnp.exp(nll)), kl=float(kl), top1=float((logp.argmax(-1) == ref.argmax(-1)).mean()))


@functools.partial(jax.jit, static_argnums=0)
def _eval_logits(graphdef, state, ids_BT):
    return nnx.merge(graphdef, state).forward(ids_BT)[0]


class Timer:
    """A variant's compiled decode loop and prefill, timed one call at a time so rounds can interleave."""

    def __init__(self, model: dantinox.Transformer):
        self.cfg = model.cfg
        self.graphdef, self.params = nnx.split(model)
        self.states = {}
        self.prefill = jax.jit(lambda p, ids: nnx.merge(self.graphdef, p).forward(
            ids, dantinox.init_cache(self.cfg, ids.shape[0], ids.shape[1])))
        self.prompt = jnp.asarray(np.random.RandomState(0).randint(0, self.cfg.vocab_size, (1, CONTEXT)), jnp.int32)

    def loop(self, batch: int, context: int, steps: int) -> float:
        """One timed run of `steps` decode steps, each attending over all `context` slots (one state per batch and
        context holds context - LONG tokens; a loop stops `steps` later)."""
        key = (batch, context)
        if key not in self.states:
            self.states[key] = timing_state(self.cfg, batch, context, context - LONG)
            jax.block_until_ready(run_decode(self.graphdef, self.params, self.states[key], context, context))
        stop = context - LONG + steps
        return best_of(lambda: run_decode(self.graphdef, self.params, self.states[key], stop, context), 1,
                       warmup=False)

    def drop(self, batch: int, context: int) -> None:
        self.states.pop((batch, context), None)  # a long cache's buffers go before the next variant's

    def prefill_s(self) -> float:
        return best_of(lambda: self.prefill(self.params, self.prompt), 1)


def measure(rounds: int, long: bool, out: Path) -> dict:
    """Every phase in order; `out` is rewritten after each (a stopped run keeps what it measured)."""
    started, loads = time.time(), [os.getloadavg()[0]]
    cfg, original, tok = dantinox.load_pretrained(SOURCE)
    calibration = text_ids(tok, "heldout.txt", CALIBRATION_TOKENS)[None]
    ids = text_ids(tok, "heldout_smollm2.txt", EVAL_TOKENS * EVAL_ROWS).reshape(EVAL_ROWS, EVAL_TOKENS)
    ref = np.asarray(_eval_logits(*nnx.split(original), jnp.asarray(ids)))
    rows, models = [], {}
    for label, to, options in VARIANTS:
        t0 = time.time()
        model = original if to is None else load_converted(SOURCE, to, calibration_ids=calibration, **options)[1]
        load_s = time.time() - t0
        c = model.cfg
        nbytes = dantinox.init_cache(c, 1, CONTEXT).nbytes  # allocated, then measured from the arrays
        assert nbytes == dantinox.kv_cache_bytes(c, 1, CONTEXT), label
        logits = ref if to is None else np.asarray(_eval_logits(*nnx.split(model), jnp.asarray(ids)))
        weight_bytes = dantinox.param_bytes(model)
        bf16 = c.with_cache(cache_dtype="bfloat16")
        row = dict(label=label, variant=c.variant, convert=to, options=options, config=c.to_dict(),
                   cache_bytes_512=nbytes, bytes_per_token=nbytes / CONTEXT,
                   elements_per_token_per_layer=c.kv_elements_per_token_per_layer, weight_bytes=weight_bytes,
                   convert_or_load_s=load_s, **quality_scores(logits, ref, ids),
                   max_batch={f"{d}/{t}": dantinox.max_batch_size(bf16, dantinox.DEVICE_PRESETS[d].memory_bytes, t,
                                                                   weight_bytes=weight_bytes // 2)
                              for d in DEVICES for t in BATCH_CONTEXTS},
                   crossover_context={str(b): weight_bytes / (b * nbytes / CONTEXT) for b in BATCHES})
        if c.variant == "mla":
            row["rope_pairs_layer0"] = [list(p) for p in c.layers[0].rope_pairs]
        rows.append(row)
        models[label] = Timer(model)
        print(f"{label}: {row['bytes_per_token']:,.0f} B/token, perplexity {row['perplexity']:.2f}, "
              f"KL {row['kl']:.3f}, top-1 {row['top1']:.1%}", flush=True)
    def result(phase: str) -> dict:
        r = dict(model=SOURCE, date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                 phase=phase, rounds=rounds, context=CONTEXT, long_context=LONG_CONTEXT if long else None,
                 eval=dict(file="heldout_smollm2.txt", rows=EVAL_ROWS, tokens=EVAL_TOKENS),
                 calibration=dict(file="heldout.txt", tokens=CALIBRATION_TOKENS), rope_pairs=RANK_PAIRS,
                 devices={d: dantinox.DEVICE_PRESETS[d].memory_bytes for d in DEVICES},
                 batch_contexts=BATCH_CONTEXTS, machine=dict(cpus=os.cpu_count(), jax=jax.__version__,
                                                             load_avg_1min=loads),
                 wall_s=time.time() - started, seed=SEED,
                 gpu="not measured: no device machine was lent to this run", rows=rows)
        out.write_text(json.dumps(r, indent=2) + "\n")
        return r

    result("quality")
    best: dict[str, float] = {}

    def keep(key: str, seconds: float) -> None:
        best[key] = min(best.get(key, float("inf")), seconds)

    for r in range(rounds + 1):  # round 0 compiles every program, untimed
        for label, timer in models.items():
            for b in BATCHES:
                for steps in (SHORT, LONG):
                    s = timer.loop(b, CONTEXT, steps)
                    if r:
                        keep(f"{label}/decode/{b}/{steps}", s)
            s = timer.prefill_s()
            if r:
                keep(f"{label}/prefill", s)
        loads.append(os.getloadavg()[0])
        print(f"round {r} done ({time.time() - started:.0f} s)", flush=True)
    for row in rows:
        label = row["label"]
        row["decode_step_s"] = {str(b): (best[f"{label}/decode/{b}/{LONG}"] - best[f"{label}/decode/{b}/{SHORT}"])
                                / (LONG - SHORT) for b in BATCHES}
        row["decode_tok_s"] = {b: int(b) / s for b, s in row["decode_step_s"].items()}
        row["prefill_512_s"] = best[f"{label}/prefill"]
    result("timed")
    if long:
        for label, timer in models.items():  # one round: a compile, then each loop once
            t = {steps: min(timer.loop(8, LONG_CONTEXT, steps) for _ in range(2)) for steps in (SHORT, LONG)}
            timer.drop(8, LONG_CONTEXT)
            next(r for r in rows if r["label"] == label)["decode_step_s_8_long"] = (t[LONG] - t[SHORT]) / (LONG - SHORT)
            print(f"{label}: long context done", flush=True)
        loads.append(os.getloadavg()[0])
    return result("done")


def table(result: dict) -> str:
    gqa = next(r for r in result["rows"] if r["convert"] is None)
    lines = ["| variant | B/token | cache at 512 | vs GQA | perplexity | KL | top-1 | decode b1 tok/s (vs GQA) | "
             "decode b8 tok/s (vs GQA) | prefill 512 (vs GQA) | b8 step at 2,048 (vs GQA) | "
             "max batch 40 GB / 80 GB / H200 at 512 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        tok = r["decode_tok_s"]
        long = r.get("decode_step_s_8_long")
        long_text = ("not measured" if long is None
                     else f"{long * 1e3:.0f} ms ({long / gqa['decode_step_s_8_long']:.2f}×)")
        batches = " / ".join(f"{r['max_batch'][f'{d}/512']:,}" for d in result["devices"])
        lines.append(
            f"| {r['label']} | {r['bytes_per_token']:,.0f} | {dantinox.format_bytes(r['cache_bytes_512'])} | "
            f"{r['cache_bytes_512'] / gqa['cache_bytes_512']:.2f}× | {r['perplexity']:,.1f} | {r['kl']:.2f} | "
            f"{r['top1']:.1%} | {tok['1']:.1f} ({tok['1'] / gqa['decode_tok_s']['1']:.2f}×) | "
            f"{tok['8']:.1f} ({tok['8'] / gqa['decode_tok_s']['8']:.2f}×) | {r['prefill_512_s'] * 1e3:.0f} ms "
            f"({r['prefill_512_s'] / gqa['prefill_512_s']:.2f}×) | {long_text} | {batches} |")
    return "\n".join(lines)


def seed_table(result: dict) -> str:
    """The design document's claims beside the same ratios from this run (MLA: the widest and narrowest widths)."""
    rows = {r["label"]: r for r in result["rows"]}
    mha, gqa = rows["MHA"], rows["GQA (published)"]
    mlas = [r for r in result["rows"] if r["variant"] == "mla"]

    def ratio(r: dict, key: str, batch: str | None = None) -> float:
        a, b = (r[key], mha[key]) if batch is None else (r[key][batch], mha[key][batch])
        return a / b

    lines = ["| claim (design document) | measured here |", "|---|---|"]
    lines.append(f"| GQA decode ~1.0× MHA | batch 1: {ratio(gqa, 'decode_tok_s', '1'):.2f}×, batch 8: "
                 f"{ratio(gqa, 'decode_tok_s', '8'):.2f}× |")
    for r in mlas:
        lines.append(f"| {r['label']} decode ~0.8× MHA (absorb overhead) | batch 1: "
                     f"{ratio(r, 'decode_tok_s', '1'):.2f}×, batch 8: {ratio(r, 'decode_tok_s', '8'):.2f}× |")
    for r in mlas:
        lines.append(f"| {r['label']} prefill 10-30 % slower than MHA | {ratio(r, 'prefill_512_s') - 1:+.0%} |")
    a100 = f"{next(iter(result['devices']))}/512"  # the first device: A100 40GB
    lines.append(f"| largest batch on 40 GB ~100 / ~400 / ~1500 (MHA / GQA / MLA) | {mha['max_batch'][a100]:,} / "
                 f"{gqa['max_batch'][a100]:,} / " + " / ".join(f"{r['max_batch'][a100]:,} ({r['label']})"
                                                               for r in mlas) + " (derived, 512 tokens, bf16) |")
    lines.append("| context where the cache starts to matter (not claimed) | " + "; ".join(
        f"{r['label']}: {r['crossover_context']['1']:,.0f} tokens at batch 1, {r['crossover_context']['8']:,.0f} "
        f"at batch 8" for r in (mha, gqa, *mlas[-2:])) + " (derived: weights / (B × cache bytes per token)) |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds after the compiling one")
    parser.add_argument("--no-long", action="store_true", help="skip the batch-8 decode over 4,096 slots")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--only", nargs="+", help="measure only these labels (a trial run; --out elsewhere)")
    args = parser.parse_args()
    if args.only:
        unknown = sorted(set(args.only) - {label for label, _, _ in VARIANTS})
        if unknown:
            raise SystemExit(f"--only: unknown label(s) {', '.join(unknown)}")
        VARIANTS[:] = [v for v in VARIANTS if v[0] in args.only]
    result = measure(args.rounds, not args.no_long, args.out)
    print(table(result))
    print(seed_table(result))
    print(f"stored in {args.out}")


if __name__ == "__main__":
    main()
