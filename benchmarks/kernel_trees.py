"""The CPU kernels' time per call in an earlier commit against the working tree, in one run (a benchmark, not a test).

    .venv/bin/python benchmarks/kernel_trees.py cdafdec              # that commit's kernels against this checkout's
    .venv/bin/python benchmarks/kernel_trees.py 4eb43a8 --rounds 8

Each case calls one kernel `--calls` times in a compiled loop, each call's result the next call's input (so
nothing is hoisted out of the loop), and takes the fastest of `--repeats` loops after a compiling one: the
attention kernel (dantinox/backend/pool_kernel.py) at the reference model's and SmolLM2-135M's heads, a row of
keys and values per sequence, and the dense kernel (dense_kernel.py) at SmolLM2's MLP and tied head. What
differs between the trees is what the kernels are built from: their sources and native.py's compiler flags.
Each tree runs in a process of its own with this project's venv, the trees taking turns round by round (as in
decode_trees.py). With `--one-core` each process runs on one core and is timed by its CPU time (common.CLOCK).
Prints each case's median and fastest round per tree
and the ratio of medians, with the load average; writes benchmarks/results/kernel_trees.json.
"""

from __future__ import annotations

import json

import common

OUT = common.ROOT / "benchmarks" / "results" / "kernel_trees.json"

# name: attention (batch, KV heads, query heads per KV head, head size, slots, slots seen, cache dtype) or
# dense (rows, inputs, outputs, whether W is [outputs, inputs] as the tied head). The reference model decodes
# its 32 + 256 tokens through key buckets of 128 to 384 slots; 256 slots with 192 seen is a step in between.
ATTEND = {
    "attend MHA/8, 256 slots": (8, 8, 1, 32, 256, 192, "float32"),
    "attend GQA (K=2)/8, 256 slots": (8, 2, 4, 32, 256, 192, "float32"),
    "attend MHA/8, 1024 slots": (8, 8, 1, 32, 1024, 1024, "float32"),
    "attend SmolLM2/8, 128 slots": (8, 3, 3, 64, 128, 128, "float32"),
    "attend SmolLM2/1, 2048 slots": (1, 3, 3, 64, 2048, 2048, "float32"),
    "attend SmolLM2/8, 256 slots, bf16": (8, 3, 3, 64, 256, 192, "bfloat16"),
}
DENSE = {
    "dense SmolLM2 up/1": (1, 576, 1536, False),
    "dense SmolLM2 up/8": (8, 576, 1536, False),
    "dense SmolLM2 head/8": (8, 576, 49_152, True),
}

# Runs inside each tree; before the speed layer moved into dantinox/backend the kernels' modules were dantinox's
# (and that tree's import of dantinox.backend.* fails on a name of its own, not on the missing package).
CHILD = """
import importlib, json
import jax, jax.numpy as jnp, numpy as np
import dantinox

def module(name):
    try:
        return importlib.import_module(f"dantinox.{name}")
    except ImportError:
        return importlib.import_module(f"dantinox.backend.{name}")

pool_kernel, dense_kernel = module("pool_kernel"), module("dense_kernel")
for kernel in (pool_kernel, dense_kernel):
    if not kernel.available():
        raise SystemExit(kernel.why_not())
calls, repeats, attend, dense = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4])
rng, out = np.random.default_rng(0), {}

def per_call(step, x, *operands):  # microseconds a call: the fastest of `repeats` loops of `calls` calls
    loop = jax.jit(lambda x, *a: jax.lax.fori_loop(0, calls, lambda i, x: step(x, *a), x))
    jax.block_until_ready(loop(x, *operands))
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        jax.block_until_ready(loop(x, *operands))
        best = min(best, clock() - start)
    return 1e6 * best / calls

for name, (B, K, G, H, S, seen, dtype) in attend.items():
    q = rng.standard_normal((B, K, G, H), np.float32)
    k = jnp.asarray(rng.standard_normal((B, K, H, S), np.float32), dtype)
    v = jnp.asarray(rng.standard_normal((B, K, S, H), np.float32), dtype)
    mask = np.broadcast_to(np.arange(S) < seen, (B, S))
    out[name] = per_call(lambda q, k, v, m: pool_kernel.attend(q, k, v, m, H ** -0.5), q, k, v, mask)
for name, (M, D, N, transposed) in dense.items():
    x = rng.standard_normal((M, D), np.float32)
    w = jnp.asarray(rng.standard_normal((N, D) if transposed else (D, N), np.float32) / D ** 0.5, jnp.bfloat16)
    out[name] = per_call(lambda x, w: dense_kernel.matmul(x, w, transposed)[:, :D], x, w)
print(json.dumps(out))
"""


def main() -> None:
    ap = common.trees_arguments(__doc__.splitlines()[0], repeats=5)
    ap.add_argument("--calls", type=int, default=200, help="kernel calls in one timed loop")
    args = ap.parse_args()
    common.at_least_one(args, "rounds", "repeats", "calls")
    unit = "CPU µs per kernel call on one core" if args.one_core else "µs per kernel call"
    common.compare_trees(args, CHILD, [str(args.calls), str(args.repeats), json.dumps(ATTEND), json.dumps(DENSE)],
                         unit, min, "case", 1, OUT, calls=args.calls)


if __name__ == "__main__":
    main()
