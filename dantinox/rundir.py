"""Run directories: config.json + weights.safetensors + train_log.jsonl, and the Generator that loads them.

Weights are stored with safetensors (no pickle): one tensor per parameter, named by its path in the model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from dantinox.architectures import tokenizer
from dantinox.architectures.config import ModelConfig
from dantinox.architectures.model import Transformer

CONFIG, WEIGHTS, LOG = "config.json", "weights.safetensors", "train_log.jsonl"


def _flat_params(model: Transformer) -> dict[str, Any]:
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    return {"/".join(str(k) for k in path): v for path, v in flat}


def save_run(run_dir: str | Path, model: Transformer, log: list[dict] | None = None) -> Path:
    """Write the config and weights of `model` (and a training log) into `run_dir`."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG).write_text(json.dumps(model.cfg.to_dict(), indent=2) + "\n")
    tensors = {}
    for name, var in _flat_params(model).items():
        arr = var[...]
        # safetensors.numpy has no bfloat16: store such weights as float32, cast back on load
        tensors[name] = np.asarray(arr.astype(jnp.float32) if arr.dtype == jnp.bfloat16 else arr)
    save_file(tensors, str(run_dir / WEIGHTS))
    if log is not None:
        (run_dir / LOG).write_text("".join(json.dumps(row) + "\n" for row in log))
    return run_dir


def load_run(run_dir: str | Path) -> tuple[ModelConfig, Transformer]:
    """Load a run directory; a missing, partial or corrupt one raises ValueError naming the problem."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"run_dir: {run_dir} is not a directory (create one with `dantinox train`)")
    for name in (CONFIG, WEIGHTS):
        if not (run_dir / name).is_file():
            raise ValueError(f"run_dir: {run_dir / name} is missing; the run directory is incomplete")
    try:
        cfg = ModelConfig.from_dict(json.loads((run_dir / CONFIG).read_text()))
    except json.JSONDecodeError as err:
        raise ValueError(f"{run_dir / CONFIG}: not valid JSON ({err.msg} at line {err.lineno})") from None
    except (TypeError, ValueError) as err:
        raise ValueError(f"{run_dir / CONFIG}: {err}") from None
    try:
        tensors = load_file(str(run_dir / WEIGHTS))
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"{run_dir / WEIGHTS}: unreadable safetensors file ({err})") from None
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    params = _flat_params(model)
    missing = sorted(set(params) - set(tensors))
    extra = sorted(set(tensors) - set(params))
    if missing or extra:
        what = f"missing {missing[:3]}" if missing else f"unexpected {extra[:3]}"
        raise ValueError(f"{run_dir / WEIGHTS}: weights do not match config.json ({what})")
    for name, var in params.items():
        arr = tensors[name]
        if arr.shape != var[...].shape:
            raise ValueError(f"{run_dir / WEIGHTS}: tensor {name} has shape {arr.shape}, config.json "
                             f"implies {var[...].shape}")
        if not np.isfinite(arr).all():
            raise ValueError(f"{run_dir / WEIGHTS}: tensor {name} contains NaN or infinity")
        var[...] = jnp.asarray(arr, var[...].dtype)
    return cfg, model


def read_log(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / LOG
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Generator:
    """Text in, text out, for a trained run directory (autoregressive or masked-diffusion).

        gen = Generator("runs/tiny"); gen.generate("The KV cache", max_new_tokens=80)
    """

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.cfg, self.model = load_run(run_dir)
        self.last_nfe: int | None = None  # model evaluations of the last diffusion generation
        jax.block_until_ready(self.model(np.zeros((1, 1), np.int32))[0])  # warm-up forward

    def generate(self, text: str, max_new_tokens: int = 100, use_cache: bool = True,
                 temperature: float = 0.0, top_k: int | None = None, seed: int = 0, *,
                 block_size: int = 32, threshold: float = 0.9, cache_mode: str = "dual") -> str:
        """The continuation of `text` (not including `text` itself).

        Autoregressive runs use temperature/top_k/seed; diffusion runs decode `max_new_tokens` (a multiple
        of `block_size`) with the given confidence `threshold` and `cache_mode` ("none" when use_cache=False).
        """
        ids = tokenizer.encode(text)
        if not ids:
            raise ValueError("text: expected a non-empty prompt")
        prompt = np.asarray([ids], np.int32)
        if self.cfg.paradigm == "diffusion":
            from dantinox.generation.diffusion import diffusion_generate

            result = diffusion_generate(self.model, prompt, max_new_tokens, block_size=block_size,
                                        threshold=threshold, cache_mode=cache_mode if use_cache else "none")
            self.last_nfe = result.nfe
            return tokenizer.decode(result.tokens[0, len(ids):])
        from dantinox.generation.generate import generate

        out = generate(self.model, prompt, max_new_tokens, use_cache=use_cache, temperature=temperature,
                       top_k=top_k, seed=seed)
        return tokenizer.decode(np.asarray(out[0, len(ids):]))
