"""Per-layer specs: a layer's kind, window, K, H and RoPE base are read from its LayerSpec by model and cache."""

import json

import numpy as np
import pytest
from flax import nnx

import dantinox
from dantinox import LayerSpec

# Gemma 3's shape in small: a local layer (window 5, RoPE base 10k) before a global one with its own K, H and base.
MIXED = dict(kv_heads=2, layer_specs=(LayerSpec("sliding", 5, rope_base=1e4),
                                      LayerSpec(kv_heads=1, head_size=16, rope_base=1e6)))


def step_logits(model, ids, cfg):
    """Logits of feeding `ids` one token at a time through a cache."""
    cache, out = dantinox.init_cache(cfg, ids.shape[0], ids.shape[1]), []
    for t in range(ids.shape[1]):
        logits, cache, _ = model(ids[:, t:t + 1], use_cache=True, kv_caches=cache)
        out.append(np.asarray(logits[:, 0]))
    return np.stack(out, 1), cache


def test_layers_fill_in_the_model_wide_values():
    cfg = dantinox.ModelConfig.preset("test", **MIXED)
    assert cfg.layers == (LayerSpec("sliding", 5, kv_heads=2, head_size=8, rope_base=1e4),
                          LayerSpec("full", None, kv_heads=1, head_size=16, rope_base=1e6))
    # a value equal to the model-wide one is stored once, as None
    assert cfg.layer_specs[0] == LayerSpec("sliding", 5)
    assert cfg.layer_windows == (5, None) and cfg.sliding_window == 5
    assert not cfg.uniform_heads


def test_the_old_per_layer_tuples_are_layer_specs():
    old = dantinox.ModelConfig.preset("test", n_layers=3, sliding_windows=(4, None, None),
                                      attention_chunks=(None, 6, None))
    new = dantinox.ModelConfig.preset("test", n_layers=3,
                                      layer_specs=(LayerSpec("sliding", 4), LayerSpec("chunked", 6), LayerSpec()))
    assert old.layers == new.layers
    ids = np.arange(1, 10)[None]
    a = dantinox.Transformer(old, rngs=nnx.Rngs(0))(ids)[0]
    b = dantinox.Transformer(new, rngs=nnx.Rngs(0))(ids)[0]
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # no layer differs from the model-wide fields: stored one way
    plain = [LayerSpec(), LayerSpec(rope_base=10_000.0)]
    assert dantinox.ModelConfig.preset("test", layer_specs=plain).layer_specs is None


def test_specs_round_trip_through_json():
    cfg = dantinox.ModelConfig.preset("test", **MIXED)
    assert dantinox.ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_mixed_layers_decode_cached_as_uncached():
    """Per-layer window, K, H and RoPE base: one token at a time through the cache == one full forward."""
    cfg = dantinox.ModelConfig.preset("test", **MIXED)
    model = dantinox.Transformer(cfg, rngs=nnx.Rngs(0))
    assert model.blocks[1].attn.wqkv.kernel[...].shape == (32, (4 + 2 * 1) * 16)  # N + 2K heads of H = 16
    ids = (np.arange(12)[None] * 7 + 3) % cfg.vocab_size
    full = np.asarray(model(ids)[0])
    stepped, cache = step_logits(model, ids, cfg)
    np.testing.assert_allclose(stepped, full, atol=2e-5)
    # each layer's cache holds its own K and H (and the local layer only its window): bytes == the per-layer sum
    assert cache.nbytes == sum(2 * layer.kv_heads * layer.head_size * min(12, layer.window or 12) * 4
                               for layer in cfg.layers) == dantinox.kv_cache_bytes(cfg, 1, 12)
    contiguous = dantinox.generate(model, ids[:, :4], 10)
    paged = dantinox.generate(model, ids[:, :4], 10, cache_layout="paged", page_size=4)
    np.testing.assert_array_equal(np.asarray(contiguous), np.asarray(paged))


def test_each_layer_reads_its_own_rope_base():
    base = dantinox.ModelConfig.preset("test", **MIXED)
    ids = np.arange(1, 10)[None]
    logits = [np.asarray(dantinox.Transformer(cfg, rngs=nnx.Rngs(0))(ids)[0]) for cfg in (
        base, base.replace(layer_specs=(base.layer_specs[0], LayerSpec(kv_heads=1, head_size=16, rope_base=50.0))))]
    assert np.abs(logits[0] - logits[1]).max() > 1e-3  # same weights, another base in layer 1 only


@pytest.mark.parametrize("specs,message", [
    ((LayerSpec("shared", source=0), LayerSpec()), r"layer_specs\[0\]\.source: a shared layer reads an earlier "),
    ((LayerSpec(), LayerSpec("state", value_heads=3)), r"layer_specs\[1\]\.value_heads: each key head serves"),
    ((LayerSpec("window"), LayerSpec()), r"layer_specs\[0\]\.kind: expected one of full, sliding"),
    ((LayerSpec("sliding"), LayerSpec()), r"layer_specs\[0\]\.window: a sliding or chunked layer needs"),
    ((LayerSpec(window=4), LayerSpec()), r"layer_specs\[0\]\.window: a sliding or chunked layer needs"),
    ((LayerSpec(), LayerSpec(kv_heads=3)), r"layer_specs\[1\]\.kv_heads: must divide n_heads \(4\)"),
    ((LayerSpec(), LayerSpec(head_size=5)), r"layer_specs\[1\]\.head_size: RoPE rotates pairs"),
    ((LayerSpec(rope_base=1.0), LayerSpec()), r"layer_specs\[0\]\.rope_base: must be greater than 1"),
    ((LayerSpec(),), r"layer_specs: expected one dantinox.LayerSpec per layer \(2\)"),
])
def test_bad_specs_get_one_line(specs, message):
    with pytest.raises(ValueError, match=message) as err:
        dantinox.ModelConfig.preset("test", layer_specs=specs)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("extra,message", [
    (dict(sliding_windows=(4, None)), "sliding_windows: layer_specs gives every layer's window"),
    (dict(cache_dtype="kivi4", kivi_group=4, kivi_residual=8), "layer_specs: cache_dtype='kivi4'"),
    (dict(cache_budget=8, eviction="h2o"), "layer_specs: eviction='h2o'"),
])
def test_specs_with_whole_model_modes_are_refused(extra, message):
    with pytest.raises(ValueError, match=message):
        dantinox.ModelConfig.preset("test", layer_specs=(LayerSpec(), LayerSpec(kv_heads=2)), **extra)


def test_latent_layers_refuse_per_layer_heads():
    with pytest.raises(ValueError, match=r"layer_specs\[1\]\.kv_heads: attention='latent' caches one latent"):
        dantinox.ModelConfig.preset("test", attention="latent", kv_latent_dim=16, rope_head_dim=4,
                                    layer_specs=(LayerSpec(), LayerSpec(kv_heads=2)))


def test_the_engine_serves_layers_of_their_own_shape():
    """A ring layer with its own K and H beside a paged one: the engine's rows equal generate's."""
    cfg = dantinox.ModelConfig.preset("test", kv_heads=2, layer_specs=(
        LayerSpec("sliding", 5, kv_heads=1, head_size=16), LayerSpec(rope_base=1e6)))
    model = dantinox.Transformer(cfg, rngs=nnx.Rngs(0))
    prompt = (np.arange(6)[None] * 11 + 5) % cfg.vocab_size
    engine = dantinox.Engine(model, num_pages=16, page_size=4, max_seqs=2, fixed_shapes=True, chunk_tokens=4)
    rid = engine.add(prompt[0].tolist(), 10)
    np.testing.assert_array_equal(engine.run()[rid], np.asarray(dantinox.generate(model, prompt, 10))[0, 6:])


def test_one_geometry_counts_refuse_layers_that_differ():
    """The roofline, the mesh layout and the content's formulas assume one K and H: they say so in one line."""
    import jax

    from dantinox.accounting import roofline
    from dantinox.generation import quality, sharding

    cfg = dantinox.ModelConfig.preset("test", **MIXED)
    with pytest.raises(ValueError, match="layer_specs: the roofline counts one K and H for every layer"):
        roofline.weight_count(cfg)
    with pytest.raises(ValueError, match="mesh: the cache is laid out with one K for every layer"):
        sharding.plan(cfg, jax.make_mesh((1, 1), ("data", "model")), 1)
    with pytest.raises(ValueError, match="layer_specs: the content's cache formulas have one K and H"):
        quality.formula_for(cfg, 1, 8)
