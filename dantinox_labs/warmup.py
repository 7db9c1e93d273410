"""Compile what a learner's first decode in the KV-cache lab runs, into the persistent compilation cache.

    .venv/bin/python -m dantinox_labs.warmup     # `python3 dev.py lab` runs it once (stamped in dev.py)

The lab's decode panel (widgets/generate.py) decodes SmolLM2-135M at the lab's default settings when its
first button is pressed; compiling those programs on a fresh kernel is most of the wait before the first
token. This builds the same lab and panel, headless, and presses the same button, with the compilation cache
the labs turn on (`dantinox.enable_compilation_cache`), so the learner's kernel reads the programs from disk.
It also leaves the published model's dequantized weights in their cache (architectures/pretrained.py).
benchmarks/lab_first_token.py measures the effect.
"""

from __future__ import annotations

import sys
import time

# The kv-cache lab's CacheLab arguments (labs/kv-cache.ipynb, the cell that builds `lab`): the panel takes its
# cache dtype and batch from them, and a program compiled for other settings would not be the one read back.
LAB_SETTINGS = dict(preset="reference", attention="gqa", cache_dtype="bfloat16")


def warm() -> float:
    """Press the kv-cache lab's "decode with KV cache" once, headless; the seconds it took. ValueError (the
    panel's own message) where the decode failed, e.g. the model wheel is missing."""
    import content
    import dantinox
    from widgets import CacheLab, GeneratePanel

    dantinox.enable_compilation_cache()
    start = time.perf_counter()
    panel = GeneratePanel(CacheLab(content.load_entry("kv-cache"), **LAB_SETTINGS))
    if panel.fallback:
        raise ValueError(panel.fallback)
    panel.run(use_cache=True, wait=True)
    if panel.error:
        raise ValueError(f"the decode panel: {panel.error}")
    return time.perf_counter() - start


def main() -> int:
    try:
        seconds = warm()
    except ValueError as err:
        print(f"dantinox_labs.warmup: {err}", file=sys.stderr)
        return 1
    print(f"dantinox_labs.warmup: the KV-cache lab's first decode compiled and cached in {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
