"""Cross-layer KV sharing (LayerSpec "shared", dantinox/cache/shared.py): a layer that reads an earlier layer's
cache and stores nothing. Checked against the numpy model, against decoding without a cache, on a paged and a
ring source, in bytes (stored once, read by each reader) and in its one-line refusals."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from invariants import token_ids
from test_reference import np_forward

import dantinox
from dantinox import LayerSpec
from dantinox.accounting.memory import kv_read_bytes
from dantinox.accounting.roofline import decode_cost
from dantinox.cache.shared import SharedCache


def shared_cfg(*specs, **kw):
    base = dantinox.ModelConfig.preset("test", kv_heads=2, **kw)
    return base.replace(n_layers=len(specs), layer_specs=tuple(specs))


FULL_SOURCES = (LayerSpec(), LayerSpec(), LayerSpec("shared", source=0), LayerSpec("shared", source=1))
RING_SOURCE = (LayerSpec(), LayerSpec("sliding", 6), LayerSpec("shared", source=1), LayerSpec("shared", source=0))


def test_shared_layers_match_the_numpy_model():
    """The reference reads layer j's keys for a layer sharing j: reading the other source, or keys of its own,
    gives other logits."""
    cfg = shared_cfg(*FULL_SOURCES)
    model = dantinox.Transformer(cfg, rngs=nnx.Rngs(0))
    assert model.blocks[2].attn.wqkv.kernel[...].shape == (cfg.d_model, cfg.n_heads * cfg.head_size)  # Q only
    x = token_ids(2, 10)
    logits = np.asarray(model(x)[0])
    for b in range(2):
        np.testing.assert_allclose(logits[b], np_forward(model, x[b]), atol=2e-4, rtol=2e-4)
    crossed = shared_cfg(*FULL_SOURCES[:2], LayerSpec("shared", source=1), LayerSpec("shared", source=0))
    other = dantinox.Transformer(crossed, rngs=nnx.Rngs(0))  # the same weights, the sources swapped
    assert not np.allclose(np.asarray(other(x)[0]), logits, atol=1e-3)


@pytest.mark.parametrize("specs", [FULL_SOURCES, RING_SOURCE], ids=["full", "ring"])
def test_a_shared_layer_stores_nothing_and_decodes_like_the_full_forward(specs):
    cfg = shared_cfg(*specs)
    model = dantinox.Transformer(cfg, rngs=nnx.Rngs(0))
    cache = dantinox.init_cache(cfg, 2, 32)
    assert [type(layer) for layer in cache.layers][2:] == [SharedCache, SharedCache]
    assert cache.layers[2].slots == 0 and dantinox.tree_nbytes(cache.layers[2:]) == 0
    assert cache.nbytes == dantinox.kv_cache_bytes(cfg, 2, 32)  # measured == the formula, to the byte
    prompt = token_ids(2, 4)
    greedy = np.asarray(dantinox.generate(model, prompt, 16))  # 20 positions: the ring of 6 wraps
    paged = dantinox.generate(model, prompt, 16, cache_layout="paged", page_size=4)
    np.testing.assert_array_equal(greedy, np.asarray(paged))
    step = dantinox.init_cache(cfg, 2, 32)  # one token at a time against the whole sequence at once
    full = np.asarray(model(jnp.asarray(greedy[:, :12]))[0])
    for t in range(12):
        logits, step, _ = model(jnp.asarray(greedy[:, t:t + 1]), use_cache=True, kv_caches=step)
        np.testing.assert_allclose(np.asarray(logits)[:, 0], full[:, t], atol=2e-4, rtol=2e-4)


def test_bytes_stored_once_and_read_by_every_reader():
    cfg = shared_cfg(*FULL_SOURCES)
    alone = shared_cfg(*FULL_SOURCES[:2])  # the two layers that store
    assert dantinox.kv_cache_bytes(cfg, 3, 100) == dantinox.kv_cache_bytes(alone, 3, 100)
    assert kv_read_bytes(cfg, 3, 100) == 2 * dantinox.kv_cache_bytes(alone, 3, 100)
    assert decode_cost(cfg, 3, 100).cache_read_bytes == kv_read_bytes(cfg, 3, 100)
    ring = shared_cfg(*RING_SOURCE)
    per_layer = [dantinox.kv_cache_bytes(shared_cfg(s), 1, 100) for s in RING_SOURCE[:2]]
    assert kv_read_bytes(ring, 1, 100) == 2 * sum(per_layer)  # layer 2 reads the ring, layer 3 the full layer


@pytest.mark.parametrize("specs, kw, field", [
    ((LayerSpec(), LayerSpec("shared", source=1)), {}, "layer_specs[1].source"),
    ((LayerSpec("shared", source=0), LayerSpec()), {}, "layer_specs[0].source"),
    ((LayerSpec(), LayerSpec("shared", source=0), LayerSpec("shared", source=1)), {}, "layer_specs[2].source"),
    ((LayerSpec(), LayerSpec("shared", source=0, kv_heads=4)), {}, "layer_specs[1].kv_heads"),
    ((LayerSpec(), LayerSpec("shared", 8, source=0)), {}, "layer_specs[1].window"),
    ((LayerSpec(), LayerSpec(source=0)), {}, "layer_specs[1].source"),
    ((LayerSpec(), LayerSpec("shared", source=0)), {"cache_dtype": "kivi4", "kivi_group": 4, "kivi_residual": 8},
     "layer_specs"),
    ((LayerSpec(), LayerSpec("shared", source=0)), {"eviction": "h2o", "cache_budget": 8}, "layer_specs"),
])
def test_a_shared_layer_it_cannot_build_is_refused_in_one_line(specs, kw, field):
    with pytest.raises(ValueError) as excinfo:
        shared_cfg(*specs, **kw)
    message = str(excinfo.value)
    assert message.startswith(field + ":") and "\n" not in message, message


@pytest.mark.parametrize("specs", [FULL_SOURCES, RING_SOURCE], ids=["full", "ring"])
def test_the_engine_serves_a_model_with_shared_layers(specs):
    """Pages for the full source, seats for the ring, nothing for the readers; every request's tokens equal
    generate's of it alone, with a prefix hit and with drafts verified (rejected drafts restored in the ring)."""
    model = dantinox.Transformer(shared_cfg(*specs), rngs=nnx.Rngs(0))
    system = list(range(1, 9))
    prompts = [np.asarray(system + [20, 21], np.int32), np.asarray(system + [30, 31, 32], np.int32)]
    for speculate in (0, 2):
        engine = dantinox.Engine(model, num_pages=32, page_size=4, chunk_tokens=8, speculate=speculate)
        rids = [engine.add(p, 10, arrival_step=3 * i) for i, p in enumerate(prompts)]  # the second one hits
        out = engine.run()
        for rid, prompt in zip(rids, prompts, strict=True):
            want = np.asarray(dantinox.generate(model, prompt[None], 10))[0, len(prompt):]
            assert list(out[rid]) == want.tolist()
        assert engine.stats()["hit_tokens"] >= len(system)
