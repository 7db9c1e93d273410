"""Reference-model decode speed of an earlier commit against the working tree, in one run (a benchmark, not a test).

    .venv/bin/python benchmarks/decode_trees.py e7e8e95              # that commit against this checkout
    .venv/bin/python benchmarks/decode_trees.py e7e8e95 --rounds 8
    .venv/bin/python benchmarks/decode_trees.py e7e8e95 --smollm2 64   # and SmolLM2-135M, bf16-stored weights
    .venv/bin/python benchmarks/decode_trees.py e7e8e95 --one-core     # CPU time on one core

decode.py's grid (MHA and GQA with K = 2, batch 1 and 8, a 32-token prompt, 256 new tokens, generate()
best of `--repeats` after a compiling call; with `--smollm2 N` also SmolLM2-135M with bfloat16-stored weights
and float32 compute, batch 1 and 8, N new tokens) is timed for each tree in a process of its own, both with this
project's venv, the trees taking turns round by round, each going first every other round (the second
process of a pair measured slower in one run here), so that the machine's drift reaches both alike. The commit is
checked out into a temporary git worktree, removed at the end. With `--one-core` each process runs on one core
and is timed by its CPU time (common.CLOCK): tokens per CPU second, which other jobs on a shared machine move
less than tokens per second. Prints, per cell, each tree's median and fastest round and the median ratio, and
writes benchmarks/results/decode_trees.json.

Machine speed here moves about 2x from day to day and does not move dantinox and the peer alike, so a change
in decode.py --peer's ratios between two days says nothing by itself about the code; this run says what the
code did.
"""

from __future__ import annotations

import json

import common
import decode

OUT = common.ROOT / "benchmarks" / "results" / "decode_trees.json"

# Runs inside each tree. An older config spelled GQA as attention="gqa" beside kv_heads (it refused kv_heads
# alone); the grid is the same either way.
CHILD = """
import json
import numpy as np
from flax import nnx
import dantinox

def config(**kw):
    try:
        return dantinox.ModelConfig.preset("reference", **kw)
    except (TypeError, ValueError):
        return dantinox.ModelConfig.preset("reference", attention="gqa", **kw)

repeats, grid, out = int(sys.argv[1]), json.loads(sys.argv[2]), {}

def tok_s(model, batch, new, vocab):  # generate()'s tokens per second, best of `repeats` after a compiling call
    prompt = np.random.RandomState(0).randint(0, vocab, (batch, grid["prompt"])).astype(np.int32)
    np.asarray(dantinox.generate(model, prompt, new))
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        np.asarray(dantinox.generate(model, prompt, new))
        best = min(best, clock() - start)
    return batch * new / best

for name, kw in grid["variants"].items():
    model = dantinox.Transformer(config(**kw), rngs=nnx.Rngs(0))
    for batch in grid["batches"]:
        out[f"{name}/{batch}"] = tok_s(model, batch, grid["new"], 256)
if grid["smollm2"]:
    model = dantinox.load_pretrained("smollm2-135m", param_dtype="bfloat16")[1]  # a public name in every tree
    for batch in grid["batches"]:
        out[f"SmolLM2 bf16-stored/{batch}"] = tok_s(model, batch, grid["smollm2"], 49_152)
print(json.dumps(out))
"""


def grid(smollm2: int) -> str:
    """decode.py's grid, passed to each tree's process (its prompt is decode.prompt's draw); `smollm2` new tokens
    of SmolLM2-135M (0: none)."""
    return json.dumps(dict(variants=decode.VARIANTS, batches=decode.BATCHES, prompt=decode.PROMPT, new=decode.NEW,
                           smollm2=smollm2))


def main() -> None:
    ap = common.trees_arguments(__doc__.splitlines()[0], repeats=3)
    ap.add_argument("--smollm2", type=int, default=0, help="also SmolLM2-135M (bf16-stored), this many new tokens")
    args = ap.parse_args()
    if args.smollm2 < 0:
        raise SystemExit(f"--smollm2: expected a whole number >= 0, got {args.smollm2}")
    common.at_least_one(args, "rounds", "repeats")
    rate = "decode tokens per CPU second on one core" if args.one_core else "decode tok/s"
    common.compare_trees(args, CHILD, [str(args.repeats), grid(args.smollm2)], rate, max, "variant / batch", 0, OUT,
                         smollm2=args.smollm2)


if __name__ == "__main__":
    main()
