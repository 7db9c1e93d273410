"""The paged KV cache: same tokens as the contiguous cache, shared prompts stored once, honest pool bounds."""

import numpy as np
import pytest
from flax import nnx
from invariants import token_ids

import dantinox
from dantinox.paged import BlockManager, PoolExhausted, blocks_for, pool_bytes, sample_n


def make(**kw):
    cfg = dantinox.ModelConfig.preset("test", **kw)
    return cfg, dantinox.Transformer(cfg, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("variant,block_size", [
    (dict(), 1), (dict(), 16), (dict(), 5),
    (dict(kv_heads=2), 5), (dict(attention="latent", kv_latent_dim=16, rope_head_dim=4), 5),
], ids=["mha-1", "mha-16", "mha-5", "gqa-5", "mla-5"])
def test_paged_greedy_tokens_equal_contiguous(variant, block_size):
    _, model = make(**variant)
    prompt = token_ids(2, 7, seed=3)  # 7 + 40 = 47 tokens: 5 and 16 do not divide it
    contiguous = dantinox.generate(model, prompt, 40)
    paged = dantinox.generate(model, prompt, 40, cache_layout="paged", block_size=block_size)
    np.testing.assert_array_equal(paged, contiguous)


def test_the_config_chooses_the_paged_layout():
    cfg, model = make(kv_heads=2, cache_layout="paged", block_size=5)
    prompt = token_ids(2, 7, seed=3)
    contiguous = dantinox.generate(model, prompt, 30, cache_layout="contiguous")
    np.testing.assert_array_equal(dantinox.generate(model, prompt, 30), contiguous)
    cache = dantinox.init_cache(cfg, 2, 12)  # a private pool: 3 blocks of 5 per sequence, one table for all layers
    assert cache.block_table.shape == (2, 3) and cache.layers[0].k.shape == (6, 2, 5, cfg.head_size)
    assert cache.nbytes == dantinox.kv_cache_bytes(cfg, 2, 15)  # whole blocks
    logits, cache, _ = model(prompt, use_cache=True, kv_caches=cache)
    np.testing.assert_allclose(logits, model(prompt)[0], atol=2e-5, rtol=2e-5)
    assert dantinox.filled_slots(cache).tolist() == [7, 7]


def test_generation_crosses_key_buckets_on_paged_cache():
    _, model = make(max_context=300)  # key buckets 128, 192, 256, 300: the block table widens between them
    prompt = token_ids(1, 5)
    np.testing.assert_array_equal(dantinox.generate(model, prompt, 200, cache_layout="paged", block_size=16),
                                  dantinox.generate(model, prompt, 200))


def test_parallel_samples_store_the_prompt_once():
    cfg, model = make(kv_heads=2)
    prompt, n, new, bs = token_ids(1, 10, seed=5), 3, 12, 4  # 10 tokens: two full blocks, one half-filled
    run = sample_n(model, prompt, n, new, block_size=bs, temperature=0.0)
    np.testing.assert_array_equal(run.tokens, dantinox.generate(model, np.repeat(prompt, n, 0), new))
    # the two full prompt blocks are held once, by all three samples; the half-filled one is copied twice
    shared = run.manager.tables[0][:2]
    assert all(run.manager.tables[s][:2] == shared for s in range(n))
    assert [run.manager.refs[b] for b in shared] == [n, n] and len(run.copies) == n - 1
    block = pool_bytes(cfg, 1, bs)
    assert block == dantinox.kv_cache_bytes(cfg, tokens=bs)  # one block = bs tokens of every layer, measured
    assert run.used_bytes == (2 + n * (blocks_for(10 + new, bs) - 2)) * block
    assert run.unshared_bytes - run.used_bytes == (n - 1) * 2 * block


def test_copy_on_write_copies_the_filled_slots_of_the_shared_block():
    _, model = make()
    run = sample_n(model, token_ids(1, 6, seed=2), 2, 5, block_size=4, temperature=1.0, seed=7)
    (src, dst), = run.copies  # 6 tokens: block 1 holds slots 4 and 5 when the samples fork
    for layer in run.caches.layers:
        for pool in (a for a in layer if a is not None):
            pool = np.asarray(pool)
            assert np.abs(pool[src][:, :2]).sum() > 0
            np.testing.assert_array_equal(pool[dst][:, :2], pool[src][:, :2])
    assert run.tokens.shape == (2, 11) and (run.tokens[0, 6:] != run.tokens[1, 6:]).any()  # sampled apart


def test_block_manager_counts_shares_and_frees():
    pool = BlockManager(num_blocks=8, block_size=4)
    assert pool.add("a", 8) == [0, 1]  # exactly two full blocks
    pool.fork("a", "b")
    assert pool.append("b", 1) == []  # the shared blocks are full: a new block, nothing copied
    assert pool.tables["b"] == [0, 1, 2] and pool.refs[:3] == [2, 2, 1]
    pool.fork("b", "c")  # now block 2 (one token) is shared by b and c
    assert pool.append("c", 2) == [(2, 3)] and pool.fill[3] == 3 and pool.fill[2] == 1
    assert pool.append("b", 1) == []  # b is block 2's only holder again: written in place
    assert pool.filled_slots() == 8 + 2 + 3 and pool.shared_blocks() == {0, 1}
    assert pool.release("a") == 0 and pool.release("b") == 1 and pool.release("c") == 3
    assert pool.num_free == 8 and pool.num_used == 0 and pool.used_blocks == [] and pool.filled_slots() == 0


def test_pool_exhaustion_is_refused_and_changes_nothing():
    pool = BlockManager(num_blocks=3, block_size=16)
    pool.add(0, 40)
    with pytest.raises(PoolExhausted, match=r"pool: sequence 0 needs 1 more block\(s\) of 16 tokens, 0 of 3 are free"):
        pool.append(0, 9)
    assert pool.lengths[0] == 40 and pool.num_free == 0
    with pytest.raises(ValueError, match="seq: no sequence 'x' in the pool"):
        pool.append("x")
    with pytest.raises(ValueError, match="width: sequence 0 holds 3 blocks, more than width=2"):
        pool.table_array([0], 2)


def test_generate_refuses_bad_layout_arguments():
    _, model = make()
    prompt = token_ids(1, 4)
    with pytest.raises(ValueError, match="cache_layout: expected one of contiguous, paged, got 'pages'"):
        dantinox.generate(model, prompt, 4, cache_layout="pages")
    with pytest.raises(ValueError, match="block_size: expected a positive integer, got 0"):
        dantinox.generate(model, prompt, 4, cache_layout="paged", block_size=0)
