"""The kv-cache lab's decode panel against `dantinox.generate` on the same model, batch and run (a benchmark).

    .venv/bin/python benchmarks/decode_panel.py

The panel decodes as the notebook builds it (reference lab, GQA, bf16 cache; the panel's default tiny
preset, so the trained runs/tiny-gqa weights). The peer is what benchmarks/decode.py times: the fastest
of a few `dantinox.generate` calls (one compiled while_loop per key bucket), per decode step as the
difference of two lengths (all new tokens, and SHORT), so the prefill and per-call costs cancel as they
are left out of the panel's model time. Ratios: the panel's model rate over generate's (the cost of
stopping every CHUNK_TOKENS steps), and its wall-clock rate over generate's (drawing and streaming on top).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from common import best_of

import content
import dantinox
from dantinox.architectures import tokenizer
from widgets import CacheLab, GeneratePanel
from widgets.generate import CHUNK_TOKENS

RESULTS = Path(__file__).resolve().parent / "results"
SHORT = 8  # new tokens of the shorter generate call


def panel_rates(panel: GeneratePanel, use_cache: bool, repeats: int) -> dict[str, float]:
    """Best model-time and wall-clock rates of a few clicks, after one click that compiles."""
    panel.run(use_cache=use_cache, wait=True)
    best = {"model": 0.0, "wall": 0.0}
    for _ in range(repeats):
        panel.run(use_cache=use_cache, wait=True)
        if panel.error:
            raise SystemExit(f"panel: {panel.error}")
        run = panel.runs["cache" if use_cache else "no cache"]
        best = {"model": max(best["model"], run.tokens_per_s), "wall": max(best["wall"], run.wall_tokens_per_s)}
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    lab = CacheLab(content.load_entry("kv-cache"), preset="reference", attention="gqa", cache_dtype="bfloat16")
    panel = GeneratePanel(lab)
    cfg = panel.config()
    model, where = panel.model_for(cfg)
    prompt = np.asarray([tokenizer.encode(panel.prompt.value)], np.int32)
    new = panel.new_tokens.value
    rows = {}
    for use_cache in (True, False):
        shown = panel_rates(panel, use_cache, args.repeats)
        full, short = (best_of(lambda n=n: dantinox.generate(model, prompt, n, use_cache=use_cache), args.repeats)  # noqa: B023
                       for n in (new, SHORT))
        seconds = (full - short) * new / (new - SHORT)  # generate's time for `new` steps, fixed costs cancelled
        rows["cache" if use_cache else "no cache"] = {
            "panel_model_tok_s": shown["model"], "panel_wall_tok_s": shown["wall"], "generate_tok_s": new / seconds,
            "model_over_generate": shown["model"] * seconds / new, "wall_over_generate": shown["wall"] * seconds / new}
    print(f"{where}; {cfg.n_layers}-layer {cfg.variant.upper()} K={cfg.n_kv_heads}, cache {cfg.cache_dtype}, "
          f"B=1, prompt {prompt.shape[1]} + {new} new tokens, chunks of {CHUNK_TOKENS}, best of {args.repeats}\n")
    print("| decode | panel, model time (tok/s) | panel, wall clock (tok/s) | generate (tok/s) | "
          "model / generate | wall / generate |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['panel_model_tok_s']:,.0f} | {r['panel_wall_tok_s']:,.0f} | {r['generate_tok_s']:,.0f} "
              f"| {r['model_over_generate']:.2f} | {r['wall_over_generate']:.2f} |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "decode_panel.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
