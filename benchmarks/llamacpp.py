"""llama.cpp on the same model: decode speed on the same weights, and its KV buffer.

    .venv/bin/python benchmarks/llamacpp.py            # builds benchmarks/.llama-venv on first use (~4 min here)
    .venv/bin/python benchmarks/llamacpp.py --part context --rounds 4   # decode steps at 2k, 4k and 8k
    .venv/bin/python benchmarks/llamacpp.py --part batch --rounds 4     # batch 8, and float32 weights

llama.cpp runs through llama-cpp-python in its own benchmark-only virtual environment (benchmarks/.llama-venv,
git-ignored; its wheel compiles llama.cpp), never in the project's. Results go to the committed
benchmarks/data/llama-cpp-NAME.json (`--part files`) and llama-cpp-NAME-PART.json (the others);
benchmarks/doc_tables.py renders them into docs/benchmarks.md.

`--part files` (the default): the peer script (peer_llama_cpp.py) writes an F32 copy with llama_model_quantize
and times batch-1 decoding, prefill included, on it and on the shipped Q4_1 file; this script reads the
`KV buffer size` line of llama.cpp's log at n_ctx = N_CTX and sets it beside the bytes of dantinox's cache for
the same context and dtype (float16, llama.cpp's default for K and V), measured from the arrays.

`--part context` and `--part batch` time decode steps alone, prefill excluded, the same way on both sides:
each side holds B prompts of C - 40 tokens (llama.cpp prefilled them once, saved in the git-ignored
benchmarks/results/llama-states/ for later runs; dantinox's cache is generate's decode state claiming them,
`timing_state`) and runs its greedy decode loop for 8 and for 40 steps from there,
each call timed on the wall clock; a step is (t(40) - t(8)) / 32, so the one-off costs of a call cancel. Every
step reads C slots on both sides (dantinox's key bucket is C; llama.cpp reads its used cells, padded).
dantinox runs in this process and llama.cpp in a long-lived peer process that answers one timing per request;
the two take turns cell by cell, each first every other round, and the bandwidth probe runs once a round.
"context": batch 1 at 2k, 4k and 8k slots, bf16-stored weights (float32 compute) with a bfloat16 cache
against the F16 copy with llama.cpp's default float16 cache, and an int8 cache against a q8_0 one (llama.cpp
needs flash attention for it). "batch": 256 slots, batch 8 (llama.cpp: 8 sequences in one llama_batch) and
float32 weights at batch 1 against the F32 copy.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import doc_tables
import jax
from flax import nnx

import dantinox
from dantinox.accounting import roofline
from dantinox.architectures.pretrained import catalogue_file, load_pretrained
from dantinox.generation.generate import decode_program
from dantinox.generation.quality import with_changes

HERE = Path(__file__).resolve().parent
VENV = HERE / ".llama-venv"
PACKAGES = ("llama-cpp-python", "gguf", "numpy")
BUILD_STAMP = VENV / "build_seconds"  # how long building the venv took, written when this script built it
BUILD_FLAGS = VENV / "cmake_args"  # $CMAKE_ARGS when this script built it (empty: llama.cpp's defaults)
N_CTX, PROMPT, NEW = 2048, 32, 256
KV_LINE = re.compile(r"(llama_kv_cache\w*: +CPU KV buffer size = +([\d.]+) MiB)")


def ensure_venv() -> Path:
    """The venv's python; built here (one compile job at a time, lowest priority) when missing."""
    python = VENV / "bin" / "python"
    works = python.exists() and not subprocess.run([str(python), "-c", "import llama_cpp"],
                                                    capture_output=True).returncode
    if not works:
        print(f"building {VENV.relative_to(HERE.parent)} ({', '.join(PACKAGES)}); llama.cpp compiles ...", flush=True)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        BUILD_FLAGS.write_text(os.environ.get("CMAKE_ARGS", "") + "\n")
        subprocess.run(["nice", "-n", "19", str(python), "-m", "pip", "install", "-q", *PACKAGES], check=True,
                       env={**os.environ, "CMAKE_BUILD_PARALLEL_LEVEL": "1"})
        BUILD_STAMP.write_text(f"{time.perf_counter() - start:.0f}\n")
    return python


def files_main(args: argparse.Namespace) -> None:
    python = ensure_venv()
    loads = [os.getloadavg()[0]]
    spec = dict(gguf=str(catalogue_file(args.model)), n_ctx=N_CTX, prompt=PROMPT, new=NEW, repeats=args.repeats,
                threads=os.cpu_count())
    res = subprocess.run([str(python), str(HERE / "peer_llama_cpp.py"), json.dumps(spec)], capture_output=True,
                         text=True)
    if res.returncode:
        raise SystemExit(f"peer_llama_cpp.py failed:\n{res.stderr[-3000:]}")
    loads.append(os.getloadavg()[0])
    peer = json.loads(res.stdout.strip().splitlines()[-1])
    lines = KV_LINE.findall(res.stderr)
    if not lines:
        raise SystemExit("llama.cpp's log has no 'CPU KV buffer size' line; its log format changed")
    line, mib = lines[0]
    cfg, _, _ = dantinox.load_pretrained(args.model)
    cfg16 = cfg.replace(cache_dtype="float16")
    ours = dantinox.init_cache(cfg16, 1, N_CTX).nbytes
    result = {
        "model": args.model, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "prompt": PROMPT, "new": NEW,
        "repeats": args.repeats, "threads": os.cpu_count(), "load_avg_1min": loads,
        "llama_cpp_python": peer["llama_cpp_python"],
        "build_minutes": float(BUILD_STAMP.read_text()) / 60 if BUILD_STAMP.exists() else float("nan"),
        "files": peer["files"],
        "kv_cache": {"n_ctx": N_CTX, "dtype": "float16", "llama_line": line.strip(),
                     "llama_bytes": round(float(mib) * 2**20), "dantinox_bytes": ours,
                     "formula_bytes": dantinox.kv_cache_bytes(cfg16, 1, N_CTX)},
    }
    stored = doc_tables.DATA / f"llama-cpp-{args.model}.json"
    stored.write_text(json.dumps(result, indent=2) + "\n")
    print(doc_tables.llama_cpp(result))
    print(f"stored in {stored.relative_to(doc_tables.ROOT)}; python benchmarks/doc_tables.py rewrites the docs")


STEPS = (8, 40)  # decode steps per timed call, on both sides: a step is (t(40) - t(8)) / 32
CONTEXTS = {"context": "2048,4096,8192",  # slots per sequence, by part
            "batch": "256"}  # the 32-token prompt and 256 new tokens of decode.py's table, rounded down
PROBE_BYTES = 1 << 30  # decode.py's probe: 30x this CPU's L3, twice the float32 weights
BF16_STORED = ("float32", "bfloat16")  # (compute dtype, weight storage) as load_pretrained takes them


def row(label: str, batch: int, context: int, ours: tuple, theirs: tuple) -> dict:
    """One line of a table: dantinox (compute dtype, weight storage, cache dtype) against llama.cpp (GGUF copy,
    K/V type, flash attention) at `batch` sequences of `context` slots."""
    dtype, param_dtype, cache = ours
    file, kv_type, flash = theirs
    prompt = context - max(STEPS)
    return dict(label=label, batch=batch, context=context, prompt=prompt,
                ours=dict(dtype=dtype, param_dtype=param_dtype, cache_dtype=cache, batch=batch, context=context,
                          prompt=prompt),
                theirs=dict(file=file, kv_type=kv_type, flash_attn=flash, batch=batch, context=context,
                            prompt=prompt))


def part_rows(part: str, contexts: list[int]) -> list[dict]:
    f16 = ("F16", "F16", "auto")  # llama.cpp's F16 copy, its default float16 cache and flash-attention setting
    if part == "context":
        return [r for c in contexts for r in (
            row("bf16 cache / f16 cache", 1, c, (*BF16_STORED, "bfloat16"), f16),
            row("int8 cache / q8_0 cache", 1, c, (*BF16_STORED, "int8"), ("F16", "Q8_0", "enabled")))]
    return [r for c in contexts for r in (
        row("bf16-stored weights / F16", 1, c, (*BF16_STORED, "bfloat16"), f16),
        row("bf16-stored weights / F16", 8, c, (*BF16_STORED, "bfloat16"), f16),
        row("bfloat16 weights and compute / F16", 8, c, ("bfloat16", None, "bfloat16"), f16),
        row("float32 weights / F32", 1, c, ("float32", None, "bfloat16"), ("F32", "F16", "auto")))]


def key(cell: dict) -> str:
    return "/".join(str(v) for v in cell.values())


class Ours:
    """generate's compiled decode loop for one cell, from a state claiming the prompts (timing_state)."""

    def __init__(self, model: nnx.Module, cell: dict):
        self.model = with_changes(model, cache_dtype=cell["cache_dtype"])
        self.cfg, (self.graphdef, self.params) = self.model.cfg, nnx.split(self.model)
        self.cell = cell
        self.state = roofline.timing_state(self.cfg, cell["batch"], cell["context"], cell["prompt"])
        self.program = decode_program(cell["batch"], donate=False, cfg=self.cfg, slots=cell["context"])
        self.seconds(1)  # compiles (or loads it from the persistent compilation cache)

    def seconds(self, steps: int) -> float:
        start = time.perf_counter()
        stop, slots = self.cell["prompt"] + steps, self.cell["context"]
        jax.block_until_ready(roofline.run_decode(self.graphdef, self.params, self.state, stop, slots, self.program))
        return time.perf_counter() - start


class Theirs:
    """The llama.cpp peer process: every cell built and prefilled at start, then one timing per request."""

    def __init__(self, python: Path, spec: dict, log):
        self.proc = subprocess.Popen([str(python), str(HERE / "peer_llama_cpp.py"), json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
        self.log_name = log.name

    def ready(self) -> dict:
        """Waits for the peer's prefills: its "ready" line (versions, build, file sizes)."""
        return json.loads(self._read())

    def _read(self) -> str:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"peer_llama_cpp.py exited with {self.proc.wait()}; its log is in {self.log_name}")
        return line

    def seconds(self, name: str, steps: int) -> float:
        self.proc.stdin.write(f"{name} {steps}\n")
        self.proc.stdin.flush()
        return float(self._read())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def per_step_ms(seconds, repeats: int) -> float:
    """Milliseconds per decode step: the best of `repeats` calls at each length of STEPS, differenced."""
    short, long = STEPS
    best = {n: min(seconds(n) for _ in range(repeats)) for n in STEPS}
    return 1e3 * (best[long] - best[short]) / (long - short)


LOG_LINE = re.compile(r"^cell (\S+)$|(flash_attn\s*=.*|Flash Attention.*|n_ctx_seq\s*=.*|"
                      r"CPU KV buffer size.*)$", re.M)


def llama_log(text: str) -> dict[str, list[str]]:
    """The lines of llama.cpp's log that say how each cell's context was set up, by cell."""
    out, cell = {}, None
    for m in LOG_LINE.finditer(text):
        if m[1]:
            cell = m[1]
            out[cell] = []
        elif cell is not None:
            out[cell].append(" ".join(m[2].split()))
    return out


def steps_main(args: argparse.Namespace) -> None:
    python = ensure_venv()
    dantinox.enable_compilation_cache()
    rows = part_rows(args.part, args.contexts)
    theirs_cells = {key(r["theirs"]): r["theirs"] for r in rows}
    loads = [os.getloadavg()[0]]
    spec = dict(gguf=str(catalogue_file(args.model)), threads=os.cpu_count(), cells=theirs_cells,
                state_dir=str(HERE / "results" / "llama-states"))
    with tempfile.NamedTemporaryFile("w+", suffix=".log") as log:
        peer = Theirs(python, spec, log)  # builds and prefills its cells while this process compiles its own
        bases, ours = {}, {}
        for r in rows:
            o = r["ours"]
            mode = (o["dtype"], o["param_dtype"])
            if mode not in bases:
                bases[mode] = load_pretrained(args.model, dtype=o["dtype"], param_dtype=o["param_dtype"])[1]
            if key(o) not in ours:
                ours[key(o)] = Ours(bases[mode], o)
        ready = peer.ready()
        loads.append(os.getloadavg()[0])
        times: dict[str, list[float]] = {k: [] for k in (*ours, *theirs_cells)}
        bandwidths = []
        for i in range(args.rounds):
            timed = set()
            for r in rows:
                sides = [("ours", key(r["ours"])), ("theirs", key(r["theirs"]))]
                for side, k in sides[::1 if i % 2 == 0 else -1]:
                    if k in timed:
                        continue
                    timed.add(k)
                    seconds = ours[k].seconds if side == "ours" else lambda n, k=k: peer.seconds(k, n)
                    times[k].append(per_step_ms(seconds, args.repeats))
            bandwidths.append(roofline.measure_bandwidth(PROBE_BYTES, repeats=5))
            loads.append(os.getloadavg()[0])
            print(f"round {i + 1}/{args.rounds}: load {loads[-1]:.1f}, "
                  + ", ".join(f"{k} {v[-1]:.2f} ms" for k, v in times.items()), flush=True)
        peer.close()
        log.seek(0)
        log_lines = llama_log(log.read())
    machine = dataclasses.replace(roofline.measure_machine(repeats=10), bandwidth=max(bandwidths))
    out_rows = []
    for r in rows:
        o = ours[key(r["ours"])]
        cost = roofline.decode_cost(o.cfg, r["batch"], r["context"])
        out_rows.append(dict(label=r["label"], batch=r["batch"], context=r["context"], prompt=r["prompt"],
                             ours=r["ours"], theirs=r["theirs"], ours_ms=times[key(r["ours"])],
                             theirs_ms=times[key(r["theirs"])], weight_bytes=cost.weight_bytes,
                             cache_read_bytes=cost.cache_read_bytes, roofline_ms=1e3 * cost.time(machine),
                             bound=cost.bound(machine), llama_log=log_lines.get(key(r["theirs"]), [])))
    result = {
        "model": args.model, "part": args.part, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "steps": list(STEPS), "rounds": args.rounds, "repeats": args.repeats, "threads": os.cpu_count(),
        "load_avg_1min": loads, "jax": jax.__version__,
        "llama_cpp_python": ready["llama_cpp_python"], "system_info": ready["system_info"],
        "cmake_args": BUILD_FLAGS.read_text().strip() if BUILD_FLAGS.exists() else None,
        "file_bytes": ready["file_bytes"], "prompts_loaded": ready["loaded"],
        "machine": {"bandwidth_B_s": machine.bandwidth, "bandwidth_samples_B_s": bandwidths,
                    "matmul_flop_s": machine.peak_flops},
        "rows": out_rows}
    stored = doc_tables.DATA / f"llama-cpp-{args.model}-{args.part}.json"
    stored.write_text(json.dumps(result, indent=2) + "\n")
    print(doc_tables.llama_cpp_steps(result))
    print(f"stored in {stored.relative_to(doc_tables.ROOT)}; python benchmarks/doc_tables.py rewrites the docs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--part", default="files", choices=("files", "context", "batch"))
    ap.add_argument("--repeats", type=int, default=None,
                    help="files: best of this many calls (default 3); context, batch: each length's best of this "
                         "many calls per turn (default 1)")
    ap.add_argument("--rounds", type=int, default=4, help="context, batch: rounds of turns")
    ap.add_argument("--contexts", default=None,
                    help=f"context, batch: slots per sequence, comma-separated (default {CONTEXTS})")
    args = ap.parse_args()
    try:
        args.contexts = [int(c) for c in (args.contexts or CONTEXTS.get(args.part, "0")).split(",")]
    except ValueError:
        raise SystemExit(f"--contexts: expected whole numbers separated by commas, got {args.contexts!r}") from None
    if min(args.contexts) <= max(STEPS) and args.part != "files":
        raise SystemExit(f"--contexts: expected slots above {max(STEPS)} (the prompt is slots - {max(STEPS)}), "
                         f"got {args.contexts}")
    if args.repeats is None:
        args.repeats = 3 if args.part == "files" else 1
    for name in ("repeats", "rounds"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name}: expected a whole number >= 1, got {getattr(args, name)}")
    (files_main if args.part == "files" else steps_main)(args)


if __name__ == "__main__":
    main()
