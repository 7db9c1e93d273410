"""DeepSeek-V3.2's sparse attention (DSA) on MLA: the lightning indexer's key cache and top-k selection
(dantinox/cache/indexer.py, LightningIndexer in dantinox/architectures/model.py). With k at least the filled
slots the model is plain MLA; with k small a decode step reads k latents, those of the k best indexer scores
(checked against numpy); the stored and read bytes equal the formulas."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from invariants import token_ids

import dantinox
from dantinox.accounting.memory import kv_read_bytes
from dantinox.architectures.model import Fill
from dantinox.cache import IndexedLatentCache, layouts

MLA = dict(attention="latent", kv_latent_dim=16, rope_head_dim=8, n_layers=2)


def dsa_cfg(topk, **kw):
    index = dict(index_heads=2, index_head_size=12, index_topk=topk)
    return dantinox.ModelConfig.preset("test", **MLA, **index, **kw)


def test_with_k_at_least_the_filled_slots_it_is_plain_mla():
    cfg = dsa_cfg(64)
    model = dantinox.Transformer(cfg, rngs=nnx.Rngs(0))
    plain = dantinox.Transformer(dantinox.ModelConfig.preset("test", **MLA), rngs=nnx.Rngs(0))
    _, _, shared = nnx.split(model, nnx.PathContains("indexer"), ...)
    nnx.update(plain, shared)  # the same weights, without the indexer
    x = token_ids(2, 9)
    want = np.asarray(plain(jnp.asarray(x))[0])
    np.testing.assert_allclose(np.asarray(model(jnp.asarray(x))[0]), want, atol=2e-5, rtol=2e-5)
    cache = dantinox.init_cache(cfg, 2, 16)
    assert type(cache.layers[0]) is IndexedLatentCache
    at = 0
    for n in (5, 1, 1, 1, 1):  # a prefill, then one-token steps: the stored latents and indexer keys carry
        logits, cache, _ = model(jnp.asarray(x[:, at:at + n]), use_cache=True, kv_caches=cache)
        np.testing.assert_allclose(np.asarray(logits), want[:, at:at + n], atol=2e-5, rtol=2e-5)
        at += n


def np_rope(x, pos, base, R):
    """RoPE on the first R channels (halves rotated, as dantinox's apply_rope), the rest unchanged."""
    half = R // 2
    angle = pos * base ** (-np.arange(half) / half)
    x1, x2 = x[..., :half], x[..., half:R]
    return np.concatenate([x1 * np.cos(angle) - x2 * np.sin(angle), x2 * np.cos(angle) + x1 * np.sin(angle),
                           x[..., R:]], axis=-1)


def test_with_k_small_a_step_reads_the_k_latents_of_the_best_indexer_scores():
    cfg = dsa_cfg(3)
    model = dantinox.Transformer(cfg, rngs=nnx.Rngs(2))
    x = token_ids(1, 8, seed=5)
    _, cache, _ = model(jnp.asarray(x[:, :7]), use_cache=True, kv_caches=dantinox.init_cache(cfg, 1, 16))
    block = model.blocks[0]
    h = block.norm1(model.embed.embedding[...][x[:, 7:]])  # the decode step's input to layer 0
    fill = Fill(jnp.ones((1, 1), bool), cache.lengths, cache.lengths + 1, None)

    @nnx.jit  # one compiled call, not one dispatch per op
    def step(attn, h, layer, fill):
        _, stored, read = attn(h, jnp.full((1, 1), 7), layer, fill, layouts(cfg)[0])
        return stored, read.payload, read.k_pos_BS
    stored, read, read_pos = step(block.attn, h, cache.layers[0], fill)
    assert read.ckv.shape == (1, 3, 16 + 8)  # k latents read, of the 16 slots the layer holds
    assert stored.ckv.shape == (1, 16, 24) and stored.idx_k.shape == (1, 16, 12)
    idx = block.attn.indexer
    hq = np.asarray(h[0, 0], np.float64)
    q = np_rope((hq @ np.asarray(idx.q_up.kernel[...], np.float64)).reshape(2, 12), 7, 10_000.0, 8)
    w = hq @ np.asarray(idx.weights.kernel[...], np.float64) / np.sqrt(2 * 12)
    keys = np.asarray(stored.idx_k[0, :8], np.float64)  # the 8 tokens held after the write
    scores = (w[:, None] * np.maximum(q @ keys.T, 0)).sum(0)
    assert sorted(np.asarray(read_pos[0]).tolist()) == sorted(np.argsort(-scores)[:3].tolist())


@pytest.mark.parametrize("cache_dtype, extra", [("float32", 0), ("int8", 2 * 4)])
def test_stored_and_read_bytes_equal_the_formulas(cache_dtype, extra):
    cfg = dsa_cfg(3, cache_dtype=cache_dtype)
    s = np.dtype(cfg.cache_jnp_dtype).itemsize
    for T in (2, 16):
        cache = dantinox.init_cache(cfg, 2, T)
        per_token = (16 + 8 + 12) * s + extra  # latent + RoPE key + indexer key (+ a scale for each)
        assert cache.nbytes == dantinox.kv_cache_bytes(cfg, 2, T) == 2 * 2 * T * per_token  # L · B · T
        latent, key = (16 + 8) * s + extra // 2, 12 * s + extra // 2
        assert kv_read_bytes(cfg, 2, T) == 2 * 2 * (T * key + min(3, T) * latent)  # every key, k latents


@pytest.mark.parametrize("kw, field", [
    (dict(**MLA, index_heads=2, index_head_size=12), "index_topk"),
    (dict(**MLA, index_heads=2, index_head_size=6, index_topk=4), "index_head_size"),
    (dict(index_heads=2, index_head_size=12, index_topk=4), "index_heads"),
])
def test_an_indexer_it_cannot_build_is_refused_in_one_line(kw, field):
    with pytest.raises(ValueError) as excinfo:
        dantinox.ModelConfig.preset("test", **kw)
    message = str(excinfo.value)
    assert message.startswith(field + ":") and "\n" not in message, message
