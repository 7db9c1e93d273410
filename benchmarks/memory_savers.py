"""Memory savers: cache bytes per token against quality on held-out text, on the tiny models and on SmolLM2-135M.

    .venv/bin/python benchmarks/memory_savers.py            # every configuration whose run exists (~3 min)
    .venv/bin/python benchmarks/memory_savers.py --check    # also fail unless every configuration was measured
    nice -n 10 .venv/bin/python benchmarks/memory_savers.py --part smollm2   # SmolLM2-135M (see SMOLLM2 below)

For each configuration: the cache that `dantinox.init_cache` allocates for one 256-token sequence (bytes per
token, measured from the arrays, and the content formula for it, which must agree to the byte); and, on the
held-out text, bits per byte, its change against the float MHA cache (runs/tiny), greedy next-token agreement
with that float MHA model and with the same weights' float32 cache, and the largest logit difference from
the same weights' float32 cache (0 for a float config: there it is the reference).

Held-out text: benchmarks/data/heldout.txt, the prose of README.md at commit 2d31f92 (tables, code and
headings removed), cut into 256-token rows. The models train on the text of content/entries, which it does
not contain (no 40-byte piece of it occurs in the training corpus). The byte-level models memorise their small
corpus, so on new text their bits per byte are high; the differences between configurations are the point.

Runs: GQA, MQA and MLA C=64 are runs/tiny-gqa, tiny-mqa, tiny-mla (runs/train_lab_runs.py); MLA C=32 and the
sliding-window models are runs/train_memory_savers.py. All use runs/tiny's size, recipe and steps (1,500), so
each architecture is compared after the same training. Quantized caches reuse a run's weights unchanged; the
"not retrained" rows impose a window on runs/tiny's MHA weights at inference, to show what retraining buys.
Writes benchmarks/data/memory_savers.json (read by labs/memory-savers.ipynb) and prints a markdown table.

SMOLLM2 (--part smollm2, writes benchmarks/data/memory_savers_smollm2.json after every configuration): the
first 4,096 tokens of benchmarks/data/heldout_smollm2.txt, the prose fields (role, description, tradeoff,
why_ai, engineering_example, evidence_notes) of this project's content/entries at commit 92502cd, written in
2026, after SmolLM2's release (November 2024), so not in its training data. One sequence; every saver is
applied to the published weights without retraining. Reference: the float32 model with a full float32 cache.
Per configuration: bytes of the cache for the whole text (from the shapes of init_cache, equal to
kv_cache_bytes and to the concept entry's formula), perplexity, top-1 agreement with the reference's next-token
choice and the mean KL(reference || saver) of the next-token distributions, and perplexity per 64-token bin.
How each is decoded through its real layout:
  one pass     full, int8, fp8, windows and windows + sinks: the whole text written through the cache in one
               call; for these layouts that is what token-by-token decoding computes (per-token scales; a ring
               and a sink ring attend over their band: tests/test_kivi_and_sinks.py, test_sliding_window.py)
  chunks of 32 KIVI and H2O, whose prefill differs from decoding: 128 calls of 32 tokens. A call's queries
               see its own 32 tokens at full precision (KIVI: up to R + 31 recent tokens unquantized instead of
               R) and H2O evicts once per call, from budget + 32 candidates, instead of once per token
  recompute    sliding-window recomputation in strides of W: chunks of 2W tokens from scratch, each token of a
               chunk's second half predicted from the last W + 1 to 2W tokens (StreamingLLM's baseline, strided)
The run stops starting configurations after --budget-s seconds and records the rest as not measured; --resume
measures only those (recomputing the reference for KL) and adds its wall time to the stored total.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import doc_tables
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import content
import dantinox
from dantinox.architectures.config import PRESETS
from dantinox.architectures.windows import local_layers
from dantinox.generation import quality

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "data" / "memory_savers.json"
TOKENS = 256  # one held-out row: the tiny preset's max_context

# (label, family, run directory, config changes applied to the run's weights)
CONFIGS = [
    ("MHA fp32", "baseline", "tiny", {}),
    ("MHA bf16", "quantized", "tiny", dict(cache_dtype="bfloat16")),
    ("MHA int8", "quantized", "tiny", dict(cache_dtype="int8")),
    ("MHA fp8 e4m3", "quantized", "tiny", dict(cache_dtype="fp8_e4m3")),
    ("GQA K=2", "heads", "tiny-gqa", {}),
    ("MQA K=1", "heads", "tiny-mqa", {}),
    ("MLA C=64 R=16", "latent", "tiny-mla", {}),
    ("MLA C=32 R=16", "latent", "tiny-mla-c32", {}),
    ("SWA W=64 local", "window", "tiny-swa64-local", {}),
    ("SWA W=64 1:1", "window", "tiny-swa64-1to1", {}),
    ("SWA W=16 local", "window", "tiny-swa16-local", {}),
    ("SWA W=16 1:1", "window", "tiny-swa16-1to1", {}),
    ("GQA K=2 + int8", "combined", "tiny-gqa", dict(cache_dtype="int8")),
    # The same windows imposed on the MHA weights at inference only: what skipping the retraining costs.
    *[(f"SWA W={w} {p}, MHA weights (not retrained)", "window, not retrained", "tiny",
       dict(sliding_windows=local_layers(PRESETS["tiny"]["n_layers"], w, n))) for w in (64, 16)
      for p, n in (("local", None), ("1:1", 1))],
]


def measure_bytes(cfg: dantinox.ModelConfig) -> dict:
    """Bytes of the allocated cache for one TOKENS-long sequence and the content formula's bytes for it."""
    measured = dantinox.tree_nbytes(dantinox.init_cache(cfg, 1, TOKENS))
    entry_id, title, variables = quality.formula_for(cfg, 1, TOKENS)
    derived = content.evaluate(content.load_entry(entry_id), title, **variables)
    return dict(bytes=measured, formula_bytes=derived, formula=f"{entry_id}: {title}", formula_vars=variables,
                bytes_per_token=measured / TOKENS)


def run(runs_dir: Path = ROOT / "runs") -> dict:
    ids = quality.heldout_chunks((ROOT / "benchmarks" / "data" / "heldout.txt").read_text(encoding="utf-8"), TOKENS)
    float_logits: dict[str, np.ndarray] = {}
    rows, missing = [], []
    for label, family, run_name, changes in CONFIGS:
        if not (runs_dir / run_name / "weights.safetensors").is_file():
            missing.append(dict(label=label, run=f"runs/{run_name}"))
            print(f"skipped {label}: runs/{run_name} is not trained", file=sys.stderr)
            continue
        _, model = dantinox.load_run(runs_dir / run_name)
        if run_name not in float_logits:
            float_logits[run_name] = quality.cached_logits(model, ids)  # every shipped run has a float32 cache
        model = quality.with_changes(model, **changes)
        logits = quality.cached_logits(model, ids)
        own = float_logits[run_name]
        row = dict(label=label, family=family, run=f"runs/{run_name}", cache_dtype=model.cfg.cache_dtype,
                   config=model.cfg.to_dict(), **measure_bytes(model.cfg),
                   bits_per_byte=quality.bits_per_byte(logits, ids),
                   agreement_vs_mha=quality.agreement(logits, float_logits["tiny"]),
                   agreement_vs_own_float=quality.agreement(logits, own),
                   max_logit_error=quality.max_logit_error(logits, own))
        rows.append(row)
        print(f"measured {label}", file=sys.stderr, flush=True)
    base = next((r for r in rows if r["family"] == "baseline"), None)
    for r in rows:
        r["delta_bits_per_byte"] = None if base is None else r["bits_per_byte"] - base["bits_per_byte"]
    return dict(date=datetime.date.today().isoformat(), tokens=TOKENS, heldout_rows=int(ids.shape[0]),
                heldout="benchmarks/data/heldout.txt: README.md prose at commit 2d31f92, not in the training text",
                rows=rows, missing=missing)


def table(result: dict) -> str:
    lines = ["| configuration | run | cache B/token | formula B/token | bits/byte | Δ vs MHA fp32 | "
             "agree vs MHA fp32 | agree vs own fp32 | max logit err |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['label']} | {r['run']} | {r['bytes_per_token']:,.1f} | {r['formula_bytes'] / TOKENS:,.1f} "
                     f"| {r['bits_per_byte']:.4f} | {r['delta_bits_per_byte']:+.4f} | {r['agreement_vs_mha']:.2%} "
                     f"| {r['agreement_vs_own_float']:.2%} | {r['max_logit_error']:.3f} |")
    for m in result["missing"]:
        lines.append(f"| {m['label']} | {m['run']} (not trained) | | | | | | | |")
    return "\n".join(lines)


SMOL_OUT = ROOT / "benchmarks" / "data" / "memory_savers_smollm2.json"
SMOL_TEXT = "heldout_smollm2.txt"
SMOL_SOURCE = ("benchmarks/data/heldout_smollm2.txt: the prose fields of content/entries at commit 92502cd, "
               "written in 2026, after SmolLM2's release (November 2024)")
SMOL_TOKENS = 4096
CHUNK = 32  # tokens per call for KIVI and H2O
BIN = 64  # tokens per point of the perplexity-vs-position curves
SINKS = 4
KIVI_HEAD = 0  # the block the lab's KIVI view shows: the middle layer, this KV head, the first 32 tokens


def smol_configs(n_layers: int) -> list[tuple[str, str, str, dict]]:
    """(label, family, how it is decoded, config changes or the recomputation window) in the order they run."""
    def win(w):
        return local_layers(n_layers, w)
    small = [("window 256 (not retrained)", "window", "one pass", dict(sliding_windows=win(256))),
             ("window 252 + 4 sinks", "sinks", "one pass", dict(sliding_windows=win(252), attention_sinks=SINKS))]
    large = [("window 1024 (not retrained)", "window", "one pass", dict(sliding_windows=win(1024))),
             ("window 1020 + 4 sinks", "sinks", "one pass", dict(sliding_windows=win(1020), attention_sinks=SINKS))]
    return [("fp32 full cache", "baseline", "one pass", {}), *small,
            ("int8", "quantized", "one pass", dict(cache_dtype="int8")),
            ("kivi2 G=32 R=128", "kivi", "chunks", dict(cache_dtype="kivi2")),
            ("h2o budget 256", "eviction", "chunks", dict(cache_budget=256, eviction="h2o")),
            ("window 256 recomputed", "recompute", "recompute", dict(window=256)),
            ("kivi4 G=32 R=128", "kivi", "chunks", dict(cache_dtype="kivi4")),
            ("fp8 e4m3", "quantized", "one pass", dict(cache_dtype="fp8_e4m3")), *large,
            ("window 1024 recomputed", "recompute", "recompute", dict(window=1024))]


def _one_pass(model, ids_BT):
    graphdef, params = nnx.split(model)

    @jax.jit
    def run(params, ids):
        logits, cache = nnx.merge(graphdef, params).forward(ids, dantinox.init_cache(model.cfg, 1, ids.shape[1]))
        return logits, cache
    return run(params, jnp.asarray(ids_BT))


def _chunks(model, ids_BT):
    graphdef, params = nnx.split(model)
    step = jax.jit(lambda p, ids, cache: nnx.merge(graphdef, p).forward(ids, cache), donate_argnums=2)
    cache, out = dantinox.init_cache(model.cfg, 1, ids_BT.shape[1]), []
    for start in range(0, ids_BT.shape[1], CHUNK):
        logits, cache = step(params, jnp.asarray(ids_BT[:, start:start + CHUNK]), cache)
        out.append(np.asarray(logits[0]))
    return np.concatenate(out)


def _recompute(model, ids_BT, window):
    graphdef, params = nnx.split(model)
    run = jax.jit(lambda p, ids: nnx.merge(graphdef, p).forward(ids)[0])
    T, out = ids_BT.shape[1], []
    for start in range(0, T - window, window):
        logits = np.asarray(run(params, jnp.asarray(ids_BT[:, start:start + 2 * window]))[0])
        out.append(logits if start == 0 else logits[window:])  # the first chunk's first half: the full context
    return np.concatenate(out)


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _scores(logits_TV, ids_T, ref_logp_TV):
    """Per predicted position: negative log-likelihood, top-1 agreement with the reference, KL(ref || this)."""
    nll, agree, kl = [], [], []
    for a in range(0, len(ids_T) - 1, 512):
        b = min(a + 512, len(ids_T) - 1)
        logp = _log_softmax(logits_TV[a:b].astype(np.float64))
        ref = ref_logp_TV[a:b].astype(np.float64)
        nll.append(-logp[np.arange(b - a), ids_T[a + 1:b + 1]])
        agree.append(logp.argmax(-1) == ref.argmax(-1))
        kl.append((np.exp(ref) * (ref - logp)).sum(-1))
    return np.concatenate(nll), np.concatenate(agree), np.concatenate(kl)


def smol_bytes(cfg: dantinox.ModelConfig, tokens: int) -> dict:
    measured = dantinox.cache_shapes(cfg, 1, tokens).nbytes
    entry_id, title, variables = quality.formula_for(cfg, 1, tokens)
    derived = content.evaluate(content.load_entry(entry_id), title, **variables)
    return dict(bytes=measured, formula_bytes=derived, kv_cache_bytes=dantinox.kv_cache_bytes(cfg, 1, tokens),
                formula=f"{entry_id}: {title}", bytes_per_token=measured / tokens)


def run_smollm2(out: Path = SMOL_OUT, budget_s: float = 1150.0, source: str = "smollm2-135m",
                resume: bool = False, only: list[str] | None = None) -> dict:
    """Measure every SmolLM2 configuration in order, writing `out` after each; stop starting new ones at budget_s.

    `resume` keeps the rows already in `out` and measures the others (the reference is computed again for KL);
    `only` measures just those labels, in that order, after the reference.
    """
    started = time.time()
    earlier = json.loads(out.read_text()) if resume and out.is_file() else None
    cfg, model, tok = dantinox.load_pretrained(source)
    ids = np.asarray(tok.encode(shipped_text(SMOL_TEXT)), np.int32)[:SMOL_TOKENS]
    if len(ids) < SMOL_TOKENS:
        raise ValueError(f"{SMOL_TEXT}: needs {SMOL_TOKENS} tokens, has {len(ids)}")
    ids_BT = ids[None]
    result = dict(model=source, date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                  tokens=SMOL_TOKENS, heldout=SMOL_SOURCE, chunk=CHUNK, bin=BIN, rows=[], missing=[],
                  load_avg=list(__import__("os").getloadavg()), budget_s=budget_s, runs=[])
    if earlier is not None:
        runs = earlier.get("runs") or [dict(started=earlier["date"], wall_s=earlier["wall_s"],  # one earlier run
                                            measured=[r["label"] for r in earlier["rows"]],
                                            load_avg=earlier.get("load_avg"))]
        result.update(rows=earlier["rows"], runs=runs, kivi_block=earlier.get("kivi_block"), date=earlier["date"])
    done = {r["label"] for r in result["rows"]}
    this_run = dict(started=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"), measured=[],
                    load_avg=list(__import__("os").getloadavg()))
    result["runs"].append(this_run)
    ref_logp = None
    configs = smol_configs(cfg.n_layers)
    if only is not None:
        known = {c[0]: c for c in configs}
        unknown = [label for label in only if label not in known]
        if unknown:
            raise ValueError(f"only: unknown configuration(s) {', '.join(unknown)}; "
                             f"expected some of {', '.join(known)}")
        configs = [configs[0], *(known[label] for label in only if label != configs[0][0])]
    for label, family, how, changes in configs:
        if label in done and (family != "baseline" or ref_logp is not None):
            continue
        if time.time() - started > budget_s:
            result["missing"].append(dict(label=label, why=f"not started: the run's {budget_s:.0f} s budget was spent"))
            continue
        t0 = time.time()
        row = dict(label=label, family=family, decoded=how)
        if how == "recompute":
            W = changes["window"]
            logits = _recompute(model, ids_BT, W)
            # the model recomputes at most 2W tokens at a time: the cache of a 2W-token forward
            row.update(smol_bytes(cfg, 2 * W), window=W, config=None)
            row["bytes_per_token"] = row["bytes"] / SMOL_TOKENS
        else:
            m = quality.with_changes(model, **changes)
            row.update(smol_bytes(m.cfg, SMOL_TOKENS), config={k: v for k, v in changes.items()})
            if how == "one pass":
                logits, cache = _one_pass(m, ids_BT)
                logits = np.asarray(logits[0])
                if ref_logp is None:  # the reference: also the real key and value block for the lab's KIVI view
                    middle = cfg.n_layers // 2
                    layer = cache.layers[middle]
                    result["kivi_block"] = dict(
                        layer=middle, head=KIVI_HEAD, tokens=[0, 32], group=m.cfg.kivi_group,
                        keys=np.asarray(layer.k[0, KIVI_HEAD, :, :32].T, np.float32).round(5).tolist(),
                        values=np.asarray(layer.v[0, KIVI_HEAD, :32], np.float32).round(5).tolist())
                del cache
            else:
                logits = _chunks(m, ids_BT)
        if ref_logp is None:
            ref_logp = _log_softmax(logits.astype(np.float64)).astype(np.float32)
        nll, agree, kl = _scores(logits, ids, ref_logp)
        del logits
        bins = [float(np.exp(nll[a:a + BIN].mean())) for a in range(0, len(nll), BIN)]
        row.update(perplexity=float(np.exp(nll.mean())), agreement=float(agree.mean()), mean_kl=float(kl.mean()),
                   perplexity_by_position=bins, seconds=round(time.time() - t0, 1))
        this_run["wall_s"] = round(time.time() - started, 1)
        result["wall_s"] = round(sum(r.get("wall_s", 0) for r in result["runs"]), 1)
        if label in done:  # the reference, recomputed for a resumed run: the stored row stays
            continue
        result["rows"].append(row)
        this_run["measured"].append(label)
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"measured {label}: perplexity {row['perplexity']:.3f}, agreement {row['agreement']:.2%}, "
              f"KL {row['mean_kl']:.4f}, {row['bytes_per_token']:,.0f} B/token ({row['seconds']} s)",
              file=sys.stderr, flush=True)
    this_run["wall_s"] = round(time.time() - started, 1)
    result["wall_s"] = round(sum(r.get("wall_s", 0) for r in result["runs"]), 1)
    listed = {r["label"] for r in result["rows"]} | {m["label"] for m in result["missing"]}
    result["missing"] += [dict(label=c[0], why="not started: no run reached it within its time budget")
                          for c in smol_configs(cfg.n_layers) if c[0] not in listed]
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


CHAT_CONTEXT = 1200  # tokens of the held-out text the question is about: past every window and budget here
# the 135M model's answer loops on the other wordings and passage lengths tried (700 and 1,536 tokens)
CHAT_QUESTION = "Summarize the text above in one sentence."
CHAT_NEW = 64


CHAT_OUT = ROOT / "benchmarks" / "data" / "memory_savers_smollm2_chat.json"


def run_smollm2_chat(out: Path = CHAT_OUT, source: str = "smollm2-135m") -> dict:
    """The chat model answering one question about a long passage, greedily, through each saver's real layout.

    The passage is the first CHAT_CONTEXT tokens of the held-out text (longer than every window, KIVI's residual
    and H2O's budget, so each saver changes what the answer attends to). Per configuration: how many of the
    CHAT_NEW answer tokens differ from the float32 full cache's, and the first that does. The recomputation rows
    are left out: they re-run the model per window stride, which is not a cache layout to decode through.
    Written to `out` after each configuration.
    """
    cfg, model, tok = dantinox.load_pretrained(source)
    passage = tok.decode(tok.encode(shipped_text(SMOL_TEXT))[:CHAT_CONTEXT])
    prompt = tok.chat([{"role": "user", "content": f"{passage}\n\n{CHAT_QUESTION}"}])
    started = time.time()
    chat = dict(model=source, heldout=SMOL_SOURCE, question=CHAT_QUESTION, context_tokens=CHAT_CONTEXT,
                prompt_tokens=len(prompt), new=CHAT_NEW, rows=[], load_avg=list(__import__("os").getloadavg()),
                date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"))
    reference = None
    for label, _family, how, changes in smol_configs(cfg.n_layers):
        if how == "recompute":
            continue
        t0 = time.time()
        m = quality.with_changes(model, **changes)
        ids = np.asarray(dantinox.generate(m, np.asarray([prompt], np.int32), CHAT_NEW, eos_id=tok.eos_id))
        answer = ids[0, len(prompt):].tolist()
        if reference is None:
            reference = answer
        changed = [i for i, (a, b) in enumerate(zip(answer, reference, strict=True)) if a != b]
        chat["rows"].append(dict(label=label, changed=len(changed), first_change=changed[0] if changed else None,
                                 text=tok.decode([t for t in answer if t != tok.eos_id]),
                                 seconds=round(time.time() - t0, 1)))
        chat["wall_s"] = round(time.time() - started, 1)
        out.write_text(json.dumps(chat, indent=1) + "\n")
        print(f"chat {label}: {len(changed)} of {CHAT_NEW} answer tokens changed ({chat['rows'][-1]['seconds']} s)",
              file=sys.stderr, flush=True)
    return chat


def shipped_text(name: str) -> str:
    return (ROOT / "benchmarks" / "data" / name).read_text(encoding="utf-8")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 unless every configuration was measured")
    parser.add_argument("--part", choices=("tiny", "smollm2", "smollm2-chat"), default="tiny",
                        help="which models to measure (smollm2-chat: the long-passage chat answer per saver)")
    parser.add_argument("--budget-s", type=float, default=1150.0, help="smollm2: start no configuration after this")
    parser.add_argument("--resume", action="store_true", help="smollm2: keep the stored rows, measure the rest")
    parser.add_argument("--only", default=None, help="smollm2: comma-separated labels to measure, in this order")
    parser.add_argument("--out", default=None, help=f"JSON file to write (default {OUT.relative_to(ROOT)}, "
                        f"or {SMOL_OUT.relative_to(ROOT)} for --part smollm2)")
    args = parser.parse_args()
    if args.part == "smollm2-chat":
        dantinox.enable_compilation_cache()
        chat = run_smollm2_chat(Path(args.out or CHAT_OUT))
        print(doc_tables.smollm2_chat(chat))
        print(f"\nwall time {chat['wall_s']:.0f} s; wrote {args.out or CHAT_OUT}")
        sys.exit(0)
    if args.part == "smollm2":
        dantinox.enable_compilation_cache()
        only = None if args.only is None else [label.strip() for label in args.only.split(",")]
        result = run_smollm2(Path(args.out or SMOL_OUT), args.budget_s, resume=args.resume, only=only)
        print(doc_tables.smollm2_savers(result))
        print(f"\nwall time {result['wall_s']:.0f} s; wrote {args.out or SMOL_OUT}")
        bad = [r["label"] for r in result["rows"] if not r["bytes"] == r["formula_bytes"] == r["kv_cache_bytes"]]
        if bad:
            sys.exit(f"bytes: measured != formula for {', '.join(bad)}")
        sys.exit(1 if args.check and result["missing"] else 0)
    args.out = args.out or str(OUT)
    result = run()
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    print(f"\n{len(result['rows'])} configurations measured on {result['heldout_rows']} held-out rows of "
          f"{TOKENS} tokens; wrote {args.out}")
    bad = [r["label"] for r in result["rows"] if r["bytes"] != r["formula_bytes"]]
    if bad:
        sys.exit(f"bytes: measured != formula for {', '.join(bad)}")
    if args.check and result["missing"]:
        sys.exit(f"runs: not trained: {', '.join(m['run'] for m in result['missing'])}")
