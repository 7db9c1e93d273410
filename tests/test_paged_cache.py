"""The paged KV cache: same tokens as the contiguous cache, shared prompts stored once, honest pool bounds."""

import numpy as np
import pytest
from flax import nnx
from invariants import token_ids

import dantinox
from dantinox.paged import PageManager, PoolExhausted, pages_for, pool_bytes, sample_n


def make(**kw):
    cfg = dantinox.ModelConfig.preset("test", **kw)
    return cfg, dantinox.Transformer(cfg, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("variant,page_size", [
    (dict(), 1), (dict(), 16), (dict(), 5),
    (dict(kv_heads=2), 5), (dict(attention="latent", kv_latent_dim=16, rope_head_dim=4), 5),
], ids=["mha-1", "mha-16", "mha-5", "gqa-5", "mla-5"])
def test_paged_greedy_tokens_equal_contiguous(variant, page_size):
    _, model = make(**variant)
    prompt = token_ids(2, 7, seed=3)  # 7 + 40 = 47 tokens: 5 and 16 do not divide it
    contiguous = dantinox.generate(model, prompt, 40)
    paged = dantinox.generate(model, prompt, 40, cache_layout="paged", page_size=page_size)
    np.testing.assert_array_equal(paged, contiguous)


def test_the_config_chooses_the_paged_layout():
    cfg, model = make(kv_heads=2, cache_layout="paged", page_size=5)
    prompt = token_ids(2, 7, seed=3)
    contiguous = dantinox.generate(model, prompt, 30, cache_layout="contiguous")
    np.testing.assert_array_equal(dantinox.generate(model, prompt, 30), contiguous)
    cache = dantinox.init_cache(cfg, 2, 12)  # a private pool: 3 pages of 5 per sequence, one table for all layers
    assert cache.page_table.shape == (2, 3) and cache.layers[0].k.shape == (6, 2, 5, cfg.head_size)
    assert cache.nbytes == dantinox.kv_cache_bytes(cfg, 2, 15)  # whole pages
    logits, cache, _ = model(prompt, use_cache=True, kv_caches=cache)
    np.testing.assert_allclose(logits, model(prompt)[0], atol=2e-5, rtol=2e-5)
    assert dantinox.filled_slots(cache).tolist() == [7, 7]


def test_generation_crosses_key_buckets_on_paged_cache():
    _, model = make(max_context=300)  # key buckets 128, 192, 256, 300: the page table widens between them
    prompt = token_ids(1, 5)
    np.testing.assert_array_equal(dantinox.generate(model, prompt, 200, cache_layout="paged", page_size=16),
                                  dantinox.generate(model, prompt, 200))


def test_parallel_samples_store_the_prompt_once():
    cfg, model = make(kv_heads=2)
    prompt, n, new, ps = token_ids(1, 10, seed=5), 3, 12, 4  # 10 tokens: two full pages, one half-filled
    run = sample_n(model, prompt, n, new, page_size=ps, temperature=0.0)
    np.testing.assert_array_equal(run.tokens, dantinox.generate(model, np.repeat(prompt, n, 0), new))
    # the two full prompt pages are held once, by all three samples; the half-filled one is copied twice
    shared = run.manager.tables[0][:2]
    assert all(run.manager.tables[s][:2] == shared for s in range(n))
    assert [run.manager.refs[b] for b in shared] == [n, n] and len(run.copies) == n - 1
    page = pool_bytes(cfg, 1, ps)
    assert page == dantinox.kv_cache_bytes(cfg, tokens=ps)  # one page = ps tokens of every layer, measured
    assert run.used_bytes == (2 + n * (pages_for(10 + new, ps) - 2)) * page
    assert run.unshared_bytes - run.used_bytes == (n - 1) * 2 * page


def test_copy_on_write_copies_the_filled_slots_of_the_shared_page():
    _, model = make()
    run = sample_n(model, token_ids(1, 6, seed=2), 2, 5, page_size=4, temperature=1.0, seed=7)
    (src, dst), = run.copies  # 6 tokens: page 1 holds slots 4 and 5 when the samples fork
    for layer in run.caches.layers:
        for pool, axis in ((a, ax) for a, ax in zip(layer, layer.SEQ_AXES, strict=True) if a is not None):
            pool = np.asarray(pool)
            src_slots, dst_slots = (np.take(pool[p], [0, 1], axis=axis - 1) for p in (src, dst))  # slots 0 and 1
            assert np.abs(src_slots).sum() > 0
            np.testing.assert_array_equal(dst_slots, src_slots)
    assert run.tokens.shape == (2, 11) and (run.tokens[0, 6:] != run.tokens[1, 6:]).any()  # sampled apart


def test_page_manager_counts_shares_and_frees():
    pool = PageManager(num_pages=8, page_size=4)
    assert pool.add("a", 8) == [0, 1]  # exactly two full pages
    pool.fork("a", "b")
    assert pool.append("b", 1) == []  # the shared pages are full: a new page, nothing copied
    assert pool.tables["b"] == [0, 1, 2] and pool.refs[:3] == [2, 2, 1]
    pool.fork("b", "c")  # now page 2 (one token) is shared by b and c
    assert pool.append("c", 2) == [(2, 3)] and pool.fill[3] == 3 and pool.fill[2] == 1
    assert pool.append("b", 1) == []  # b is page 2's only holder again: written in place
    assert pool.filled_slots() == 8 + 2 + 3 and pool.shared_pages() == {0, 1}
    assert pool.release("a") == 0 and pool.release("b") == 1 and pool.release("c") == 3
    assert pool.num_free == 8 and pool.num_used == 0 and pool.used_pages == [] and pool.filled_slots() == 0


def test_pool_exhaustion_is_refused_and_changes_nothing():
    pool = PageManager(num_pages=3, page_size=16)
    pool.add(0, 40)
    with pytest.raises(PoolExhausted, match=r"pool: sequence 0 needs 1 more page\(s\) of 16 tokens, 0 of 3 are free"):
        pool.append(0, 9)
    assert pool.lengths[0] == 40 and pool.num_free == 0
    with pytest.raises(ValueError, match="seq: no sequence 'x' in the pool"):
        pool.append("x")
    with pytest.raises(ValueError, match="width: sequence 0 holds 3 pages, more than width=2"):
        pool.table_array([0], 2)


def test_generate_refuses_bad_layout_arguments():
    _, model = make()
    prompt = token_ids(1, 4)
    with pytest.raises(ValueError, match="cache_layout: expected one of contiguous, paged, got 'pages'"):
        dantinox.generate(model, prompt, 4, cache_layout="pages")
    with pytest.raises(ValueError, match="page_size: expected a positive integer, got 0"):
        dantinox.generate(model, prompt, 4, cache_layout="paged", page_size=0)
