"""Time to the first decoded token in the KV-cache lab on a fresh Jupyter kernel, cold and warm compile cache.

    .venv/bin/python benchmarks/lab_first_token.py               # cold, then warm; one run of each
    .venv/bin/python benchmarks/lab_first_token.py --repeats 2   # alternating, cold first
    .venv/bin/python benchmarks/doc_tables.py                    # the docs table from its JSON

Each run starts a fresh kernel (jupyter_client's KernelManager, the environment's python3 kernel, in labs/),
executes labs/kv-cache.ipynb's code cells in order up to the one that builds the decode panel, then "presses"
its "decode with KV cache" button (`cached_button.click()`, the button's own handler, as the widget tests do)
and waits for the first decoded tokens to be written to the panel's text (the first chunk of
widgets.generate.CHUNK_TOKENS steps: the panel shows nothing earlier). With no browser attached, "on screen"
is the moment the kernel sets the widget's value, before the message travels to a page.

The persistent compilation cache (DANTINOX_JAX_CACHE_DIR) is a new empty folder for a cold run; for a warm
run a new folder that `python -m dantinox_labs.warmup` (what `python3 dev.py lab` runs once) has filled
first, timed as what the set-up adds. Both use the same dequantized weights cache (the warm-up fills it), so
the compilation cache is the one difference. The press's time is split into building the panel's model for
the lab's cache dtype (its `model_for`, timed around the call), then, from jax.monitoring's durations,
tracing, lowering to MLIR, and XLA's compile (or reading the program back from the cache); the rest is the
prefill and the first chunk's decode steps, and the panel's host work. Prints a table, writes
benchmarks/data/lab-first-token.json (committed: benchmarks/doc_tables.py renders it into the docs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from jupyter_client import KernelManager

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LAB = ROOT / "labs" / "kv-cache.ipynb"
RESULTS = HERE / "data" / "lab-first-token.json"
GOAL_S = 5.0  # issue 60: pressing decode to the first token, warm cache, SmolLM2 at batch 1
PRESS = """
import collections as _collections, json as _json, threading as _threading, time as _time
import jax.monitoring as _monitoring
from widgets import GeneratePanel as _GeneratePanel
_panel = next(v for v in reversed(list(Out.values())) if isinstance(v, _GeneratePanel))
_durations, _shown = _collections.Counter(), _threading.Event()
_monitoring.register_event_duration_secs_listener(
    lambda event, seconds, **_: _durations.update({event: seconds}))
_first = []
def _on_text(change):
    if change["new"] and not _first:
        _first.append(_time.perf_counter())
        _shown.set()
_panel.text.observe(_on_text, names="value")
_model_for, _build = _panel.model_for, {}
def _timed_model_for(cfg):  # the press builds the panel's model for the lab's cache dtype: timed apart
    before, start = dict(_durations), _time.perf_counter()
    out = _model_for(cfg)
    if not _build:
        _build.update(seconds=_time.perf_counter() - start, durations={
            k: v - before.get(k, 0.0) for k, v in _durations.items()})
    return out
_panel.model_for = _timed_model_for
_pressed = _time.perf_counter()
_panel.cached_button.click()
_shown.wait(600)
_seconds = _first[0] - _pressed if _first else None
_durations_at_first = dict(_durations)
_panel.wait()
_run = _panel.runs["cache"]
from dantinox.backend import dense_kernel as _dense, pool_kernel as _pool
print(_json.dumps(dict(first_token_s=_seconds, durations=_durations_at_first, error=_panel.error,
                       build=_build,
                       tokens=len(_run.tokens), prompt_tokens=_run.prompt_tokens, batch=_run.batch,
                       cache_dtype=_panel.config().cache_dtype,
                       kernels_loaded=bool(_pool.KERNEL.state.get("ok") and _dense.KERNEL.state.get("ok")))))
"""
EVENTS = {"trace_s": "/jax/core/compile/jaxpr_trace_duration",
          "lower_s": "/jax/core/compile/jaxpr_to_mlir_module_duration",
          "compile_or_read_s": "/jax/core/compile/backend_compile_duration",
          "cache_read_s": "/jax/compilation_cache/cache_retrieval_time_sec"}


def lab_cells() -> list[str]:
    """The kv-cache lab's code cells, in order, up to and including the one that builds the decode panel."""
    cells = [("".join(c["source"])) for c in json.loads(LAB.read_text())["cells"] if c["cell_type"] == "code"]
    last = next((i for i, source in enumerate(cells) if "GeneratePanel(lab)" in source), None)
    if last is None:
        raise SystemExit(f"{LAB.relative_to(ROOT)}: no code cell builds GeneratePanel(lab)")
    return cells[:last + 1]


def execute(client, code: str, what: str) -> tuple[float, str]:
    """Run `code` in the kernel: its wall time and what it printed; SystemExit naming `what` if it failed."""
    printed = []

    def on_output(msg):
        if msg["msg_type"] == "stream":
            printed.append(msg["content"]["text"])

    start = time.perf_counter()
    reply = client.execute_interactive(code, timeout=900, output_hook=on_output)
    seconds = time.perf_counter() - start
    if reply["content"]["status"] != "ok":
        raise SystemExit(f"{what}: {reply['content'].get('ename')}: {reply['content'].get('evalue')}")
    return seconds, "".join(printed)


def warm_cache(env: dict) -> float:
    """Fill the compilation cache of `env` as the set-up does; the seconds it took."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "dantinox_labs.warmup"], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"dantinox_labs.warmup failed: {done.stderr.strip().splitlines()[-1:]}")
    return time.perf_counter() - start


def kernel_libraries() -> set[Path]:
    """The native kernels built in the folders dantinox loads them from (dantinox/backend/native.py)."""
    from dantinox.backend.native import cache_dirs

    return {lib for folder in cache_dirs() for lib in folder.glob("*.so")}


def stamp_check_seconds() -> float:
    """What a second `dev.py lab` spends deciding that the warm-up is current: dev.py's key of the sources."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dev", ROOT / "dev.py")
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    start = time.perf_counter()
    dev._warm_key()
    return time.perf_counter() - start


def one_run(cache: str, env: dict) -> dict:
    """A fresh kernel from start to the first token on the panel, with the compilation cache `cache` (cold or
    warm): every step's seconds."""
    with tempfile.TemporaryDirectory(prefix="dantinox-jax-cache-") as folder:
        env = {**env, "DANTINOX_JAX_CACHE_DIR": folder}
        out = dict(cache=cache, load_avg_1min=os.getloadavg()[0])
        if cache == "warm":
            out["warmup_s"] = warm_cache(env)
            out["cache_files"] = len(os.listdir(folder))
        libraries = kernel_libraries()
        km = KernelManager(kernel_name="python3")
        start = time.perf_counter()
        km.start_kernel(env=env, cwd=str(LAB.parent))
        client = km.client()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=120)
            out["kernel_start_s"] = time.perf_counter() - start
            cells = lab_cells()
            out["cells_s"] = [execute(client, code, f"{LAB.name} code cell {i + 1}")[0]
                              for i, code in enumerate(cells)]
            seconds, printed = execute(client, PRESS, "pressing decode")
            press = json.loads(printed.strip().splitlines()[-1])
        finally:
            client.stop_channels()
            km.shutdown_kernel(now=True)
        if press["error"] or press["first_token_s"] is None:
            raise SystemExit(f"the decode panel: {press['error'] or 'no token was shown'}")
        durations, build = press.pop("durations"), press.pop("build")
        out["build_model_s"] = build["seconds"]  # its own tracing is left out of the rows below
        out.update(press, **{name: durations.get(event, 0.0) - build["durations"].get(event, 0.0)
                             for name, event in EVENTS.items()})
        out["press_to_done_s"] = seconds
        out["kernels_built_during_run"] = len(kernel_libraries() - libraries)
        out["cells_to_first_token_s"] = sum(out["cells_s"]) + out["first_token_s"]
        out["load_avg_1min_after"] = os.getloadavg()[0]
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=1, help="runs of each cache, alternating (cold first)")
    args = ap.parse_args()
    if args.repeats < 1:
        raise SystemExit(f"--repeats: expected a whole number >= 1, got {args.repeats}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}  # a learner's kernel sets none
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    load = "import dantinox; dantinox.load_pretrained('smollm2-135m')"
    weights = subprocess.run([sys.executable, "-c", load], cwd=ROOT, env=env, capture_output=True, text=True,
                             check=False)
    if weights.returncode:  # both caches then read the same dequantized weights (the set-up leaves them)
        raise SystemExit(f"loading smollm2-135m failed: {weights.stderr.strip().splitlines()[-1:]}")
    runs = []
    for i in range(args.repeats):
        for cache in ("cold", "warm"):
            runs.append(one_run(cache, env))
            r = runs[-1]
            print(f"round {i + 1}, {cache}: press to first token {r['first_token_s']:.2f} s, cells "
                  f"{sum(r['cells_s']):.2f} s, kernel start {r['kernel_start_s']:.2f} s", flush=True)
    labels = [next(line for line in c.splitlines() if line.strip() and not line.startswith("#"))
              for c in lab_cells()]
    result = dict(runs=runs, goal_s=GOAL_S, cells=labels, lab=str(LAB.relative_to(ROOT)),
                  stamp_check_s=stamp_check_seconds(),
                  cpus=os.cpu_count(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1))
    sys.path.insert(0, str(HERE))
    import doc_tables

    print(doc_tables.lab_first_token(result))
    print(f"\nwrote {RESULTS}; benchmarks/doc_tables.py renders it into docs/benchmarks.md")


if __name__ == "__main__":
    main()
