"""Train a small dantinox model with optax on a corpus the project ships: its own concept entries."""

from __future__ import annotations

import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm.auto import tqdm

from dantinox import tokenizer
from dantinox.config import ModelConfig
from dantinox.model import Transformer
from dantinox.rundir import save_run


def default_corpus() -> str:
    """The prose of the concept entries in content/, loaded by the strict content loader: the project's own text."""
    from content import CONTENT_DIR, load_all

    texts: list[str] = []

    def collect(node) -> None:
        if isinstance(node, str):
            if len(node) > 20 and not node.startswith("http"):
                texts.append(" ".join(node.split()))
        elif isinstance(node, dict):
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    for entry in load_all().values():
        collect(entry.model_dump())
    if not texts:
        raise ValueError(f"corpus: no text found in {CONTENT_DIR}; pass --corpus FILE")
    return "\n".join(texts)


def causal_lm_loss(model: Transformer, tokens_BT: jax.Array, rng: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy."""
    del rng
    logits_BTV, _ = model.forward(tokens_BT[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits_BTV, tokens_BT[:, 1:]).mean()


def train(run_dir: str | Path, preset: str = "tiny", steps: int = 600, paradigm: str = "autoregressive",
          corpus: str | Path | None = None, seed: int = 0, batch_size: int = 16, seq_len: int = 128,
          learning_rate: float = 3e-3, progress: bool = True, **overrides) -> Path:
    """Train from scratch and write a run directory; returns its path."""
    for name, value in (("steps", steps), ("batch_size", batch_size), ("seq_len", seq_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    cfg = ModelConfig.preset(preset, paradigm=paradigm, **overrides)
    if seq_len + 1 > cfg.max_context:
        raise ValueError(f"seq_len: must be below max_context={cfg.max_context}, got {seq_len}")
    if corpus is None:
        text = default_corpus()
    else:
        path = Path(corpus)
        if not path.is_file():
            raise ValueError(f"corpus: {path} is not a file")
        text = path.read_text(encoding="utf-8")
    data = np.asarray(tokenizer.encode(text), np.int32)
    if len(data) < seq_len + 2:
        raise ValueError(f"corpus: needs more than {seq_len + 1} bytes of text, got {len(data)}")

    if paradigm == "diffusion":
        from dantinox.diffusion import masked_diffusion_loss as loss_fn
        window = seq_len
    else:
        loss_fn, window = causal_lm_loss, seq_len + 1

    model = Transformer(cfg, rngs=nnx.Rngs(seed))
    schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, min(100, steps // 10 + 1), steps,
                                                  learning_rate / 10)
    optimizer = nnx.Optimizer(model, optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, 0.01)),
                              wrt=nnx.Param)

    @nnx.jit
    def train_step(model, optimizer, batch, rng):
        loss, grads = nnx.value_and_grad(loss_fn)(model, batch, rng)
        optimizer.update(model, grads)
        return loss

    rs = np.random.RandomState(seed)
    key = jax.random.key(seed)
    log, start = [], time.perf_counter()
    bar = tqdm(range(1, steps + 1), desc=f"train {preset}", disable=not progress)
    for step in bar:
        starts = rs.randint(0, len(data) - window, batch_size)
        batch = jnp.asarray(np.stack([data[s:s + window] for s in starts]))
        key, sub = jax.random.split(key)
        loss = float(train_step(model, optimizer, batch, sub))
        if not math.isfinite(loss):
            raise ValueError(f"training diverged at step {step} (loss {loss}); try a lower learning rate")
        if step == 1 or step % 25 == 0 or step == steps:
            log.append({"step": step, "loss": round(loss, 4), "seconds": round(time.perf_counter() - start, 2)})
            bar.set_postfix(loss=f"{loss:.3f}")
    return save_run(run_dir, model, log)
