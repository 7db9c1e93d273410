"""Invariants of the autoregressive model and its static KV cache (tiny sizes, CPU, seconds)."""


import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fast_compile import LEARNER_COMPILE
from flax import nnx
from invariants import assert_cached_steps_match_full_forward, count_compiles, token_ids

import dantinox
from dantinox.generation.generate import decode_program, prefill_jit

VARIANTS = [dict(), dict(kv_heads=2), dict(kv_heads=1)]


def make(**kw):
    cfg = dantinox.ModelConfig.preset("test", **kw)
    return cfg, dantinox.Transformer(cfg, rngs=nnx.Rngs(0))


ids = token_ids


@pytest.mark.both_backends
@pytest.mark.parametrize("variant", VARIANTS, ids=["mha", "gqa", "mqa"])
def test_cached_steps_match_full_forward(variant):
    cfg, model = make(**variant, cache_dtype="float32")
    assert_cached_steps_match_full_forward(cfg, model, ids(2, 12))


@pytest.mark.both_backends
@pytest.mark.parametrize("variant", VARIANTS, ids=["mha", "gqa", "mqa"])
def test_greedy_tokens_identical_with_and_without_cache(variant):
    _, model = make(**variant)
    prompt = ids(3, 7, seed=1)
    cached = dantinox.generate(model, prompt, max_new_tokens=40)
    uncached = dantinox.generate(model, prompt, max_new_tokens=40, use_cache=False)
    assert cached.shape == (3, 47) and cached.dtype == jnp.int32
    np.testing.assert_array_equal(cached[:, :7], prompt)
    np.testing.assert_array_equal(cached, uncached)


def test_generation_crosses_key_buckets():
    # max_context 300 gives key buckets (128, 192, 256, 300): decoding from 5 to 300 tokens visits all four
    _, model = make(max_context=300)
    prompt = ids(1, 5)
    np.testing.assert_array_equal(dantinox.generate(model, prompt, 295), dantinox.generate(model, prompt, 295, False))


def test_the_checked_call_equals_the_forward_inside_a_callers_jit():
    _, model = make(kv_heads=2)
    x = ids(2, 9)
    checked, _, _ = model(x)
    jitted = nnx.jit(lambda m, t: m(t)[0])(model, jnp.asarray(x))  # the checked call nested in a caller's trace
    np.testing.assert_allclose(checked, jitted, atol=1e-5)


def test_the_checked_call_is_one_compiled_program_per_shape():
    """`model(ids, ...)` compiles its forward once per shape, not each operation on its own (op by op, one step
    of the four-layer test model dispatched hundreds of operations); a step at the next position compiles nothing."""
    cfg, model = make(kv_heads=2)
    prompt = ids(1, 9)
    with count_compiles() as first:
        _, cache, _ = model(prompt[:, :8], use_cache=True, kv_caches=dantinox.init_cache(cfg, 1, 32))
        _, cache, _ = model(prompt[:, 8:], use_cache=True, kv_caches=cache, cache_index=8)
    forwards = [name for name in first if "_compiled_forward" in name]
    assert len(forwards) == 2 and len(first) <= 8, first  # the prompt's shape and the one-token step's
    with count_compiles() as again:
        _, cache, _ = model(prompt[:, 8:], use_cache=True, kv_caches=cache, cache_index=9)
    assert again == [], again


@pytest.mark.both_backends
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
        pos = jnp.arange(8)[None]
        for block in model.blocks:
            h, _, _ = block(h, pos)
        return model.logits(model.norm(h))[0, t].sum()

    grad = jax.jit(jax.grad(logit_at), static_argnums=1)(emb, 3)  # one program, not each operation on its own
    assert float(jnp.abs(grad[0, 4:]).max()) == 0.0
    assert float(jnp.abs(grad[0, :4]).max()) > 0.0


def test_nothing_compiles_on_the_second_call():
    cfg, model = make(kv_heads=2, max_context=300)  # key buckets (128, 192, 256, 300)
    prompt = ids(2, 6)
    with count_compiles() as first:
        dantinox.generate(model, prompt, 290)  # compiles the prefill and the loops of all four buckets
    assert sum("_decode" in name for name in first) == 4 and sum("_prefill" in name for name in first) == 1
    with count_compiles() as compiled:
        dantinox.generate(model, prompt, 290)
        dantinox.generate(model, ids(2, 6, seed=3), 290)  # another prompt: same programs
    assert compiled == []
    with count_compiles() as compiled:
        dantinox.generate(model, ids(2, 6, seed=4), 100)  # another length: only the output slice is new
    assert not [name for name in compiled if "_decode" in name or "_prefill" in name]


def test_decode_loop_updates_the_donated_cache_in_place():
    """generate's loop takes the cache by donation: XLA reuses its buffer, so the input is consumed."""
    _, model = make(max_context=256)
    graphdef, params = nnx.split(model)
    cfg = model.cfg
    four, forty = jnp.full((2,), 4, jnp.int32), jnp.full((2,), 40, jnp.int32)
    state = prefill_jit(graphdef, params, jnp.asarray(ids(2, 4)), four, forty, 0, init_cache_of(cfg, 2, 128))
    out = decode_program(2, donate=True)(graphdef, params, state, None, 40, top_k=None, use_cache=True, bucket=128)
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(state.caches))
    assert out.index.tolist() == [40, 40] and dantinox.filled_slots(out.caches).tolist() == [40, 40]


@pytest.mark.parametrize("cache_dtype", ["float32", "int8"])
def test_a_single_sequence_step_reads_the_cache_where_it_lies(cache_dtype, pool_kernel_built):
    """Batch 1 with grouped queries: the compiled loop writes each layer's keys and values in place and makes no
    other array of their shape (no whole-cache copy into another order for a matmul), and its greedy tokens are
    those of the uncached model. With 4 query heads per KV head float32 attends by reductions, int8 codes by
    dantinox/backend/pool_kernel.py (dantinox.backend.cpu.uses_kernel)."""
    cfg, model = make(kv_heads=1, max_context=64, cache_dtype=cache_dtype)
    graphdef, params = nnx.split(model)
    one, forty = jnp.full((1,), 4, jnp.int32), jnp.full((1,), 40, jnp.int32)
    state = prefill_jit(graphdef, params, jnp.asarray(ids(1, 4)), one, forty, 0, init_cache_of(cfg, 1, 64))
    layer = state.caches.layers[0]
    from dantinox.backend import cpu

    assert cpu.uses_reduction_arrangement(1, 1, cfg.groups)
    kernel = cache_dtype == "int8"
    assert cpu.uses_kernel(1, 1, cfg.groups, 1, layer.k.dtype, layer.scale_layout) is kernel
    lowered = decode_program(1, donate=True, cfg=cfg, slots=64).lower(
        graphdef, params, state, None, 40, top_k=None, use_cache=True, bucket=64)
    assert lowered.as_text().count("dantinox_pool_attend_int8") == (cfg.n_layers if kernel else 0)
    hlo = lowered.compile(compiler_options=LEARNER_COMPILE).as_text()
    for array in (layer.k, layer.v):
        shape = rf"{array.dtype.name.replace('float', 'f').replace('int', 's')}\[{','.join(map(str, array.shape))}\]"
        made = re.findall(rf"= {shape}\{{[^}}]*\}} ([\w-]+)\(", hlo)
        assert made and set(made) <= {"parameter", "get-tuple-element", "fusion", "dynamic-update-slice",
                                      "bitcast"}, (array.shape, made)
        assert made.count("fusion") == cfg.n_layers, made  # one write per layer, nothing else of that shape
    prompt = ids(1, 4)
    assert (dantinox.generate(model, prompt, 20) == dantinox.generate(model, prompt, 20, use_cache=False)).all()


def init_cache_of(cfg, batch, length):
    return dantinox.init_cache(cfg, batch, length)


def test_stream_chunks_reproduce_generate_and_report_compiles():
    cfg, model = make(max_context=300)
    prompt = ids(2, 4)
    events, filled, nbytes = [], [], []
    for e in dantinox.stream(model, prompt, 150, chunk_tokens=16):  # crosses the 128-slot key bucket
        events.append(e)  # an event's cache is valid until the next chunk (stream donates it)
        filled.append(dantinox.filled_slots(e.caches).tolist())
        nbytes.append(e.caches.nbytes)
    assert [e.index for e in events] == [*range(20, 154, 16), 154]
    assert all(e.tokens.shape == (2, 16) for e in events[:-1]) and events[-1].tokens.shape == (2, 6)
    streamed = np.concatenate([prompt, *(e.tokens for e in events)], axis=1)
    np.testing.assert_array_equal(streamed, dantinox.generate(model, prompt, 150))
    np.testing.assert_array_equal(events[-1].token, streamed[:, -1])
    assert all(e.seconds > 0 for e in events)
    assert filled == [[e.index] * 2 for e in events]
    assert [nbytes[0], nbytes[-1]] == [dantinox.kv_cache_bytes(cfg, 2, 128),
                                       dantinox.kv_cache_bytes(cfg, 2, 192)]  # one key bucket long
    assert events[0].caches.layers[0].k.is_deleted()  # donated: the next chunk updated it in place
    again = list(dantinox.stream(model, prompt, 150, chunk_tokens=16))
    assert not any(e.compiled for e in again)
    assert [e.index for e in again] == [e.index for e in events]


def test_stream_one_token_at_a_time_without_a_cache():
    _, model = make()
    prompt = ids(1, 4)
    events = list(dantinox.stream(model, prompt, 12, use_cache=False))
    assert [e.index for e in events] == list(range(5, 17)) and all(e.caches is None for e in events)
    streamed = np.concatenate([prompt[0], [int(e.token[0]) for e in events]])
    np.testing.assert_array_equal(streamed, dantinox.generate(model, prompt, 12)[0])
    with pytest.raises(ValueError, match="chunk_tokens: expected a positive integer, got 0"):
        next(dantinox.stream(model, prompt, 12, chunk_tokens=0))


@pytest.mark.parametrize("variant", [dict(kv_heads=2), dict(attention="latent", kv_latent_dim=16, rope_head_dim=4)],
                         ids=["gqa", "mla"])
def test_filled_slots_reads_the_cache(variant):
    cfg, model = make(**variant)
    cache = dantinox.init_cache(cfg, 2)
    assert dantinox.filled_slots(cache).tolist() == [0, 0]
    _, cache, _ = model(ids(2, 9), use_cache=True, kv_caches=cache, cache_index=0)
    assert dantinox.filled_slots(cache).tolist() == [9, 9]
    _, cache, _ = model(ids(2, 1), use_cache=True, kv_caches=cache)  # the position comes from the cache
    assert dantinox.filled_slots(cache).tolist() == [10, 10]


def test_a_gap_between_the_fill_and_the_position_is_refused():
    cfg, model = make()
    with pytest.raises(ValueError, match=r"^cache_index: the cache holds 0 token\(s\), so the next write goes at 0; "
                                         r"got 10"):
        model(ids(1, 3), use_cache=True, kv_caches=dantinox.init_cache(cfg, 1), cache_index=10)
    _, cache, _ = model(ids(1, 3), use_cache=True, kv_caches=dantinox.init_cache(cfg, 1))
    with pytest.raises(ValueError, match="holds 3 token"):
        model(ids(1, 1), use_cache=True, kv_caches=cache, cache_index=2)  # overwriting is refused too


@pytest.mark.parametrize("variant", VARIANTS, ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("batch", [1, 3])
def test_allocated_bytes_equal_formula(variant, cache_dtype, batch):
    cfg = dantinox.ModelConfig.preset("test", cache_dtype=cache_dtype, **variant)
    cache = dantinox.init_cache(cfg, batch)
    assert cache.nbytes == dantinox.kv_cache_bytes(cfg, batch, cfg.max_context)
    for length in (1, 17):
        formula = dantinox.kv_cache_bytes(cfg, batch, length)
        assert dantinox.init_cache(cfg, batch, length).nbytes == formula
        assert dantinox.cache_shapes(cfg, batch, length).nbytes == formula
    layer = cache.layers[0]
    assert layer.k.shape == (batch, cfg.n_kv_heads, cfg.head_size, cfg.max_context)  # keys slot-last
    assert layer.v.shape == (batch, cfg.n_kv_heads, cfg.max_context, cfg.head_size)
    assert layer.k.dtype == jnp.dtype(cache_dtype)


@pytest.mark.parametrize("layout", [dict(cache_dtype="int8"), dict(cache_dtype="fp8_e4m3", kv_heads=2),
                                    dict(sliding_windows=(8, 8)), dict(sliding_windows=(8, None)),
                                    dict(sliding_windows=(5, 3), kv_heads=1),
                                    dict(attention="latent", kv_latent_dim=16, rope_head_dim=8),
                                    dict(sliding_windows=(8, None), cache_dtype="int8"),
                                    dict(attention_chunks=(8, None)),
                                    dict(attention="latent", kv_latent_dim=16, rope_head_dim=8, cache_dtype="int8")],
                         ids=["int8", "fp8-gqa", "window-local", "window-1:1", "windows-5-3-mqa", "mla", "window-int8",
                              "chunked", "mla-int8"])
def test_every_layout_allocates_what_kv_cache_bytes_says(layout):
    cfg = dantinox.ModelConfig.preset("test", **layout)
    for batch, length in ((1, 3), (2, 8), (3, 17)):  # below, at and past the window
        assert dantinox.init_cache(cfg, batch, length).nbytes == \
            dantinox.kv_cache_bytes(cfg, batch, length), (batch, length)


@pytest.mark.parametrize("kv_heads", [1, 2, 4, 8])
def test_reference_formula_by_hand(kv_heads):
    cfg = dantinox.ModelConfig.preset("reference", kv_heads=kv_heads, cache_dtype="bfloat16")
    # L * 2 * B * T * K * H * bytes with L=12, H=32, bf16
    assert dantinox.kv_cache_bytes(cfg, 4, 512) == 12 * 2 * 4 * 512 * kv_heads * 32 * 2


def test_reference_mha_is_six_mib_not_the_copied_0_375_mb():
    cfg = dantinox.ModelConfig.preset("reference", cache_dtype="bfloat16")
    assert dantinox.kv_cache_bytes(cfg, 1, 512) == 6 * 2**20
    assert dantinox.cache_shapes(cfg, 1, 512).nbytes == 6 * 2**20


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
    with pytest.raises(ValueError, match="needs 65 slots, but the cache holds 64"):
        model(ids(1, 65), use_cache=True, kv_caches=cache)
    _, full, _ = model(ids(1, 62), use_cache=True, kv_caches=cache)
    with pytest.raises(ValueError, match="needs 65 slots"):
        model(ids(1, 3), use_cache=True, kv_caches=full)
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
    model(ids(1, 2), use_cache=True, kv_caches=other, cache_index=0)  # a bfloat16 cache: the model decodes with it
    with pytest.raises(ValueError, match="dtype float32"):  # bfloat16 arrays in a cache that says float32
        model(ids(1, 2), use_cache=True, kv_caches=other._replace(config=cfg.cache), cache_index=0)
    short = dantinox.init_cache(cfg, 1)
    with pytest.raises(ValueError, match="kv_caches: expected 2 layers, got 1"):
        model(ids(1, 2), use_cache=True, kv_caches=short._replace(layers=short.layers[:1]))
    with pytest.raises(ValueError, match="expected a dantinox.KVCache"):
        model(ids(1, 2), use_cache=True, kv_caches=short.layers)


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
    assert cache.layers[0].k.dtype == jnp.bfloat16
    np.testing.assert_allclose(logits, full, atol=0.1)


def test_only_batch_one_decode_programs_get_the_512_bit_vector_option_on_cpu(native):
    """generate and the roofline timing compile a batch-1 decode loop with VECTOR_512, any other batch with the
    defaults (benchmarks/decode.py measures both sides)."""
    from dantinox.backend.xla_cpu import VECTOR_512
    from dantinox.generation.generate import compiler_options

    assert jax.default_backend() == "cpu"
    assert compiler_options(1) == VECTOR_512 and compiler_options(2) is None and compiler_options(8) is None
    assert decode_program(1, donate=True) is not decode_program(2, donate=True)
    assert decode_program(2, donate=True) is decode_program(8, donate=True)


RAGGED_LAYOUTS = [dict(), dict(kv_heads=2, cache_layout="paged", page_size=5),
                  dict(sliding_windows=(4, None)), dict(cache_dtype="int8"),
                  dict(attention="latent", kv_latent_dim=16, rope_head_dim=4)]


@pytest.mark.both_backends
@pytest.mark.parametrize("layout", RAGGED_LAYOUTS, ids=["mha", "paged", "ring", "int8", "mla"])
def test_ragged_prompts_each_get_the_tokens_they_get_alone(layout):
    _, model = make(**layout)
    prompts = [ids(1, n, seed=n)[0].tolist() for n in (3, 9, 6)]
    together = dantinox.generate(model, prompts, 25)
    alone = [np.asarray(dantinox.generate(model, [p], 25))[0].tolist() for p in prompts]
    assert together == alone and [len(row) for row in together] == [28, 34, 31]
    if not layout:
        assert dantinox.generate(model, prompts, 25, use_cache=False) == alone


def test_rows_stop_at_their_eos():
    _, model = make()
    prompts = [ids(1, n, seed=10 + n)[0].tolist() for n in (4, 7)]
    alone = [np.asarray(dantinox.generate(model, [p], 30))[0] for p in prompts]
    eos = int(alone[0][4 + 5])  # the sixth token row 0 generates
    rows = dantinox.generate(model, prompts, 30, eos_id=eos)
    for row, full, n in zip(rows, alone, (4, 7), strict=True):
        hits = np.flatnonzero(full[n:] == eos)
        stop = n + (hits[0] + 1 if hits.size else 30)
        assert row == full[:stop].tolist()  # everything up to and including the first eos, then nothing
    assert rows[0][-1] == eos and len(rows[0]) <= 4 + 6
    square = np.asarray(dantinox.generate(model, np.asarray([prompts[0]]), 30, eos_id=eos))
    assert square.shape == (1, 34) and (square[0, len(rows[0]):] == eos).all()


def test_ragged_prompt_errors_name_the_argument():
    _, model = make()
    with pytest.raises(ValueError, match="prompt_ids: every prompt needs at least one token"):
        dantinox.generate(model, [[1, 2], []], 3)
    with pytest.raises(ValueError, match="stream decodes prompts of one length"):
        next(dantinox.stream(model, [[1, 2], [3]], 3))
    with pytest.raises(ValueError, match=r"eos_id: expected None or a token id in \[0, 259\)"):
        dantinox.generate(model, [[1, 2]], 3, eos_id=300)
