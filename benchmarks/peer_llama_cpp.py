"""Peer for benchmarks/llamacpp.py: llama.cpp through llama-cpp-python, in benchmarks/.llama-venv only.

`python peer_llama_cpp.py SPEC_JSON` writes an F32 copy of the GGUF file with llama_model_quantize, then for
each file times greedy decoding at batch 1 (a fresh context per call: the prompt's prefill, then `new`
tokens, as dantinox.generate is timed) and prints one JSON object. The KV buffer line of llama.cpp's log
is read by the caller from this process's stderr (llama.cpp writes it from C).
"""

import ctypes
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import llama_cpp


def write_f32(src: Path, dst: Path) -> None:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_ALL_F32
    params.allow_requantize = True  # the source is Q4_1/Q8_0: dequantized to f32
    if llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama_model_quantize failed for {src}")


def tok_s(path: Path, spec: dict) -> float:
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=spec["n_ctx"], n_threads=spec["threads"],
                          n_threads_batch=spec["threads"], n_batch=spec["prompt"], verbose=True, seed=0)
    prompt = list(range(1000, 1000 + spec["prompt"]))  # ordinary tokens; greedy decoding never stops early here
    best = float("inf")
    for _ in range(spec["repeats"] + 1):  # the first call warms up
        llm.reset()
        start = time.perf_counter()
        n = 0
        for _ in llm.generate(prompt, top_k=1, temp=0.0, reset=True):
            n += 1
            if n == spec["new"]:
                break
        best = min(best, time.perf_counter() - start)
    print(f"timed {path.name}", file=sys.stderr, flush=True)
    del llm
    return spec["new"] / best


def main() -> None:
    spec = json.loads(sys.argv[1])
    src = Path(spec["gguf"])
    out = {"llama_cpp_python": llama_cpp.__version__, "files": []}
    with tempfile.TemporaryDirectory(dir=spec.get("tmp")) as tmp:
        f32 = Path(tmp) / "model-f32.gguf"
        write_f32(src, f32)
        for kind, path in (("Q4_1 (shipped)", src), ("F32 (llama_model_quantize)", f32)):
            print(f"file {kind}", file=sys.stderr, flush=True)
            out["files"].append({"type": kind, "bytes": os.path.getsize(path), "tok_s": tok_s(path, spec)})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
