"""Peer for benchmarks/llamacpp.py: llama.cpp through llama-cpp-python, in benchmarks/.llama-venv only.

`python peer_llama_cpp.py SPEC_JSON` writes an F32 copy of the GGUF file with llama_model_quantize, then for
each file times greedy decoding at batch 1 (a fresh context per call: the prompt's prefill, then `new`
tokens, as dantinox.generate is timed) and prints one JSON object. The KV buffer line of llama.cpp's log
is read by the caller from this process's stderr (llama.cpp writes it from C).

With "cells" in the spec it serves the decode-step timings instead (`serve`): one context per cell through
llama.cpp's own batch API (llama_batch_init, llama_decode with sequence ids 0 .. B-1, n_seq_max = B), each
holding B prompts of `prompt` tokens: prefilled (llama_decode, 512 tokens at a time) and saved to
spec["state_dir"] with llama_state_seq_save_file by the first run, loaded from there by later ones (an 8k
prompt's prefill took minutes here); then each stdin line "CELL N" is answered with the seconds of N greedy
decode steps from the prompts (B tokens per llama_decode, the argmax of each row's logits fed back), after
which the N steps' cells are removed from the KV cache (llama_memory_seq_rm), so every timing starts from the
same prompt.
"""

import ctypes
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import llama_cpp
import numpy as np


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


COPIES = {"F16": "LLAMA_FTYPE_MOSTLY_F16", "F32": "LLAMA_FTYPE_ALL_F32"}  # llama_model_quantize's target types
FLASH = {"auto": "LLAMA_FLASH_ATTN_TYPE_AUTO", "enabled": "LLAMA_FLASH_ATTN_TYPE_ENABLED"}


def write_copy(src: Path, dst: Path, ftype: str) -> None:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, COPIES[ftype])
    params.allow_requantize = True  # the source is Q4_1: dequantized, then stored as `ftype`
    if llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama_model_quantize to {ftype} failed for {src}")


class Cell:
    """One llama.cpp context: B sequences, each prefilled with its prompt, timed N decode steps at a time."""

    def __init__(self, model, name: str, cell: dict, spec: dict):
        self.batch, self.prompt = cell["batch"], cell["prompt"]
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = cell["batch"] * cell["context"]  # n_ctx / n_seq_max slots per sequence
        params.n_batch = params.n_ubatch = 512
        params.n_seq_max = cell["batch"]
        params.n_threads = params.n_threads_batch = spec["threads"]
        params.type_k = params.type_v = getattr(llama_cpp, f"GGML_TYPE_{cell['kv_type']}")
        params.flash_attn_type = getattr(llama_cpp, FLASH[cell["flash_attn"]])
        self.ctx = llama_cpp.llama_init_from_model(model, params)
        if not self.ctx:
            raise RuntimeError(f"llama_init_from_model failed for cell {cell}")
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        self.tokens = llama_cpp.llama_batch_init(max(512, self.batch), 0, 1)
        rng = np.random.RandomState(0)  # ordinary tokens: greedy decoding never stops early here
        prompts = [rng.randint(1000, 40000, self.prompt) for _ in range(self.batch)]
        saved = Path(spec["state_dir"]) / name.replace("/", "_")  # the prompts' KV cells, from an earlier run
        firsts = saved.with_suffix(".json")
        self.loaded = firsts.exists() and all(self._load(saved, seq) for seq in range(self.batch))
        if self.loaded:
            self.first = json.loads(firsts.read_text())
            return
        llama_cpp.llama_memory_clear(self.mem, True)
        self.first = [self._prefill(seq, ids) for seq, ids in enumerate(prompts)]
        saved.parent.mkdir(parents=True, exist_ok=True)
        for seq, ids in enumerate(prompts):
            path = f"{saved}-{seq}.state".encode()
            if not llama_cpp.llama_state_seq_save_file(self.ctx, path, seq, (llama_cpp.llama_token * len(ids))(*ids),
                                                       len(ids)):
                raise RuntimeError(f"llama_state_seq_save_file failed for {path}")
        firsts.write_text(json.dumps(self.first))

    def _load(self, saved: Path, seq: int) -> bool:
        """Sequence `seq`'s prompt cells from its state file: whether they loaded whole."""
        path = Path(f"{saved}-{seq}.state")
        tokens, count = (llama_cpp.llama_token * self.prompt)(), ctypes.c_size_t(0)
        if not path.exists():
            return False
        read = llama_cpp.llama_state_seq_load_file(self.ctx, str(path).encode(), seq, tokens, self.prompt,
                                                   ctypes.byref(count))
        return read > 0 and count.value == self.prompt

    def _put(self, i: int, token: int, pos: int, seq: int, logits: bool) -> None:
        b = self.tokens
        b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0], b.logits[i] = token, pos, 1, seq, logits

    def _decode(self, n: int) -> None:
        self.tokens.n_tokens = n
        if llama_cpp.llama_decode(self.ctx, self.tokens) != 0:
            raise RuntimeError(f"llama_decode returned non-zero for {n} tokens")

    def _argmax(self, i: int) -> int:
        row = llama_cpp.llama_get_logits_ith(self.ctx, i)
        return int(np.ctypeslib.as_array(row, shape=(self.n_vocab,)).argmax())

    def _prefill(self, seq: int, ids: np.ndarray) -> int:
        """The prompt of sequence `seq` in chunks of n_batch: its next token (greedy)."""
        for start in range(0, len(ids), 512):
            chunk = ids[start:start + 512]
            for i, token in enumerate(chunk):
                self._put(i, int(token), start + i, seq, start + i == len(ids) - 1)
            self._decode(len(chunk))
        return self._argmax(len(chunk) - 1)

    def seconds(self, steps: int) -> float:
        """Wall time of `steps` decode steps of all B sequences from the prefilled prompts, then undone."""
        next_tokens = list(self.first)
        start = time.perf_counter()
        for step in range(steps):
            for seq, token in enumerate(next_tokens):
                self._put(seq, token, self.prompt + step, seq, True)
            self._decode(self.batch)
            next_tokens = [self._argmax(seq) for seq in range(self.batch)]
        elapsed = time.perf_counter() - start
        llama_cpp.llama_memory_seq_rm(self.mem, -1, self.prompt, -1)  # back to the prompts alone
        return elapsed


def serve(spec: dict) -> None:
    """Load every file the cells name, build and prefill every cell, print a "ready" JSON line (versions, the
    build's system info), then answer each stdin line "CELL N" with the seconds of N decode steps."""
    llama_cpp.llama_backend_init()
    src = Path(spec["gguf"])
    with tempfile.TemporaryDirectory(dir=spec.get("tmp")) as tmp:
        models, sizes = {}, {}
        for ftype in sorted({c["file"] for c in spec["cells"].values()}):
            path = Path(tmp) / f"model-{ftype.lower()}.gguf"
            write_copy(src, path, ftype)
            models[ftype] = llama_cpp.llama_model_load_from_file(str(path).encode(),
                                                                 llama_cpp.llama_model_default_params())
            if not models[ftype]:
                raise RuntimeError(f"llama_model_load_from_file failed for the {ftype} copy")
            sizes[ftype] = os.path.getsize(path)
        cells = {}
        for name, cell in spec["cells"].items():
            print(f"cell {name}", file=sys.stderr, flush=True)  # the caller pairs llama.cpp's log lines with it
            cells[name] = Cell(models[cell["file"]], name, cell, spec)
        print(json.dumps({"ready": True, "llama_cpp_python": llama_cpp.__version__,
                          "system_info": llama_cpp.llama_print_system_info().decode().strip(),
                          "file_bytes": sizes, "loaded": {name: c.loaded for name, c in cells.items()}}),
              flush=True)
        for line in sys.stdin:
            name, steps = line.split()
            print(json.dumps(cells[name].seconds(int(steps))), flush=True)


def main() -> None:
    spec = json.loads(sys.argv[1])
    if "cells" in spec:
        return serve(spec)
    src = Path(spec["gguf"])
    out = {"llama_cpp_python": llama_cpp.__version__, "files": []}
    with tempfile.TemporaryDirectory(dir=spec.get("tmp")) as tmp:
        f32 = Path(tmp) / "model-f32.gguf"
        write_copy(src, f32, "F32")
        for kind, path in (("Q4_1 (shipped)", src), ("F32 (llama_model_quantize)", f32)):
            print(f"file {kind}", file=sys.stderr, flush=True)
            out["files"].append({"type": kind, "bytes": os.path.getsize(path), "tok_s": tok_s(path, spec)})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
