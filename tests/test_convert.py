"""Attention conversions without retraining (dantinox/architectures/convert.py): what is exact, what is not.

Exact: MHA from GQA (KV heads repeated), MQA from heads that were already equal (their mean is each of them),
and MLA at full rank where removing RoPE from the dropped pairs changes nothing (a RoPE base so large that
only pair 0 turns). Converted MLA decodes through the latent cache: absorbed == materialized, cached steps ==
one forward, bytes == the C + R formula. SmolLM2 converted to MHA gives the published model's logits.
"""

import numpy as np
import pytest
from flax import nnx
from invariants import assert_cached_steps_match_full_forward, token_ids

import dantinox
from dantinox.architectures.convert import kept_pairs


def gqa(preset="test", **kw):
    cfg = dantinox.ModelConfig.preset(preset, kv_heads=2, **kw)
    return dantinox.Transformer(cfg, rngs=nnx.Rngs(0))


def logits(model, x):
    return np.asarray(model(x)[0])


@pytest.mark.parametrize("preset", ["test", "reference"])
def test_mha_from_gqa_is_exact_and_caches_g_times_more(preset):
    model = gqa(preset)
    mha = dantinox.convert_attention(model, "mha")
    assert (mha.cfg.variant, mha.cfg.n_kv_heads) == ("mha", model.cfg.n_heads)
    x = token_ids(2, 12)
    np.testing.assert_allclose(logits(mha, x), logits(model, x), atol=2e-5, rtol=2e-5)
    ratio = dantinox.init_cache(mha.cfg, 1, 16).nbytes / dantinox.init_cache(model.cfg, 1, 16).nbytes
    assert ratio == model.cfg.groups


def test_mqa_mean_pools_heads_exactly_when_they_are_equal_and_not_otherwise():
    model = gqa()
    x = token_ids(2, 12)
    mqa = dantinox.convert_attention(model, "mqa")
    assert mqa.cfg.variant == "mqa"
    assert np.abs(logits(mqa, x) - logits(model, x)).max() > 1e-2  # different heads: pooling loses something
    cfg = model.cfg
    N, K, H = cfg.n_heads, cfg.n_kv_heads, cfg.head_size
    for block in model.blocks:  # make KV head 1 a copy of head 0
        w = np.array(block.attn.wqkv.kernel[...])
        for start in (N * H, (N + K) * H):
            w[:, start + H:start + 2 * H] = w[:, start:start + H]
        block.attn.wqkv.kernel[...] = w
    np.testing.assert_allclose(logits(dantinox.convert_attention(model, "mqa"), x), logits(model, x), atol=2e-5)


def test_mla_at_full_rank_is_exact_where_partial_rope_changes_nothing():
    model = gqa(rope_base=1e30)  # pairs 1.. turn by at most 64 · 1e-7.5 rad: only pair 0 (kept) rotates
    cfg = model.cfg
    r = 1
    full = cfg.n_kv_heads * (2 * cfg.head_size - 2 * r)
    x = token_ids(2, 12)
    exact = dantinox.convert_attention(model, "mla", latent_dim=full, rope_pairs=r, keep="high")
    np.testing.assert_allclose(logits(exact, x), logits(model, x), atol=2e-5, rtol=2e-5)
    low = dantinox.convert_attention(model, "mla", latent_dim=full // 2, rope_pairs=r, keep="high")
    assert np.abs(logits(low, x) - logits(model, x)).max() > 1e-2  # a truncated SVD is not exact


@pytest.fixture(scope="module")
def latent():
    model = gqa()
    return dantinox.convert_attention(model, "mla", latent_dim=10, rope_pairs=2, calibration_ids=token_ids(2, 16))


def test_converted_mla_absorbed_equals_materialized(latent):
    materialized = nnx.merge(nnx.split(dantinox.Transformer(latent.cfg.replace(mla_decode="materialized"),
                                                            rngs=nnx.Rngs(1)))[0], nnx.state(latent))
    x = token_ids(2, 16, seed=3)
    np.testing.assert_allclose(logits(latent, x), logits(materialized, x), atol=1e-4, rtol=1e-4)


def test_converted_mla_decodes_through_the_latent_cache(latent):
    cfg = latent.cfg
    assert (cfg.variant, cfg.kv_latent_dim, cfg.rope_head_dim, cfg.mla_rope_heads) == ("mla", 10, 8, 2)
    assert_cached_steps_match_full_forward(cfg, latent, token_ids(2, 10))
    cache = dantinox.init_cache(cfg, 3, 16)
    assert isinstance(cache.layers[0], dantinox.LatentCache)
    assert cache.nbytes == dantinox.kv_cache_bytes(cfg, 3, 16) == cfg.n_layers * 3 * 16 * (10 + 8) * 4


def test_two_norm_keeps_the_pair_whose_queries_and_keys_are_largest():
    model = gqa()
    cfg = model.cfg
    N, K, H = cfg.n_heads, cfg.n_kv_heads, cfg.head_size
    w = np.array(model.blocks[0].attn.wqkv.kernel[...])
    pair = 3  # channels 3 and 3 + H/2 of every query and key head of layer 0, scaled up
    for head in range(N + K):
        for ch in (pair, pair + H // 2):
            w[:, head * H + ch] *= 50
    model.blocks[0].attn.wqkv.kernel[...] = w
    pairs = kept_pairs(model, 1, "2-norm", token_ids(2, 16))
    assert pairs[0] == ((pair,),) * K
    assert kept_pairs(model, 2, "high") == (((0, 1),) * K,) * cfg.n_layers
    assert kept_pairs(model, 2, "low") == (((2, 3),) * K,) * cfg.n_layers


@pytest.mark.parametrize("kwargs, message", [
    (dict(to="gqa2"), "to: expected one of mha, gqa, mqa, mla"),
    (dict(to="gqa", kv_heads=3), "kv_heads: to='gqa' needs a divisor of n_heads (4), got 3"),
    (dict(to="mha", latent_dim=8), "latent_dim: only for to='mla'"),
    (dict(to="mla", latent_dim=99, rope_pairs=2, keep="high"), "latent_dim: to='mla' needs C, at most the rank"),
    (dict(to="mla", latent_dim=8, rope_pairs=2), "calibration_ids: keep='2-norm' ranks the pairs"),
    (dict(to="mla", latent_dim=8, rope_pairs=4, keep="high"), "rope_pairs: fewer than the head's 4 pairs"),
])
def test_bad_arguments_are_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")) as err:
        dantinox.convert_attention(gqa(), **kwargs)
    assert "\n" not in str(err.value)


def test_rope_pairs_are_checked_by_the_config():
    cfg = dantinox.ModelConfig.preset("test", attention="latent", kv_latent_dim=8, rope_head_dim=4)
    with pytest.raises(ValueError, match=r"^layer_specs\[0\]\.rope_pairs: expected 1 tuple\(s\)"):
        cfg.replace(layer_specs=(dantinox.LayerSpec(rope_pairs=((0, 9),)),) * 2)
    ok = cfg.replace(layer_specs=(dantinox.LayerSpec(rope_pairs=[[0, 3]]),) * 2)  # lists, as JSON gives them
    assert ok.layers[0].rope_pairs == ((0, 3),) and hash(ok)
    assert dantinox.ModelConfig.from_dict(ok.to_dict()) == ok


def test_smollm2_as_mha_gives_the_published_logits(smollm):
    _, model, tok = smollm
    x = np.asarray([tok.encode("The cache of a converted model holds three times the heads.")], np.int32)
    mha = dantinox.convert_attention(model, "mha")
    assert mha.cfg.n_kv_heads == 9 == 3 * model.cfg.n_kv_heads
    for converted in (mha, dantinox.convert_attention(model, "mqa")):  # the cache lab's SmolLM2 configs
        lab_cfg = dantinox.ModelConfig.preset("smollm2-135m", kv_heads=converted.cfg.kv_heads)
        assert lab_cfg.replace(norm_eps=model.cfg.norm_eps) == converted.cfg
    ref = logits(model, x)
    err = np.abs(logits(mha, x) - ref).max() / np.abs(ref).max()
    assert err < 1e-5, f"relative error {err:.2e}"


def test_smollm2_layers_as_mla_absorbed_equals_materialized(smollm):
    """Two of SmolLM2's layers (the first two, their real weights) as MLA at C = 48 with the 2-norm choice."""
    _, model, tok = smollm
    cfg = model.cfg.replace(n_layers=2)
    state = nnx.state(model)
    state["blocks"] = nnx.State({i: state["blocks"][i] for i in range(2)})
    small = nnx.merge(nnx.split(nnx.eval_shape(lambda: dantinox.Transformer(cfg, rngs=nnx.Rngs(0))))[0], state)
    x = np.asarray([tok.encode("Absorbed and materialized decoding read the same latent cache.")], np.int32)
    mla = dantinox.convert_attention(small, "mla", latent_dim=48, calibration_ids=x)
    assert mla.cfg.kv_elements_per_token_per_layer == 48 + 3 * 8
    materialized = nnx.merge(nnx.split(nnx.eval_shape(lambda: dantinox.Transformer(
        mla.cfg.replace(mla_decode="materialized"), rngs=nnx.Rngs(0))))[0], nnx.state(mla))
    a, m = logits(mla, x), logits(materialized, x)
    assert np.abs(a - m).max() / np.abs(m).max() < 1e-4
    assert_cached_steps_match_full_forward(mla.cfg, mla, x[:, :8], atol=1e-3)
