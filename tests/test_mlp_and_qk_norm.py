"""Gemma's pieces as architecture fields: the GeGLU MLP (`mlp="geglu"`) and QK-norm (`qk_norm=True`)."""

import numpy as np
import pytest
from flax import nnx

import dantinox
from dantinox import LayerSpec

IDS = (np.arange(12)[None] * 11 + 5) % 259
# Gemma 3 in small: a local layer (window 5, base 10k) then a global one (base 1M, its own H), GeGLU, QK-norm.
GEMMA3_LIKE = dict(kv_heads=2, mlp="geglu", qk_norm=True,
                   layer_specs=(LayerSpec("sliding", 5, rope_base=1e4), LayerSpec(head_size=16, rope_base=1e6)))


def build(**kw):
    cfg = dantinox.ModelConfig.preset("test", **kw)
    return cfg, dantinox.Transformer(cfg, rngs=nnx.Rngs(0))


def stepped(model, cfg):
    cache, out = dantinox.init_cache(cfg, 1, IDS.shape[1]), []
    for t in range(IDS.shape[1]):
        logits, cache, _ = model(IDS[:, t:t + 1], use_cache=True, kv_caches=cache)
        out.append(np.asarray(logits[:, 0]))
    return np.stack(out, 1)


@pytest.mark.parametrize("kw", [dict(mlp="geglu"), dict(qk_norm=True), GEMMA3_LIKE], ids=["geglu", "qk-norm", "gemma3"])
def test_cached_equals_uncached(kw):
    cfg, model = build(**kw)
    np.testing.assert_allclose(stepped(model, cfg), np.asarray(model(IDS)[0]), atol=2e-5)
    paged = dantinox.generate(model, IDS[:, :4], 12, cache_layout="paged", page_size=4)
    np.testing.assert_array_equal(np.asarray(dantinox.generate(model, IDS[:, :4], 12)), np.asarray(paged))


def test_geglu_is_another_activation_over_the_same_weights():
    swiglu = np.asarray(build()[1](IDS)[0])
    geglu = np.asarray(build(mlp="geglu")[1](IDS)[0])  # same init, same parameter shapes
    assert np.abs(swiglu - geglu).max() > 1e-3


def test_qk_norm_makes_attention_blind_to_the_scale_of_queries_and_keys():
    cfg, model = build(qk_norm=True, kv_heads=2)
    assert model.blocks[0].attn.q_norm.scale[...].shape == (cfg.head_size,)
    before = np.asarray(model(IDS)[0])
    for block in model.blocks:  # scale the Q and K columns of the fused projection by 3
        w = block.attn.wqkv.kernel
        qk = (cfg.n_heads + cfg.n_kv_heads) * cfg.head_size
        w[...] = w[...].at[:, :qk].multiply(3.0)
    np.testing.assert_allclose(np.asarray(model(IDS)[0]), before, atol=1e-4)
    _, mixed = build(**GEMMA3_LIKE)
    assert mixed.blocks[1].attn.k_norm.scale[...].shape == (16,)  # the layer's own H


@pytest.mark.parametrize("kw,message", [
    (dict(mlp="relu"), "mlp: expected one of swiglu, geglu, got 'relu'"),
    (dict(qk_norm=True, attention="latent", kv_latent_dim=16, rope_head_dim=4), "qk_norm: normalizes K/V-heads"),
])
def test_bad_fields_get_one_line(kw, message):
    with pytest.raises(ValueError, match=message) as err:
        dantinox.ModelConfig.preset("test", **kw)
    assert "\n" not in str(err.value)
