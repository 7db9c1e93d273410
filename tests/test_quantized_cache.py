"""Quantized KV cache: bytes with scales equal the content formula; rounding and logit error stay bounded."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from invariants import token_ids

import content
import dantinox
from dantinox.architectures.attention import attend
from dantinox.cache import LayerCache
from dantinox.cache.quant import dequantize, quantize
from dantinox.generation import quality
from dantinox_labs import shipped

RUN = shipped.run("tiny")
FORMATS = ["int8", "fp8_e4m3"]


@pytest.mark.parametrize("cache_dtype", FORMATS)
@pytest.mark.parametrize("kv_heads", [None, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("batch,tokens", [(1, 1), (3, 40), (2, 64)])
def test_bytes_with_scales_equal_the_quantization_formula(cache_dtype, kv_heads, batch, tokens):
    cfg = dantinox.ModelConfig.preset("test", kv_heads=kv_heads, cache_dtype=cache_dtype)
    cache = dantinox.init_cache(cfg, batch, tokens)
    assert all(type(layer) is LayerCache and layer.k_scale is not None for layer in cache.layers)
    formula = content.evaluate(content.load_entry("kv-cache-quantization"), "Quantized KV cache size",
                               L=cfg.n_layers, B=batch, T=tokens, H_kv=cfg.n_kv_heads, d_h=cfg.head_size,
                               q=8, z=4, G=cfg.head_size)  # one float32 scale per head of one token
    assert cache.nbytes == formula
    entry_id, title, variables = quality.formula_for(cfg, batch, tokens)
    assert content.evaluate(content.load_entry(entry_id), title, **variables) == formula


def test_int8_rounding_is_within_half_a_step_per_token_and_head():
    x = np.random.RandomState(0).randn(2, 3, 5, 16).astype(np.float32) * np.array([0.01, 1, 100])[None, :, None, None]
    codes, scale = quantize(jnp.asarray(x), "int8")
    assert codes.dtype == jnp.int8 and scale.shape == (2, 3, 5)
    np.testing.assert_allclose(scale, np.abs(x).max(-1) / 127, rtol=1e-6)  # each head of each token its own scale
    err = np.abs(np.asarray(dequantize(codes, scale)) - x)
    assert (err <= scale[..., None] / 2 * (1 + 1e-5)).all()
    assert np.asarray(codes).max() == 127 or np.asarray(codes).min() == -127  # the range is used


def test_fp8_rounding_error_is_relative():
    x = np.random.RandomState(1).randn(4, 2, 6, 32).astype(np.float32)
    codes, scale = quantize(jnp.asarray(x), "fp8_e4m3")
    assert codes.dtype == jnp.float8_e4m3fn
    err = np.abs(np.asarray(dequantize(codes, scale)) - x)
    # 3 mantissa bits: half a step is 2^-4 of the value; below e4m3's normal range (2^-6) the step is fixed
    bound = np.maximum(np.abs(x) * 2.0**-4, scale[..., None] * 2.0**-10) * (1 + 1e-5)
    assert (err <= bound).all()
    assert np.isfinite(np.asarray(dequantize(codes, scale))).all()  # clipped at 448, never NaN


def test_all_zero_vectors_stay_zero():
    codes, scale = quantize(jnp.zeros((1, 1, 2, 8)), "int8")
    assert not np.asarray(codes).any() and not np.asarray(scale).any()


@pytest.mark.both_backends
@pytest.mark.parametrize("B, T", [(2, 3), (2, 1), (1, 1)])  # (2, 1) takes the one-token arrangement
def test_scales_folded_into_attention_equal_attention_over_dequantized_values(B, T):
    rs = np.random.RandomState(3)
    q = jnp.asarray(rs.randn(B, T, 2, 3, 8), jnp.float32)
    k, v = (jnp.asarray(rs.randn(B, 2, 9, 8), jnp.float32) for _ in range(2))
    (kc, ks), (vc, vs) = quantize(k, "int8"), quantize(v, "int8")
    mask = jnp.asarray(rs.rand(B, T, 9) > 0.3).at[..., 0].set(True)
    slot_last = lambda a: a.transpose(0, 1, 3, 2)  # noqa: E731  (keys as the cache stores them)
    folded = attend(q, slot_last(kc), vc, mask, None, ks, vs)
    np.testing.assert_allclose(folded, attend(q, slot_last(dequantize(kc, ks)), dequantize(vc, vs), mask),
                               atol=1e-5, rtol=1e-5)


LAYOUTS = [dict(kv_heads=2), dict(kv_heads=2, cache_layout="paged", page_size=5),
           dict(attention="latent", kv_latent_dim=16, rope_head_dim=4),
           dict(attention="latent", kv_latent_dim=16, rope_head_dim=4, mla_decode="materialized")]


# Under DANTINOX_BACKEND=reference the test command runs int8 only: the storage the native kernels read (fp8
# goes through the same XLA reads in both backends)
@pytest.mark.parametrize("cache_dtype", [pytest.param("int8", marks=pytest.mark.both_backends), "fp8_e4m3"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=["gqa", "paged", "mla-absorbed", "mla-materialized"])
def test_step_by_step_decode_equals_one_pass_through_the_cache(cache_dtype, layout):
    """Per-token scales: a token's codes never depend on later tokens, so decoding equals the one-pass logits."""
    cfg = dantinox.ModelConfig.preset("test", cache_dtype=cache_dtype, **layout)
    model = dantinox.Transformer(cfg, rngs=nnx.Rngs(0))
    x = token_ids(2, 20)
    one_pass = quality.cached_logits(model, x)
    logits, cache, _ = model(x[:, :4], use_cache=True, kv_caches=dantinox.init_cache(cfg, 2, 32))
    steps = [logits]
    for t in range(4, 20):
        logits, cache, _ = model(x[:, t:t + 1], use_cache=True, kv_caches=cache, cache_index=t)
        steps.append(logits)
    np.testing.assert_allclose(np.asarray(jnp.concatenate(steps, axis=1)), one_pass, atol=1e-4, rtol=1e-4)
    codes, scales = cache.layers[0][0], cache.layers[0][-1]
    assert codes.dtype == cfg.cache_jnp_dtype and scales.dtype == jnp.float32
    assert cache.nbytes == dantinox.kv_cache_bytes(cfg, 2, 32) or cfg.cache_layout == "paged"
    np.testing.assert_array_equal(dantinox.generate(model, x[:, :5], 12), dantinox.generate(model, x[:, :5], 12))


def test_generate_grows_a_quantized_cache_across_key_buckets():
    cfg = dantinox.ModelConfig.preset("test", max_context=200, cache_dtype="int8")
    model = dantinox.Transformer(cfg, rngs=nnx.Rngs(0))
    out = dantinox.generate(model, token_ids(1, 5), max_new_tokens=140)  # passes the 128-slot key bucket
    assert out.shape == (1, 145)


@pytest.mark.parametrize("cache_dtype,max_error,min_agreement", [("int8", 2.0, 0.97), ("fp8_e4m3", 8.0, 0.9)])
def test_logit_error_against_the_float_cache_on_the_trained_model(cache_dtype, max_error, min_agreement):
    """Bounds with room over what benchmarks/memory_savers.py measures (int8: 0.91, fp8: 4.6; logits reach ~17)."""
    _, model = dantinox.load_run(RUN)
    ids = quality.heldout_chunks(shipped.heldout_text(), 256)[:8]
    reference = quality.cached_logits(model, ids)
    logits = quality.cached_logits(model, ids, model.cfg.cache.replace(cache_dtype=cache_dtype))  # same model
    assert 0 < quality.max_logit_error(logits, reference) < max_error
    assert quality.agreement(logits, reference) > min_agreement
    assert abs(quality.bits_per_byte(logits, ids) - quality.bits_per_byte(reference, ids)) < 0.05


@pytest.mark.parametrize("kw,match", [
    (dict(cache_dtype="int4"), "cache_dtype: expected one of float32, bfloat16, float16, int8, fp8_e4m3"),
    (dict(cache_dtype="fp8_e4m3", paradigm="diffusion"), "cache_dtype: paradigm='diffusion' caches float keys"),
])
def test_config_errors_name_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        dantinox.ModelConfig.preset("test", **kw)


def test_a_float_cache_is_refused_where_int8_is_expected():
    cfg = dantinox.ModelConfig.preset("test", cache_dtype="int8")
    model = dantinox.Transformer(cfg, rngs=nnx.Rngs(0))
    float_cache = dantinox.init_cache(cfg.replace(cache_dtype="float32"), 1)
    model(token_ids(1, 3), use_cache=True, kv_caches=float_cache)  # a float cache says so: the model decodes with it
    with pytest.raises(ValueError, match=r"kv_caches\[0\]\.k: expected dtype int8"):  # float arrays, int8 config
        model(token_ids(1, 3), use_cache=True, kv_caches=float_cache._replace(config=cfg.cache))
