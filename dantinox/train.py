"""Train a small dantinox model with optax on a text corpus
(the CLI passes the project's own concept entries)."""

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

from dantinox.architectures import tokenizer
from dantinox.architectures.config import ModelConfig
from dantinox.architectures.model import Transformer
from dantinox.checks import positive_int
from dantinox.rundir import save_run


def causal_lm_loss(model: Transformer, tokens_BT: jax.Array, rng: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy."""
    del rng
    logits_BTV, _ = model.forward(tokens_BT[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits_BTV, tokens_BT[:, 1:]).mean()


def train(run_dir: str | Path, *, corpus: str, preset: str = "tiny", steps: int = 600,
          paradigm: str = "autoregressive", seed: int = 0, batch_size: int = 16, seq_len: int = 128,
          learning_rate: float = 3e-3, progress: bool = True, **overrides) -> Path:
    """Train from scratch on the text `corpus` (UTF-8 bytes are the tokens) and write a run directory.

    `dantinox train` passes the prose of the concept entries (`content.corpus_text()`) or a file.
    """
    steps, batch_size, seq_len = (positive_int(n, v) for n, v in
                                  (("steps", steps), ("batch_size", batch_size), ("seq_len", seq_len)))
    if not isinstance(corpus, str):
        raise ValueError(f"corpus: expected the training text as a str, got {type(corpus).__name__}")
    cfg = ModelConfig.preset(preset, paradigm=paradigm, **overrides)
    if seq_len + 1 > cfg.max_context:
        raise ValueError(f"seq_len: must be below max_context={cfg.max_context}, got {seq_len}")
    data = np.asarray(tokenizer.encode(corpus), np.int32)
    if len(data) < seq_len + 2:
        raise ValueError(f"corpus: needs more than {seq_len + 1} bytes of text, got {len(data)}")

    if paradigm == "diffusion":
        from dantinox.generation.diffusion import masked_diffusion_loss as loss_fn
        window = seq_len
    else:
        loss_fn, window = causal_lm_loss, seq_len + 1

    model = Transformer(cfg, rngs=nnx.Rngs(seed))
    warmup = min(100, steps // 10 + 1)
    # optax needs a decay phase after the warmup: a run of one step decays over one step it never takes
    schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, warmup, max(steps, warmup + 1),
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
            log.append({"step": step, "loss": round(loss, 4),
                        "seconds": round(time.perf_counter() - start, 2)})
            bar.set_postfix(loss=f"{loss:.3f}")
    return save_run(run_dir, model, log)
