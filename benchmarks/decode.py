"""Decode benchmark for the reference model (a benchmark, not a test).

    .venv/bin/python benchmarks/decode.py            # dantinox only
    .venv/bin/python benchmarks/decode.py --peer     # also Hugging Face LlamaForCausalLM (static cache, torch CPU)

Prints a markdown table and writes benchmarks/results/decode.json. The peer runs in its own virtual
environment (benchmarks/.peer-venv, created on first use with torch==2.13.0 and transformers) so the
project's environment never holds torch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

import jax
import numpy as np
from common import best_of
from flax import nnx

import dantinox
from dantinox.generate import _prefill_jit, _step, window_for

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
PEER_VENV = HERE / ".peer-venv"
VARIANTS = {"MHA": dict(attention="mha"), "GQA (K=2)": dict(attention="gqa", kv_heads=2)}
BATCHES = (1, 8)
PROMPT, NEW = 32, 256


def model_for(variant: str, **kw) -> dantinox.Transformer:
    cfg = dantinox.ModelConfig.preset("reference", **VARIANTS[variant], **kw)
    return dantinox.Transformer(cfg, rngs=nnx.Rngs(0))


def prompt(batch: int, length: int = PROMPT) -> np.ndarray:
    return np.random.RandomState(0).randint(0, 256, (batch, length)).astype(np.int32)


def decode_grid(repeats: int) -> dict[str, float]:
    out = {}
    for variant in VARIANTS:
        model = model_for(variant)
        for batch in BATCHES:
            p = prompt(batch)
            seconds = best_of(lambda: dantinox.generate(model, p, NEW), repeats)  # noqa: B023
            out[f"{variant}/{batch}"] = batch * NEW / seconds
    return out


def cached_vs_uncached(new: int) -> dict[str, float]:
    model = model_for("MHA")
    p = prompt(1)
    cached = best_of(lambda: dantinox.generate(model, p, new), 1)
    uncached = best_of(lambda: dantinox.generate(model, p, new, use_cache=False), 1)
    return {"new_tokens": new, "cached_tok_s": new / cached, "uncached_tok_s": new / uncached,
            "speedup": uncached / cached}


def step_times(filled: tuple[int, ...], max_context: int, short: int = 8, long: int = 40) -> dict[int, float]:
    """Milliseconds per decode step with `filled` tokens already cached, in a cache of `max_context` slots.

    Timed as (t(long steps) - t(short steps)) / (long - short), so the one-off costs of a call (copying
    the input state, dispatch) cancel out and only the per-step cost remains.
    """
    model = model_for("MHA", max_context=max_context)
    graphdef, params = nnx.split(model)

    @partial(jax.jit, static_argnums=(1, 2))
    def run(state, steps, window):
        step = lambda _, s: _step(graphdef, params, s, None, None, True, window)  # noqa: E731
        return jax.lax.fori_loop(0, steps, step, state)

    out = {}
    for n in filled:
        window = window_for(max_context, n + long)  # the window generate() uses once n + long tokens are held
        state = _prefill_jit(graphdef, params, prompt(1, n), n + long, 0, use_cache=True, cache_length=window)
        t_short = best_of(lambda: run(state, short, window), 5)  # noqa: B023
        t_long = best_of(lambda: run(state, long, window), 5)  # noqa: B023
        out[n] = 1e3 * (t_long - t_short) / (long - short)
    return out


_COMPILE_PROBE = """
import time, numpy as np
import dantinox
from flax import nnx
dantinox.enable_compilation_cache()
m = dantinox.Transformer(dantinox.ModelConfig.preset("reference"), rngs=nnx.Rngs(0))
p = np.zeros((1, 32), np.int32)
t = time.perf_counter(); dantinox.generate(m, p, 1).block_until_ready(); first = time.perf_counter() - t
t = time.perf_counter(); dantinox.generate(m, p, 256).block_until_ready(); more = time.perf_counter() - t
print(first, more)
"""


def compile_times() -> dict[str, float]:
    """generate() calls in a fresh process, with an empty then a filled persistent compilation cache.

    `first` is the first call (prefill + the first key window's decode loop); `rest` is a following
    256-token call, which compiles the decode loops of the three further windows it passes through.
    """
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "DANTINOX_JAX_CACHE_DIR": cache}
        for label in ("cold", "warm"):
            res = subprocess.run([sys.executable, "-c", _COMPILE_PROBE], env=env, check=True, capture_output=True,
                                 text=True)
            first, rest = map(float, res.stdout.split()[-2:])
            out[f"{label}_first_s"], out[f"{label}_rest_s"] = first, rest
    return out


def ensure_peer_env() -> Path:
    python = PEER_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
    check = subprocess.run([str(python), "-c", "import torch, transformers"], capture_output=True)
    if check.returncode:
        print("installing the peer (torch==2.13.0, transformers) into benchmarks/.peer-venv ...", flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "torch==2.13.0", "transformers"], check=True)
    return python


def peer_grid(repeats: int) -> dict[str, float]:
    cfg = dantinox.ModelConfig.preset("reference")
    spec = dict(vocab=cfg.vocab_size, d_model=cfg.d_model, mlp=cfg.mlp_width, layers=cfg.n_layers,
                heads=cfg.n_heads, head_size=cfg.head_size, max_context=cfg.max_context,
                variants={v: dantinox.ModelConfig.preset("reference", **kw).n_kv_heads for v, kw in VARIANTS.items()},
                batches=list(BATCHES), prompt=PROMPT, new=NEW, repeats=repeats, threads=os.cpu_count())
    res = subprocess.run([str(ensure_peer_env()), str(HERE / "peer_hf.py"), json.dumps(spec)], check=True,
                         capture_output=True, text=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", action="store_true", help="also measure Hugging Face transformers (torch CPU)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--uncached_new", type=int, default=512)
    args = ap.parse_args()
    dantinox.enable_compilation_cache()  # persist compiled programs across runs, as the CLI does

    result: dict = {"machine": {"cpus": os.cpu_count(), "jax": jax.__version__, "backend": jax.default_backend()}}
    result["decode_tok_s"] = decode_grid(args.repeats)
    if args.peer:
        result["peer_tok_s"] = peer_grid(args.repeats)
    result["cache_vs_no_cache"] = cached_vs_uncached(args.uncached_new)
    result["step_ms"] = {str(mc): step_times((64, 1024), mc) for mc in (1088, 4096)}
    result["compile"] = compile_times()

    lines = [f"Reference model (12 layers, d_model 256, 8 heads, head 32, f32), prompt {PROMPT}, {NEW} new tokens, "
             f"{os.cpu_count()} CPU cores, best of {args.repeats}:", "",
             "| variant | batch | dantinox tok/s |" + (" HF Llama tok/s | ratio |" if args.peer else ""),
             "|---|---|---|" + ("---|---|" if args.peer else "")]
    for key, ours in result["decode_tok_s"].items():
        variant, batch = key.split("/")
        row = f"| {variant} | {batch} | {ours:,.0f} |"
        if args.peer:
            theirs = result["peer_tok_s"][key]
            row += f" {theirs:,.0f} | {ours / theirs:.2f}× |"
        lines.append(row)
    cv = result["cache_vs_no_cache"]
    lines += ["", f"KV cache vs recompute, MHA batch 1, {cv['new_tokens']} new tokens: {cv['cached_tok_s']:,.0f} vs "
              f"{cv['uncached_tok_s']:,.1f} tok/s = **{cv['speedup']:.1f}×**", "",
              "| cache slots (max_context) | step at 64 filled | step at 1024 filled |", "|---|---|---|"]
    for mc, times in result["step_ms"].items():
        lines.append(f"| {int(mc):,} | {times[64]:.2f} ms | {times[1024]:.2f} ms |")
    c = result["compile"]
    lines += ["", "| new process | first generate() (1 token: compiles prefill + first window) | then 256 tokens "
              "(3 more windows) |", "|---|---|---|",
              f"| empty compilation cache | {c['cold_first_s']:.2f} s | {c['cold_rest_s']:.2f} s |",
              f"| persistent cache filled | {c['warm_first_s']:.2f} s | {c['warm_rest_s']:.2f} s |"]
    table = "\n".join(lines)
    print(table)
    RESULTS.mkdir(exist_ok=True)
    result["table"] = table
    (RESULTS / "decode.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
