"""Invariants of the autoregressive model and its static KV cache (tiny sizes, CPU, seconds)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from invariants import assert_cached_steps_match_full_forward, token_ids

import dantinox
from dantinox.generate import _decode_segment, _prefill_jit

VARIANTS = [dict(attention="mha"), dict(attention="gqa", kv_heads=2), dict(attention="mqa")]


def make(**kw):
    cfg = dantinox.ModelConfig.preset("test", **kw)
    return cfg, dantinox.Transformer(cfg, rngs=nnx.Rngs(0))


ids = token_ids


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v["attention"])
def test_cached_steps_match_full_forward(variant):
    cfg, model = make(**variant, cache_dtype="float32")
    assert_cached_steps_match_full_forward(cfg, model, ids(2, 12))


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v["attention"])
def test_greedy_tokens_identical_with_and_without_cache(variant):
    _, model = make(**variant)
    prompt = ids(3, 7, seed=1)
    cached = dantinox.generate(model, prompt, max_new_tokens=40)
    uncached = dantinox.generate(model, prompt, max_new_tokens=40, use_cache=False)
    assert cached.shape == (3, 47) and cached.dtype == jnp.int32
    np.testing.assert_array_equal(cached[:, :7], prompt)
    np.testing.assert_array_equal(cached, uncached)


def test_generation_crosses_kv_windows():
    # max_context 300 gives windows (128, 256, 300): decoding from 5 to 300 tokens visits all three
    _, model = make(max_context=300)
    prompt = ids(1, 5)
    np.testing.assert_array_equal(dantinox.generate(model, prompt, 295), dantinox.generate(model, prompt, 295, False))


def test_jit_and_eager_forward_agree():
    _, model = make(attention="gqa", kv_heads=2)
    x = ids(2, 9)
    eager, _, _ = model(x)
    jitted = nnx.jit(lambda m, t: m(t)[0])(model, jnp.asarray(x))
    np.testing.assert_allclose(eager, jitted, atol=1e-5)


def test_causality_future_tokens_never_change_past_logits():
    _, model = make()
    x = ids(1, 16)
    y = x.copy()
    y[0, 10:] = (y[0, 10:] + 1) % 256
    a, _, _ = model(x)
    b, _, _ = model(y)
    np.testing.assert_allclose(a[:, :10], b[:, :10], atol=1e-6)
    assert not np.allclose(a[:, 10:], b[:, 10:])


def test_causality_by_gradients():
    _, model = make()
    x = jnp.asarray(ids(1, 8))
    emb = model.embed(x)

    def logit_at(e, t):
        h = e
        pos = jnp.arange(8)
        for block in model.blocks:
            h, _ = block(h, pos)
        return model.logits(model.norm(h))[0, t].sum()

    grad = jax.grad(logit_at)(emb, 3)
    assert float(jnp.abs(grad[0, 4:]).max()) == 0.0
    assert float(jnp.abs(grad[0, :4]).max()) > 0.0


def test_no_recompilation_between_decode_steps_or_generations():
    cfg, model = make(attention="gqa", kv_heads=2, max_context=300)  # key windows (128, 192, 256, 300)
    prompt = ids(2, 6)
    _decode_segment.clear_cache()
    _prefill_jit.clear_cache()
    dantinox.generate(model, prompt, 10)  # every step inside the 128-slot window: one decode program
    assert _decode_segment._cache_size() == 1 and _prefill_jit._cache_size() == 1
    dantinox.generate(model, prompt, 100)  # 90 more steps, the step count is traced: nothing new
    dantinox.generate(model, ids(2, 6, seed=3), 3)
    assert _decode_segment._cache_size() == 1 and _prefill_jit._cache_size() == 1
    dantinox.generate(model, prompt, 290)  # passes windows 192, 256 and 300: one program each, once
    assert _decode_segment._cache_size() == 4
    dantinox.generate(model, ids(2, 6, seed=4), 290)
    assert _decode_segment._cache_size() == 4 and _prefill_jit._cache_size() == 1


def test_decode_cache_is_updated_in_place():
    """The compiled decode loop never copies the cache: no cache-sized copy in the optimised program."""
    cfg, model = make(max_context=256)
    graphdef, params = nnx.split(model)
    state = _prefill_jit(graphdef, params, jnp.asarray(ids(2, 4)), 40, 0, use_cache=True, cache_length=128)
    hlo = _decode_segment.lower(graphdef, params, state, jnp.float32(0), top_k=None, use_cache=True,
                                window=128).compile().as_text()
    shape = f"f32[2,{cfg.kv_heads},128,{cfg.head_size}]"
    assert shape in hlo
    assert not [line for line in hlo.splitlines() if f"= {shape}" in line and " copy(" in line]


def test_stream_yields_same_tokens_and_growing_index():
    cfg, model = make()
    prompt = ids(1, 4)
    events = list(dantinox.stream(model, prompt, 12))
    assert [e.index for e in events] == list(range(5, 17))
    streamed = np.concatenate([prompt[0], [int(e.token[0]) for e in events]])
    np.testing.assert_array_equal(streamed, dantinox.generate(model, prompt, 12)[0])
    assert dantinox.tree_nbytes(events[-1].caches) == dantinox.kv_cache_bytes(cfg, 1)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v["attention"])
@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("batch", [1, 3])
def test_allocated_bytes_equal_formula(variant, cache_dtype, batch):
    cfg = dantinox.ModelConfig.preset("test", cache_dtype=cache_dtype, **variant)
    cache = dantinox.init_cache(cfg, batch)
    assert dantinox.tree_nbytes(cache) == dantinox.kv_cache_bytes(cfg, batch, cfg.max_context)
    for length in (1, 17):
        formula = dantinox.kv_cache_bytes(cfg, batch, length)
        assert dantinox.tree_nbytes(dantinox.init_cache(cfg, batch, length)) == formula
        assert dantinox.tree_nbytes(dantinox.cache_shapes(cfg, batch, length)) == formula
    layer = cache[0]
    assert layer.k.shape == (batch, cfg.kv_heads, cfg.max_context, cfg.head_size)
    assert layer.k.dtype == jnp.dtype(cache_dtype)


@pytest.mark.parametrize("kv_heads", [1, 2, 4, 8])
def test_reference_formula_by_hand(kv_heads):
    cfg = dantinox.ModelConfig.preset("reference", attention="gqa", kv_heads=kv_heads, cache_dtype="bfloat16")
    # L * 2 * B * T * K * H * bytes with L=12, H=32, bf16
    assert dantinox.kv_cache_bytes(cfg, 4, 512) == 12 * 2 * 4 * 512 * kv_heads * 32 * 2


def test_reference_mha_is_six_mib_not_the_copied_0_375_mb():
    cfg = dantinox.ModelConfig.preset("reference", cache_dtype="bfloat16")
    assert dantinox.kv_cache_bytes(cfg, 1, 512) == 6 * 2**20
    assert dantinox.tree_nbytes(dantinox.cache_shapes(cfg, 1, 512)) == 6 * 2**20


def test_max_batch_size_subtracts_measured_weights():
    cfg, model = make()
    weights = dantinox.param_bytes(model)
    assert weights == dantinox.param_bytes(cfg) > 0
    per_seq = dantinox.kv_cache_bytes(cfg, 1, 64)
    memory = weights + 5 * per_seq + per_seq // 2
    assert dantinox.max_batch_size(cfg, memory, 64) == 5
    assert dantinox.max_batch_size(cfg, weights // 2, 64) == 0


# Bounds and argument errors: raised before any computation, one clear message.

def test_prompt_longer_than_max_context():
    cfg, model = make()
    with pytest.raises(ValueError, match="max_context"):
        model(ids(1, cfg.max_context + 1))
    with pytest.raises(ValueError, match="max_context"):
        dantinox.generate(model, ids(1, 10), cfg.max_context)


def test_decode_past_the_end_is_refused_not_clamped():
    cfg, model = make()
    cache = dantinox.init_cache(cfg, 1)
    with pytest.raises(ValueError, match="cache holds 64"):
        model(ids(1, 1), use_cache=True, kv_caches=cache, cache_index=cfg.max_context)
    with pytest.raises(ValueError, match="needs 66 slots"):
        model(ids(1, 3), use_cache=True, kv_caches=cache, cache_index=63)
    with pytest.raises(ValueError, match=">= 0"):
        model(ids(1, 1), use_cache=True, kv_caches=cache, cache_index=-1)


def test_traced_cache_index_is_refused():
    cfg, model = make()
    cache = dantinox.init_cache(cfg, 1)
    with pytest.raises(ValueError, match="concrete integer"):
        nnx.jit(lambda m, c, i: m(ids(1, 1), use_cache=True, kv_caches=c, cache_index=i)[0])(model, cache, 3)


def test_batch_and_dtype_mismatch():
    cfg, model = make()
    with pytest.raises(ValueError, match="batch 2 but ids have batch 3"):
        model(ids(3, 2), use_cache=True, kv_caches=dantinox.init_cache(cfg, 2), cache_index=0)
    other = dantinox.init_cache(cfg.replace(cache_dtype="bfloat16"), 1)
    with pytest.raises(ValueError, match="dtype float32"):
        model(ids(1, 2), use_cache=True, kv_caches=other, cache_index=0)
    with pytest.raises(ValueError, match="tuple of 2 per-layer caches"):
        model(ids(1, 2), use_cache=True, kv_caches=dantinox.init_cache(cfg, 1)[:1], cache_index=0)


@pytest.mark.parametrize("bad, match", [
    (np.zeros((4,), np.int32), r"shape \[batch, tokens\]"),
    (np.zeros((1, 3), np.float32), "integer token ids"),
    (np.full((1, 3), 259), r"\[0, 259\)"),
    (np.zeros((1, 0), np.int32), "at least one"),
])
def test_bad_ids(bad, match):
    _, model = make()
    with pytest.raises(ValueError, match=match):
        model(bad)


@pytest.mark.parametrize("kw, match", [
    (dict(attention="gqa"), "kv_heads: attention='gqa' needs kv_heads"),
    (dict(attention="gqa", kv_heads=3), "divide n_heads"),
    (dict(attention="mha", kv_heads=2), "must equal n_heads"),
    (dict(attention="mqa", kv_heads=2), "must be 1"),
    (dict(attention="xla"), "attention: expected one of"),
    (dict(dtype="int8"), "dtype: expected one of"),
    (dict(head_size=7), "head_size"),
    (dict(n_layers=0), "n_layers: expected a positive integer"),
    (dict(kv_latent_dim=8), "only used with attention='mla'"),
])
def test_config_errors_name_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        dantinox.ModelConfig.preset("test", **kw)


def test_generate_argument_errors():
    _, model = make()
    with pytest.raises(ValueError, match="max_new_tokens"):
        dantinox.generate(model, ids(1, 3), -1)
    with pytest.raises(ValueError, match="temperature"):
        dantinox.generate(model, ids(1, 3), 2, temperature=-0.5)
    with pytest.raises(ValueError, match="top_k"):
        dantinox.generate(model, ids(1, 3), 2, temperature=1.0, top_k=0)


def test_sampling_is_seeded_and_top_k_one_is_greedy():
    _, model = make()
    prompt = ids(2, 4)
    a = dantinox.generate(model, prompt, 20, temperature=1.0, seed=7)
    b = dantinox.generate(model, prompt, 20, temperature=1.0, seed=7)
    np.testing.assert_array_equal(a, b)
    greedy = dantinox.generate(model, prompt, 20)
    np.testing.assert_array_equal(dantinox.generate(model, prompt, 20, temperature=1.0, top_k=1), greedy)


def test_bfloat16_cache_stays_close_to_float32():
    cfg32, model = make()
    x = ids(1, 10)
    full, _, _ = model(x)
    cache = dantinox.init_cache(cfg32.replace(cache_dtype="bfloat16"), 1)
    model16 = dantinox.Transformer(cfg32.replace(cache_dtype="bfloat16"), rngs=nnx.Rngs(0))
    logits, cache, _ = model16(x, use_cache=True, kv_caches=cache, cache_index=0)
    assert cache[0].k.dtype == jnp.bfloat16
    np.testing.assert_allclose(logits, full, atol=0.1)
