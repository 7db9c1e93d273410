"""Invariants of multi-head latent attention and its latent cache (tiny sizes, CPU, seconds)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from invariants import assert_cached_steps_match_full_forward, count_compiles, token_ids

import dantinox

PATHS = ("absorbed", "materialized")
C, R = 16, 4  # test preset: N = 4 heads of H = 8, so C + R = 20 cached numbers per token per layer


def make(**kw):
    cfg = dantinox.ModelConfig.preset("test", attention="latent", kv_latent_dim=C, rope_head_dim=R, **kw)
    return cfg, dantinox.Transformer(cfg, rngs=nnx.Rngs(0))


ids = token_ids


def both_paths(**kw):
    """The same weights decoded both ways (the decode path adds no parameters)."""
    (_, absorbed), (_, materialized) = (make(mla_decode=p, **kw) for p in PATHS)
    same = jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), nnx.state(absorbed), nnx.state(materialized))
    assert all(jax.tree.leaves(same))
    return absorbed, materialized


@pytest.mark.parametrize("q_latent_dim", [None, 12])
def test_absorbed_and_materialized_agree(q_latent_dim):
    absorbed, materialized = both_paths(q_latent_dim=q_latent_dim)
    x = ids(2, 24)
    np.testing.assert_allclose(absorbed(x)[0], materialized(x)[0], atol=1e-4, rtol=1e-4)


def test_rope_on_compressed_keys_breaks_absorption():
    # The materialized path rotates W_UK·c_KV per key position; the absorbed path has nowhere to put that.
    absorbed, materialized = both_paths(mla_rope_on_latent=True)
    x = ids(2, 24)
    a, m = absorbed(x)[0], materialized(x)[0]
    np.testing.assert_allclose(a[:, 0], m[:, 0], atol=1e-4)  # position 0: every rotation is the identity
    assert float(jnp.abs(a - m).max()) > 0.1


@pytest.mark.parametrize("rope_on_latent", [False, True])
@pytest.mark.parametrize("path", PATHS)
def test_cached_steps_match_full_forward(path, rope_on_latent):
    cfg, model = make(mla_decode=path, mla_rope_on_latent=rope_on_latent)
    assert_cached_steps_match_full_forward(cfg, model, ids(2, 14))


def test_greedy_tokens_identical_with_and_without_cache_on_both_paths():
    prompt = ids(3, 7, seed=1)
    runs = [dantinox.generate(model, prompt, 40, use_cache=use_cache)
            for model in both_paths() for use_cache in (True, False)]
    assert runs[0].shape == (3, 47)
    np.testing.assert_array_equal(runs[0][:, :7], prompt)
    for other in runs[1:]:
        np.testing.assert_array_equal(runs[0], other)


@pytest.mark.parametrize("path", PATHS)
def test_generation_crosses_kv_windows(path):
    # max_context 150 gives windows (128, 150): decoding from 5 to 150 tokens visits both
    _, model = make(mla_decode=path, max_context=150)
    prompt = ids(1, 5)
    np.testing.assert_array_equal(dantinox.generate(model, prompt, 145),
                                  dantinox.generate(model, prompt, 145, use_cache=False))


@pytest.mark.parametrize("path", PATHS)
def test_causality_future_tokens_never_change_past_logits(path):
    _, model = make(mla_decode=path)
    x = ids(1, 16)
    y = x.copy()
    y[0, 10:] = (y[0, 10:] + 1) % 256
    a, b = model(x)[0], model(y)[0]
    np.testing.assert_allclose(a[:, :10], b[:, :10], atol=1e-6)
    assert not np.allclose(a[:, 10:], b[:, 10:])


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("batch", [1, 3])
def test_cache_is_one_latent_row_per_token_and_bytes_equal_formula(cache_dtype, batch):
    cfg = dantinox.ModelConfig.preset("test", attention="latent", kv_latent_dim=C, rope_head_dim=R,
                                      cache_dtype=cache_dtype, q_latent_dim=12)
    cache = dantinox.init_cache(cfg, batch)
    assert len(cache.layers) == cfg.n_layers
    for layer in cache.layers:
        assert isinstance(layer, dantinox.LatentCache)
        assert layer.ckv.shape == (batch, cfg.max_context, C + R) and layer.ckv.dtype == cfg.cache_jnp_dtype
    by_hand = cfg.n_layers * batch * cfg.max_context * (C + R) * np.dtype(cfg.cache_jnp_dtype).itemsize
    assert cache.nbytes == dantinox.kv_cache_bytes(cfg, batch) == by_hand


def test_cache_after_streaming_still_matches_formula():
    cfg, model = make()
    events = list(dantinox.stream(model, ids(1, 4), 6))
    assert [e.index for e in events] == list(range(5, 11))
    assert events[-1].caches.nbytes == dantinox.kv_cache_bytes(cfg, 1)


def test_bounds_and_cache_type_errors():
    cfg, model = make()
    cache = dantinox.init_cache(cfg, 1)
    _, nearly_full, _ = model(ids(1, cfg.max_context - 1), use_cache=True, kv_caches=cache)
    with pytest.raises(ValueError, match="cache_index: writing 2 token"):
        model(ids(1, 2), use_cache=True, kv_caches=nearly_full, cache_index=cfg.max_context - 1)
    with pytest.raises(ValueError, match="cache_index: must be >= 0"):
        model(ids(1, 1), use_cache=True, kv_caches=cache, cache_index=-1)
    mha_cache = dantinox.init_cache(dantinox.ModelConfig.preset("test"), 1)
    with pytest.raises(ValueError, match=r"kv_caches\[0\]: expected LatentCache"):
        model(ids(1, 1), use_cache=True, kv_caches=mha_cache, cache_index=0)
    other_latent = dantinox.init_cache(cfg.replace(kv_latent_dim=C + 2), 1)
    with pytest.raises(ValueError, match=r"kv_caches\[0\]\.ckv: expected shape"):
        model(ids(1, 1), use_cache=True, kv_caches=other_latent, cache_index=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        dantinox.generate(model, ids(1, 4), cfg.max_context)


def test_config_names_the_missing_mla_field():
    with pytest.raises(ValueError, match="kv_latent_dim: attention='latent' needs"):
        dantinox.ModelConfig.preset("test", attention="latent", rope_head_dim=R)


@pytest.mark.parametrize("path", PATHS)
def test_nothing_compiles_on_the_second_generation(path):
    _, model = make(mla_decode=path)
    prompt = ids(2, 6)
    with count_compiles() as first:
        dantinox.generate(model, prompt, 30)
    assert sum("_decode" in name for name in first) == 1 and sum("_prefill" in name for name in first) == 1
    with count_compiles() as compiled:
        dantinox.generate(model, prompt, 30)
        dantinox.generate(model, ids(2, 6, seed=3), 30)  # another prompt: the same two programs
    assert compiled == []


def _intermediate_shapes(jaxpr) -> list[tuple[int, ...]]:
    shapes = []
    for eqn in jaxpr.eqns:
        shapes += [tuple(v.aval.shape) for v in eqn.outvars]
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    shapes += _intermediate_shapes(inner)
    return shapes


@pytest.mark.parametrize("path", PATHS)
def test_only_the_materialized_path_forms_per_head_keys_and_values(path):
    S = 48  # no other dimension of the test model is 48
    cfg, model = make(mla_decode=path, max_context=S)
    cache = dantinox.init_cache(cfg, 2)
    cache = cache._replace(lengths=jnp.full((2,), 10, jnp.int32))  # as if 10 tokens were held
    jaxpr = jax.make_jaxpr(lambda t, c: model.forward(t, c))(jnp.asarray(ids(2, 1)), cache)
    per_head_kv = [s for s in _intermediate_shapes(jaxpr.jaxpr) if {S, cfg.n_heads, cfg.head_size} <= set(s)]
    assert bool(per_head_kv) == (path == "materialized"), per_head_kv
