"""llama.cpp on the same model: batch-1 decode speed on the shipped Q4_1 file and an F32 copy, and its KV buffer.

    .venv/bin/python benchmarks/llamacpp.py            # builds benchmarks/.llama-venv on first use (~4 min here)

llama.cpp runs through llama-cpp-python in its own benchmark-only virtual environment (benchmarks/.llama-venv,
git-ignored; its wheel compiles llama.cpp), never in the project's. The peer script (peer_llama_cpp.py) writes
the F32 copy with llama_model_quantize and times each file; this script reads the `KV buffer size` line of
llama.cpp's log at n_ctx = N_CTX and sets it beside the bytes of dantinox's cache for the same context and
dtype (float16, llama.cpp's default for K and V), measured from the arrays. Results go to the committed
benchmarks/data/llama-cpp-NAME.json; benchmarks/doc_tables.py renders them into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import doc_tables

import dantinox
from dantinox.architectures.pretrained import catalogue_file

HERE = Path(__file__).resolve().parent
VENV = HERE / ".llama-venv"
PACKAGES = ("llama-cpp-python", "gguf", "numpy")
BUILD_STAMP = VENV / "build_seconds"  # how long building the venv took, written when this script built it
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
        subprocess.run(["nice", "-n", "19", str(python), "-m", "pip", "install", "-q", *PACKAGES], check=True,
                       env={**os.environ, "CMAKE_BUILD_PARALLEL_LEVEL": "1"})
        BUILD_STAMP.write_text(f"{time.perf_counter() - start:.0f}\n")
    return python


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()
