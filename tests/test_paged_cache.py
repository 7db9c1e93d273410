"""The paged KV cache: same tokens as the contiguous cache, shared prompts stored once, honest pool bounds."""

import importlib
import re

import numpy as np
import pytest
from flax import nnx
from invariants import token_ids

import dantinox
from dantinox.cache.paged import PageManager, PoolExhausted, pages_for, pool_bytes, take_pages
from dantinox.generation.forking import sample_n


def make(**kw):
    cfg = dantinox.ModelConfig.preset("test", **kw)
    return cfg, dantinox.Transformer(cfg, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("variant,page_size", [
    (dict(), 1), (dict(), 16), (dict(), 5),
    (dict(kv_heads=2), 5), (dict(attention="latent", kv_latent_dim=16, rope_head_dim=4), 5),
], ids=["mha-1", "mha-16", "mha-5", "gqa-5", "mla-5"])
@pytest.mark.both_backends
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
    assert cache.page_table.shape == (2, 3) and cache.layers[0].k.shape == (1, 2, cfg.head_size, 6 * 5)  # one row
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
        pages = take_pages(layer, np.array([src, dst]), 4)  # each field [..., 2, 4, ...]: the two pages
        for field, axis in ((a, ax) for a, ax in zip(pages, layer.SEQ_AXES, strict=True) if a is not None):
            src_slots, dst_slots = (np.take(np.take(np.asarray(field), i, axis=axis - 1), [0, 1], axis=axis - 1)
                                    for i in (0, 1))  # slots 0 and 1 of each
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


# Under DANTINOX_BACKEND=reference the test command runs the gathered read only (the whole-pool read is the same
# XLA program in both backends but for the backend's attention arrangement, which the gathered read also takes)
@pytest.mark.parametrize("whole", [True, pytest.param(False, marks=pytest.mark.both_backends)],
                         ids=["pool-read-whole", "pages-gathered"])
@pytest.mark.parametrize("variant", [
    dict(), dict(kv_heads=2), dict(kv_heads=2, cache_dtype="int8"),
    dict(attention="latent", kv_latent_dim=16, rope_head_dim=4),
    dict(attention="latent", kv_latent_dim=16, rope_head_dim=4, mla_decode="materialized"),
], ids=["mha", "gqa", "gqa-int8", "mla-absorbed", "mla-materialized"])
def test_both_xla_paged_reads_give_the_contiguous_logits(monkeypatch, xla_pool_reads, variant, whole):
    """Shuffled pages in a pool with a page nobody holds: reading the pool whole (other sequences' slots
    masked) and gathering each sequence's pages give the logits of a contiguous cache, prefill and decode."""
    _paged_logits_equal_contiguous(monkeypatch, variant, whole)


@pytest.mark.parametrize("variant", [
    dict(), dict(kv_heads=2), dict(kv_heads=2, cache_dtype="int8"), dict(kv_heads=2, cache_dtype="bfloat16"),
], ids=["mha", "gqa", "gqa-int8", "gqa-bf16"])
def test_the_pool_kernel_gives_the_contiguous_logits(monkeypatch, fresh_forward, variant, pool_kernel_built):
    """The same shuffled pool, its decode steps read by dantinox/backend/pool_kernel.py (the prompt through XLA)."""
    from dantinox.backend import pool_kernel

    calls, attend = [], pool_kernel.attend
    monkeypatch.setattr(pool_kernel, "attend", lambda *a, **kw: calls.append(a[1].dtype) or attend(*a, **kw))
    _paged_logits_equal_contiguous(monkeypatch, variant, whole=False)
    cfg = dantinox.ModelConfig.preset("test", **variant)
    # every layer of the decode steps (traced once for both); the prompt (T = 7) through XLA
    assert calls == [cfg.cache_jnp_dtype] * cfg.n_layers


def _paged_logits_equal_contiguous(monkeypatch, variant, whole):
    import dantinox.cache.paged as paged
    from dantinox.backend import pool_kernel

    monkeypatch.setattr(paged, "POOL_READ_MAX", 10**9 if whole else -1)
    cfg, model = make(cache_layout="paged", page_size=4, **variant)
    contiguous = dantinox.Transformer(cfg.replace(cache_layout="contiguous"), rngs=nnx.Rngs(0))
    wanted, ids, cache = [], token_ids(2, 7, seed=4), dantinox.init_cache(contiguous.cfg, 2, 12)
    with monkeypatch.context() as xla:  # the contiguous cache through XLA's own arithmetic, never the kernel
        xla.setattr(pool_kernel, "handles", lambda k_dtype, scale_layout: False)
        for _ in range(3):  # the prompt, then two decode steps (the second crosses into a new page)
            want, cache, _ = contiguous(ids, use_cache=True, kv_caches=cache)
            wanted.append((ids, want))
            ids = np.asarray(want[:, -1].argmax(-1))[:, None]
    # the paged model traced anew
    importlib.import_module("dantinox.architectures.model")._compiled_forward.clear_cache()
    table = np.array([[5, 2, 7], [0, 6, 3]], np.int32)  # 12 slots each; pages 1, 4 and 8 held by nobody
    cache = paged.init_pool(cfg, 9, table)
    for ids, want in wanted:
        logits, cache, _ = model(ids, use_cache=True, kv_caches=cache)
        np.testing.assert_allclose(logits, want, rtol=2e-5, atol=2e-5)
    assert dantinox.filled_slots(cache).tolist() == [9, 9]
    assert paged.Paged(4).reads_pool(1, 9, 3) is whole


def test_a_decode_step_reads_the_pool_whole_until_the_scores_it_adds_pass_the_limit():
    """The rule of dantinox/cache/paged.py: a decode step of B sequences over a private pool (P = B · M pages)
    adds G · (B - 1) scores per own slot; prefill chunks of T tokens T times that."""
    from dantinox.cache.paged import POOL_READ_MAX, Paged

    mha, gqa = Paged(16, query_heads=1), Paged(16, query_heads=4)
    assert mha.pool_read_excess(1, 8 * 64, 64) == 7 and gqa.pool_read_excess(1, 8 * 64, 64) == 28
    assert mha.reads_pool(1, 8 * 64, 64) and not gqa.reads_pool(1, 8 * 64, 64)  # batch 8: 7 <= 16 < 28
    assert mha.reads_pool(1, 16 * 64, 64) and not mha.reads_pool(1, 32 * 64, 64)  # 15 <= 16 < 31
    assert gqa.reads_pool(1, 4 * 64, 64) and not mha.reads_pool(64, 2 * 64, 64)  # 12; a 64-token chunk: 64
    assert mha.reads_pool(64, 64, 64) and POOL_READ_MAX == 16  # one sequence's own pool: nothing extra


def _lowered_paged_decode(batch=8, **kw):
    from dantinox.accounting.roofline import timing_state
    from dantinox.generation.generate import compiler_options, decode_loop_jit

    cfg = dantinox.ModelConfig.preset("test", cache_layout="paged", page_size=16, max_context=256, **kw)
    graphdef, params = nnx.split(dantinox.Transformer(cfg, rngs=nnx.Rngs(0)))
    program = decode_loop_jit(compiler_options=compiler_options(batch, cfg, 256))
    lowered = program.lower(graphdef, params, timing_state(cfg, batch, 256, 250), None, 256, top_k=None,
                            use_cache=True, bucket=256)
    sources = {line.split(": (")[1].split(",")[0] for line in lowered.as_text().splitlines()
               if "stablehlo.gather" in line}  # the array each gather reads from
    # the token embedding's lookup and the page table's entries for the new tokens' pages, nothing else
    assert sources == {f"tensor<{cfg.vocab_size}x{cfg.d_model}xf32>", f"tensor<{batch}x{256 // 16}xi32>"}
    return cfg, lowered


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16", "int8"])
def test_a_batch_decode_step_reads_the_pool_with_the_kernel(cache_dtype, pool_kernel_built):
    """The compiled batch-8 decode loop of a paged cache calls dantinox/backend/pool_kernel.py once per layer and
    step, gathers no pool page, and takes the default compiler options."""
    from dantinox.generation.generate import compiler_options

    cfg, lowered = _lowered_paged_decode(cache_dtype=cache_dtype)
    target = {"float32": "float", "bfloat16": "bf16", "int8": "int8"}[cache_dtype]
    assert lowered.as_text().count(f"dantinox_pool_attend_{target}") == cfg.n_layers
    assert compiler_options(8, cfg, 256) is None
    # batch 1: its own pool, read as a row per sequence (dantinox.backend.cpu.uses_kernel): MHA's one query head
    # per KV head goes to the kernel, four (K = 1) in int8 and bfloat16 but not in float32
    assert "dantinox_pool_attend" in _lowered_paged_decode(batch=1, cache_dtype=cache_dtype)[1].as_text()
    mqa = _lowered_paged_decode(batch=1, cache_dtype=cache_dtype, kv_heads=1)[1].as_text()
    assert ("dantinox_pool_attend" in mqa) is (cache_dtype != "float32")


def test_a_batch_decode_step_over_a_paged_pool_read_by_xla_gathers_nothing(xla_pool_reads, native):
    """Without the kernel, the compiled batch-8 decode loop of a paged cache (reference shapes, 1,024 slots)
    attends over the pool as stored: no gather of pool pages, and XLA's own dots (xla_cpu.EIGEN_DOTS) in
    float32 where a layer's values outweigh its weights."""
    from dantinox.backend.xla_cpu import EIGEN_DOTS
    from dantinox.generation.generate import compiler_options

    cfg, lowered = _lowered_paged_decode()
    assert compiler_options(8, cfg, 256) == EIGEN_DOTS and compiler_options(8, cfg.replace(dtype="bfloat16")) is None
    assert compiler_options(1, cfg) == compiler_options(1)  # batch 1: the contiguous cache's options
    assert compiler_options(8, cfg, 16) is None  # 8 x 16 slots of values weigh less than a layer's weights
    assert "dantinox_pool_attend" not in lowered.as_text()
    hlo = lowered.compile().as_text()
    ynn = set(re.findall(r"calls=(%[\w.-]+).*__ynn_fusion", hlo))  # computations YNNPACK runs
    bodies = {m[0]: m[1] for m in re.findall(r"\n(%[\w.-]+) [^\n]*\{\n(.*?)\n\}", hlo, re.S)}
    assert " dot(" in hlo and not any(" dot(" in bodies[name] for name in ynn)  # every dot is XLA's own
