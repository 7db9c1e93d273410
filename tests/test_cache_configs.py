"""The layout belongs to the cache: one Transformer decodes with contiguous, paged, quantized and engine caches."""

import numpy as np
import pytest
from flax import nnx

import dantinox
from dantinox.engine import Engine
from dantinox.generation import quality
from dantinox.generation.forking import sample_n


@pytest.fixture(scope="module")
def model():
    return dantinox.Transformer(dantinox.ModelConfig.preset("test", kv_heads=2), rngs=nnx.Rngs(0))


@pytest.fixture
def no_rebuild(monkeypatch):
    """Fail any call path that builds another model object over the same weights."""
    def refuse(*args, **kwargs):
        raise AssertionError("quality.with_changes: a cache layout must not rebuild the model")
    monkeypatch.setattr(quality, "with_changes", refuse)


PROMPT = (np.arange(1, 7)[None] * 37) % 259


def test_one_model_decodes_contiguous_and_paged_alike(model, no_rebuild):
    graphdef = nnx.graphdef(model)
    contiguous = np.asarray(dantinox.generate(model, PROMPT, 20))
    paged = np.asarray(dantinox.generate(model, PROMPT, 20, cache_layout="paged", page_size=4))
    np.testing.assert_array_equal(contiguous, paged)
    assert model.cfg.cache_layout == "contiguous" and nnx.graphdef(model) == graphdef  # nothing rebuilt or changed
    # sample_n forks one paged prefill: greedy, every sample is the contiguous continuation
    run = sample_n(model, PROMPT, 3, 20, page_size=4, temperature=0.0)
    np.testing.assert_array_equal(run.tokens, np.repeat(contiguous, 3, axis=0))
    assert run.caches.config == model.cfg.cache.replace(cache_layout="paged", page_size=4)


def test_the_cache_carries_its_config_and_the_model_follows_it(model):
    """An int8 cache made for the same model: the model writes codes and scales, as a model built for int8 does."""
    int8 = model.cfg.with_cache(cache_dtype="int8")
    cache = dantinox.init_cache(int8, 1, 16)
    assert cache.config == int8.cache and cache.nbytes == dantinox.kv_cache_bytes(int8, 1, 16)
    logits, cache, _ = model(PROMPT, use_cache=True, kv_caches=cache)
    assert cache.layers[0].k.dtype == np.int8 and cache.layers[0].k_scale is not None
    built_for_int8 = quality.with_changes(model, cache_dtype="int8")  # the old way: a model per cache dtype
    want, _, _ = built_for_int8(PROMPT, use_cache=True, kv_caches=dantinox.init_cache(int8, 1, 16))
    np.testing.assert_array_equal(np.asarray(logits), np.asarray(want))
    with pytest.raises(ValueError, match="kv_caches: a page table goes with cache_layout='paged'"):
        model(PROMPT, use_cache=True, kv_caches=cache._replace(config=model.cfg.cache.replace(cache_layout="paged")))


def test_the_engine_serves_the_model_it_is_given(model, no_rebuild):
    engine = Engine(model, num_pages=16, page_size=4, max_seqs=2, fixed_shapes=True)
    assert engine.model is model and engine.runner.graphdef == nnx.graphdef(model)
    assert engine.cfg.cache_layout == "paged" and model.cfg.cache_layout == "contiguous"
    rid = engine.add(PROMPT[0].tolist(), 20)
    out = engine.run()
    np.testing.assert_array_equal(out[rid], np.asarray(dantinox.generate(model, PROMPT, 20))[0, PROMPT.shape[1]:])
