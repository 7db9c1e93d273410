"""Memory savers on the trained tiny models: cache bytes per token against quality on held-out text.

    .venv/bin/python benchmarks/memory_savers.py            # every configuration whose run exists (~3 min)
    .venv/bin/python benchmarks/memory_savers.py --check    # also fail unless every configuration was measured

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
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import numpy as np

import content
import dantinox
from dantinox import quality
from dantinox.config import PRESETS, local_layers

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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 unless every configuration was measured")
    parser.add_argument("--out", default=str(OUT), help=f"JSON file to write (default {OUT.relative_to(ROOT)})")
    args = parser.parse_args()
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
