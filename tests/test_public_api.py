"""The public API exactly as issue #3 writes it (smaller sizes), so a rename cannot slip through."""

from pathlib import Path

import jax.numpy as jnp
import numpy as np
from flax import nnx

import dantinox

ROOT = Path(__file__).resolve().parents[1]


def test_the_documented_calls_work_together():
    cfg = dantinox.ModelConfig(vocab_size=259, d_model=64, n_layers=2, n_heads=8, head_size=8,
                               kv_heads=2, max_context=128,
                               dtype="float32", cache_dtype="bfloat16")
    model = dantinox.Transformer(cfg, rngs=nnx.Rngs(0))
    cache = dantinox.init_cache(cfg, batch_size=4)
    prompt_ids = np.random.RandomState(0).randint(0, 256, (4, 10)).astype(np.int32)
    logits, kv_cache, aux = model(prompt_ids, use_cache=True, kv_caches=cache, cache_index=0)
    next_token = jnp.argmax(logits[:, -1:], axis=-1).astype(jnp.int32)
    logits, kv_cache, aux = model(next_token, use_cache=True, kv_caches=kv_cache, cache_index=10)
    assert logits.shape == (4, 1, 259) and aux["cache_index"] == 11
    full, _, _ = model(np.concatenate([prompt_ids, np.asarray(next_token)], axis=1))
    np.testing.assert_allclose(logits[:, 0], full[:, -1], atol=0.05)  # bf16 cache, f32 compute
    assert dantinox.kv_cache_bytes(cfg, batch_size=4, tokens=128) == dantinox.tree_nbytes(kv_cache)
    assert dantinox.max_batch_size(cfg, memory_bytes=40 * 2**30, tokens=128) > 0
    out = dantinox.generate(model, prompt_ids, max_new_tokens=64, use_cache=True)
    assert out.shape == (4, 74) and out.dtype == jnp.int32


def test_the_shipped_run_generates_text():
    gen = dantinox.Generator(ROOT / "runs" / "tiny")
    text = gen.generate("The KV cache", max_new_tokens=40)
    assert len(text) > 0 and text == gen.generate("The KV cache", max_new_tokens=40, use_cache=False)
