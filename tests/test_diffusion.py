"""Masked diffusion: the training loss, block-wise generation and its three cache modes (test preset, CPU)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from invariants import count_compiles

import dantinox
from dantinox.architectures.tokenizer import MASK, encode
from dantinox.generation import diffusion

TEXT = "the cat sat on the mat. the dog sat on the log. the cat saw the dog. " * 4
PROMPT = np.array([encode("the cat "), encode("the dog ")], np.int32)


def make(**kw):
    cfg = dantinox.ModelConfig.preset("test", paradigm="diffusion", **kw)
    return cfg, dantinox.Transformer(cfg, rngs=nnx.Rngs(0))


def windows(length, count, seed=0):
    data = np.array(encode(TEXT), np.int32)
    starts = np.random.RandomState(seed).randint(0, len(data) - length, count)
    return jnp.asarray(np.stack([data[s:s + length] for s in starts]))


def train(model, steps, batch, lr=1e-2):
    opt = nnx.Optimizer(model, optax.adam(lr), wrt=nnx.Param)

    @nnx.jit
    def step(model, opt, batch, rng):
        loss, grads = nnx.value_and_grad(diffusion.masked_diffusion_loss)(model, batch, rng)
        opt.update(model, grads)
        return loss

    key = jax.random.key(1)
    for _ in range(steps):
        key, sub = jax.random.split(key)
        step(model, opt, batch, sub)


@pytest.fixture(scope="module")
def model():
    """A test-size model trained briefly, so its predictions depend on context (a random one repeats a token)."""
    _, m = make()
    train(m, 80, windows(48, 16))
    return m


def test_loss_is_finite_and_decreases():
    _, m = make()
    batch, probe = windows(32, 4), jax.random.key(7)  # same masks before and after: the drop is the model's
    loss = nnx.jit(diffusion.masked_diffusion_loss)  # one program, not each operation on its own
    before = float(loss(m, batch, probe))
    train(m, 15, batch)
    after = float(loss(m, batch, probe))
    assert np.isfinite(before) and np.isfinite(after)
    assert after < 0.8 * before


def test_loss_refuses_an_autoregressive_model():
    cfg = dantinox.ModelConfig.preset("test")
    with pytest.raises(ValueError, match="paradigm='diffusion'|paradigm="):
        diffusion.masked_diffusion_loss(dantinox.Transformer(cfg, rngs=nnx.Rngs(0)), windows(8, 1),
                                        jax.random.key(0))


@pytest.mark.parametrize("cache", diffusion.CACHE_MODES)
def test_steps_decode_at_least_one_token_and_leave_no_mask(model, cache):
    r = diffusion.diffusion_generate(model, PROMPT, 24, block_size=8, threshold=0.6, cache_mode=cache)
    assert r.tokens.shape == (2, 32)
    np.testing.assert_array_equal(r.tokens[:, :8], PROMPT)
    assert not (r.tokens == MASK).any()
    assert (r.unmasked_at >= 0).all() and (r.unmasked_at < r.nfe).all()
    per_step = np.stack([(r.unmasked_at == k).sum(axis=1) for k in range(r.nfe)])  # [nfe, B]
    assert (per_step.sum(axis=1) >= 1).all()  # every evaluation decodes something
    # a sequence decodes a position only inside the block of that step, and blocks go left to right
    block_of_position = np.arange(24) // 8
    np.testing.assert_array_equal(r.step_block[r.unmasked_at], np.broadcast_to(block_of_position, (2, 24)))
    assert (np.diff(r.step_block) >= 0).all()


@pytest.mark.parametrize("cache", diffusion.CACHE_MODES)
def test_nfe_counts_every_model_evaluation(model, cache):
    r = diffusion.diffusion_generate(model, PROMPT[:1], 24, block_size=8, threshold=0.5, cache_mode=cache)
    assert r.nfe == len(r.step_block) == len(r.computed_tokens) == r.steps_per_block.sum()
    assert r.nfe == len(np.unique(r.unmasked_at))  # one token per step at least, so each step shows up
    assert 3 <= r.nfe <= 24
    one_per_step = diffusion.diffusion_generate(model, PROMPT[:1], 24, block_size=8, threshold=1.0, cache_mode=cache)
    assert one_per_step.nfe == 24  # a probability never exceeds 1: only the forced token per step
    one_step_per_block = diffusion.diffusion_generate(model, PROMPT[:1], 24, block_size=8, threshold=1e-6,
                                                      cache_mode=cache)
    assert one_step_per_block.nfe == 3


def test_parallel_decoding_saves_evaluations(model):
    strict = diffusion.diffusion_generate(model, PROMPT, 24, block_size=8, threshold=1.0, cache_mode="none")
    # a briefly trained model is rarely sure of a byte; 0.05 is still 13x the uniform 1/259
    loose = diffusion.diffusion_generate(model, PROMPT, 24, block_size=8, threshold=0.05, cache_mode="none")
    assert loose.nfe < strict.nfe


@pytest.mark.parametrize("kw", [dict(gen_length=8, block_size=1, threshold=0.9),
                                dict(gen_length=24, block_size=8, threshold=1e-6)],
                         ids=["block_of_one", "one_step_per_block"])
def test_cached_modes_equal_none_when_every_step_refreshes(model, kw):
    """Every step is a block's first step, a full forward that also refreshes the cache: nothing is stale."""
    runs = {c: diffusion.diffusion_generate(model, PROMPT, cache_mode=c, **kw) for c in diffusion.CACHE_MODES}
    for cache in ("prefix", "dual"):
        np.testing.assert_array_equal(runs[cache].tokens, runs["none"].tokens)
        np.testing.assert_array_equal(runs[cache].unmasked_at, runs["none"].unmasked_at)
        assert runs[cache].nfe == runs["none"].nfe == kw["gen_length"] // kw["block_size"]
    assert len(np.unique(runs["none"].tokens[:, 8:])) > 2  # the trained model does not repeat one token


@pytest.mark.parametrize("cache", ["prefix", "dual"])
@pytest.mark.parametrize("variant", [dict(), dict(kv_heads=2),
                                     dict(kv_heads=1, cache_dtype="bfloat16")],
                         ids=["mha", "gqa", "mqa-bf16"])
def test_cached_step_on_an_unchanged_sequence_matches_full_forward(variant, cache):
    """With a fresh cache, a step's logits equal the full forward's: the cache only goes stale as tokens change."""
    cfg, m = make(**variant)
    tokens = np.concatenate([PROMPT, np.full((2, 24), MASK, np.int32)], axis=1)
    tokens[:, 8:14] = np.array(encode("sat on"))  # first block decoded, second block partly decoded
    tokens[0, 17] = ord("x")
    full, _, _ = m(tokens, use_cache=True)  # the cached forward: K/V rounded to cache_dtype, like the cache
    kv = diffusion.build_cache(m, tokens, block_start=16, block_size=8, cache_mode=cache)
    span = diffusion.span_logits(m, tokens, kv)
    assert span.shape == (2, 8 if cache == "dual" else 16, cfg.vocab_size)
    np.testing.assert_allclose(span, full[:, 16:16 + span.shape[1]], atol=2e-5, rtol=2e-5)


def test_stale_cache_changes_logits(model):
    """The approximation: after the block decodes a token, a cache built before it no longer matches."""
    tokens = np.concatenate([PROMPT, np.full((2, 24), MASK, np.int32)], axis=1)
    kv = diffusion.build_cache(model, tokens, block_start=8, block_size=8, cache_mode="dual")
    tokens[:, 9] = ord("a")
    full, _, _ = model(tokens)
    stale = diffusion.span_logits(model, tokens, kv)
    assert float(jnp.abs(stale - full[:, 8:16]).max()) > 1e-3


def test_derived_cache_bytes_match_the_arrays(model):
    cfg = model.cfg
    P, gen, bs = 8, 24, 8
    for cache in ("prefix", "dual"):
        r = diffusion.diffusion_generate(model, PROMPT, gen, block_size=bs, threshold=0.7, cache_mode=cache)
        tokens = r.tokens.copy()
        for block in range(gen // bs):
            kv = diffusion.build_cache(model, tokens, P + block * bs, bs, cache)
            steps = r.step_block == block
            assert (r.prefix_bytes[steps] == dantinox.tree_nbytes(kv.prefix_kvs)).all()
            assert (r.suffix_bytes[steps] == dantinox.tree_nbytes(kv.suffix_kvs)).all()
        prefix_slots, suffix_slots = diffusion.cache_slots(cache, P, gen, bs)
        assert r.allocated_bytes == dantinox.kv_cache_bytes(cfg, 2, prefix_slots + suffix_slots)
        assert r.ar_static_bytes == dantinox.kv_cache_bytes(cfg, 2, P + gen)
    # DualCache: the prefix grows by a block as the suffix shrinks by one, so it always holds T - block tokens
    assert (r.cache_bytes == dantinox.kv_cache_bytes(cfg, 2, P + gen - bs)).all()
    assert r.peak_cache_bytes < r.ar_static_bytes


def test_one_compile_serves_every_threshold(model):
    diffusion.diffusion_generate(model, PROMPT, 16, block_size=8, threshold=0.9, cache_mode="dual")
    with count_compiles() as compiled:
        for threshold in (0.3, 0.6, 1.0):
            diffusion.diffusion_generate(model, PROMPT, 16, block_size=8, threshold=threshold, cache_mode="dual")
    assert compiled == []


@pytest.mark.parametrize("kw, message", [
    (dict(gen_length=64), "gen_length: prompt \\(8\\) \\+ gen_length \\(64\\) = 72 exceeds max_context=64"),
    (dict(gen_length=20), "gen_length: expected a multiple of block_size \\(8\\), got 20"),
    (dict(gen_length=0), "gen_length: expected a positive integer"),
    (dict(block_size=0), "block_size: expected a positive integer"),
    (dict(cache_mode="full"), "cache_mode: expected one of none, prefix, dual, got 'full'"),
    (dict(threshold=0.0), "threshold: expected a number in \\(0, 1\\], got 0.0"),
    (dict(threshold=1.5), "threshold: expected a number in \\(0, 1\\], got 1.5"),
    (dict(threshold=True), "threshold: expected a number in \\(0, 1\\]"),
    (dict(prompt_ids=[[1, MASK]]), "prompt_ids: must not contain the MASK token"),
    (dict(prompt_ids=[[1, 300]]), "prompt_ids: token ids must lie in"),
])
def test_bad_arguments_raise_one_line_errors(model, kw, message):
    args = dict(prompt_ids=PROMPT, gen_length=16, block_size=8, threshold=0.9, cache_mode="dual") | kw
    with pytest.raises(ValueError, match=message) as err:
        diffusion.diffusion_generate(model, **args)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("path", ["absorbed", "materialized"])
def test_mla_decodes_in_every_cache_mode(path):
    cfg, m = make(attention="latent", kv_latent_dim=16, rope_head_dim=8, mla_decode=path)
    kw = dict(gen_length=8, block_size=4, threshold=1e-6)  # every step refreshes: all modes agree exactly
    runs = {c: diffusion.diffusion_generate(m, PROMPT, cache_mode=c, **kw) for c in diffusion.CACHE_MODES}
    for mode in ("prefix", "dual"):
        np.testing.assert_array_equal(runs[mode].tokens, runs["none"].tokens)
    assert not (runs["dual"].tokens == MASK).any()
    P, T = PROMPT.shape[1], PROMPT.shape[1] + 8
    assert runs["dual"].allocated_bytes == dantinox.kv_cache_bytes(cfg, 2, (T - 4) + (8 - 4))  # latent rows
    tokens = np.concatenate([PROMPT, np.full((2, 8), MASK, np.int32)], axis=1)
    full, _, _ = m(tokens, use_cache=True)
    for mode in ("prefix", "dual"):
        kv = diffusion.build_cache(m, tokens, block_start=P, block_size=4, cache_mode=mode)
        assert isinstance(kv.prefix_kvs[0], dantinox.LatentCache)
        span = diffusion.span_logits(m, tokens, kv)
        np.testing.assert_allclose(span, full[:, P:P + span.shape[1]], atol=2e-5, rtol=2e-5)


def test_generation_refuses_an_autoregressive_model():
    cfg = dantinox.ModelConfig.preset("test")
    with pytest.raises(ValueError, match="model: diffusion decoding needs paradigm='diffusion'"):
        diffusion.diffusion_generate(dantinox.Transformer(cfg, rngs=nnx.Rngs(0)), PROMPT, 8, block_size=8)
