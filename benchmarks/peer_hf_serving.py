"""Peer for benchmarks/serving_peer.py: Hugging Face transformers' continuous batching serving a timed trace.

Runs inside benchmarks/.peer-venv (torch + transformers, see benchmarks/decode.py), never in the project's
environment. argv[1] is a JSON spec: the GGUF file, torch threads, the continuous-batching settings and
the trace (prompt ids, new tokens and arrival second of each request). It loads the model (transformers
dequantizes the GGUF file to float32), prints "ready", then serves the trace once per stdin line, each time
with a new manager (`init_continuous_batching`: its prefix cache starts empty, as the engine's does), adding
every request when its arrival second has come (`add_request` from this thread while the manager's own
thread generates), and prints one JSON line: per request its token ids and the perf_counter times of its
tokens (`record_timestamps`) from the start of the replay; or {"error": its one line} where serving failed.
"""

import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM, GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching.cache import PagedAttentionCache

# Prompt tokens looked up in the peer's prefix cache, and found there: counted around its own lookup, which
# the scheduler calls once per admitted request (it returns the matched length).
LOOKUPS = {"tokens": 0, "hits": 0}
_search = PagedAttentionCache.search_prefix_match


def _counted_search(self, request_id: str, prompt_ids: list[int]) -> int:
    matched = _search(self, request_id, prompt_ids)
    LOOKUPS["tokens"] += len(prompt_ids)
    LOOKUPS["hits"] += matched
    return matched


PagedAttentionCache.search_prefix_match = _counted_search


def main() -> None:
    spec = json.loads(sys.argv[1])
    torch.set_num_threads(spec["threads"])
    from pathlib import Path

    import transformers

    gguf = Path(spec["gguf"])
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    print(json.dumps(dict(ready=True, torch=torch.__version__, transformers=transformers.__version__,
                          attention=model.config._attn_implementation)), flush=True)
    for _ in sys.stdin:
        try:
            out = serve(model, spec)
        except Exception as err:  # noqa: BLE001 - the driver records the peer's one-line error
            out = dict(error=f"{type(err).__name__}: {err}".splitlines()[0])
        print(json.dumps(out), flush=True)


def serve(model, spec: dict) -> dict:
    """One real-time replay of the trace through a new continuous-batching manager."""
    # eos -1: every request runs to its full length, as the engine's do
    gen = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0)
    cb = ContinuousBatchingConfig(**spec["continuous_batching"])
    trace = spec["trace"]
    LOOKUPS.update(tokens=0, hits=0)
    with torch.inference_mode():
        manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
        manager.warmup()
        manager.start()
        try:
            start = time.perf_counter()
            for i, req in enumerate(trace):
                time.sleep(max(0.0, start + req["arrival_s"] - time.perf_counter()))
                manager.add_request(req["prompt"], request_id=f"r{i}", max_new_tokens=req["new"],
                                    record_timestamps=True)
            done = {}
            while len(done) < len(trace):
                result = manager.get_result(timeout=600)
                if result is None:
                    left = len(trace) - len(done)
                    raise RuntimeError(f"the manager stopped with {left} requests unfinished")
                if result.error:
                    raise RuntimeError(f"request {result.request_id}: {result.error}")
                if result.is_finished():
                    done[result.request_id] = result
        finally:
            manager.stop(block=True, timeout=60)
            manager.destroy()
    rows = [done[f"r{i}"] for i in range(len(trace))]
    requests = [dict(tokens=list(r.generated_tokens), times=[t - start for t in r.timestamps]) for r in rows]
    return dict(hit_rate=LOOKUPS["hits"] / max(1, LOOKUPS["tokens"]), requests=requests)


if __name__ == "__main__":
    main()
