"""Which weights the decode panel runs: the published model (SmolLM2-135M) or the trained run in `runs/` whose
model matches the lab's settings."""

from __future__ import annotations

import functools
import json
import threading
from pathlib import Path
from typing import Any

import dantinox
from dantinox.architectures import pretrained
from dantinox_labs import shipped
from widgets.decode_runs import describe

RUNS_DIR = shipped.RUNS


def same_model(a: dantinox.ModelConfig, b: dantinox.ModelConfig) -> bool:
    """Whether weights trained for `a` fit `b`: every field equal but the cache config (K compared as counted)."""
    def key(cfg: dantinox.ModelConfig) -> dict[str, Any]:
        return {**cfg.to_dict(), "cache": None}
    return key(a) == key(b)


def find_run(cfg: dantinox.ModelConfig, runs_dir: str | Path = RUNS_DIR) -> tuple[Path | None, list[str]]:
    """The run directory under `runs_dir` whose model matches `cfg` (None if none), and what each run holds."""
    found, seen = None, []
    for config in sorted(Path(runs_dir).glob("*/config.json")):
        try:
            run_cfg = dantinox.ModelConfig.from_dict(json.loads(config.read_text()))
        except (ValueError, TypeError) as err:
            seen.append(f"{config.parent.name}: unreadable ({err})")
            continue
        if run_cfg.paradigm != "autoregressive":
            continue
        seen.append(f"{config.parent.name}: {describe(run_cfg)}")
        if found is None and same_model(run_cfg, cfg):
            found = config.parent
    return found, seen


PUBLISHED = "smollm2-135m"  # the published model the panel decodes by default (dantinox.load_pretrained)


_lock = threading.Lock()


@functools.cache
def load_published() -> tuple[dantinox.ModelConfig, dantinox.Transformer, Any]:
    with _lock:  # a click's thread and the notebook may both ask first
        return pretrained.load_pretrained(PUBLISHED)
