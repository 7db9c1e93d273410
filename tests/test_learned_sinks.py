"""gpt-oss's learned attention sinks: one logit per query head in the softmax's denominator, nothing cached.

The rule (the gpt-oss model card, arXiv:2508.10925; its reference `sdpa` in
https://github.com/openai/gpt-oss/blob/main/gpt_oss/torch/model.py; transformers' `eager_attention_forward` in
https://github.com/huggingface/transformers/blob/main/src/transformers/models/gpt_oss/modeling_gpt_oss.py): the
sink logit is appended to each row of scaled, masked scores, the softmax runs over the row, and the sink's
column is dropped, so the weights over real keys are exp(s_j) / (exp(sink) + sum_i exp(s_i)).
"""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

import dantinox
from dantinox import ops
from dantinox.architectures.attention import attend
from dantinox.architectures.config import LayerSpec, ModelConfig

plain_attend = attend.__wrapped__  # the reference einsum path, whatever backend is installed


def _inputs(B=2, T=3, K=2, G=2, H=8, S=6, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, T, K, G, H)).astype(np.float32)
    k = rng.normal(size=(B, K, H, S)).astype(np.float32)
    v = rng.normal(size=(B, K, S, H)).astype(np.float32)
    mask = np.tril(np.ones((T, S), bool), k=S - T)[None].repeat(B, 0)  # causal: the last T of S are new
    mask[-1, :, 0] = False  # a slot one sequence does not see
    sinks = rng.normal(size=(K, G)).astype(np.float32) * 2
    return q, k, v, mask, sinks


def _numpy_sinks(q, k, v, mask, sinks):
    """float64, written from the rule: scores, masked; weights exp(s) / (exp(sink) + sum exp(s))."""
    scores = np.einsum("btkgh,bkhs->bkgts", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(q.shape[-1])
    e = np.where(mask[:, None, None], np.exp(scores), 0.0)
    weights = e / (np.exp(sinks.astype(np.float64))[None, :, :, None, None] + e.sum(-1, keepdims=True))
    return np.einsum("bkgts,bksh->btkgh", weights, v.astype(np.float64)), weights


def test_attend_with_sinks_equals_a_numpy_softmax_with_the_extra_denominator_term():
    q, k, v, mask, sinks = _inputs()
    want, weights = _numpy_sinks(q, k, v, mask, sinks)
    out, got_weights = plain_attend(q, k, v, mask, sink_logits_KG=sinks, with_weights=True)
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(got_weights), weights, rtol=1e-5, atol=1e-7)
    assert np.all(np.asarray(got_weights).sum(-1) < 1)  # the sink takes its share: less than 1 on real keys
    # the sink belongs to its query head: K groups of G, in the queries' order (gpt-oss reshapes its N sinks so)
    moved = sinks.copy()
    moved[1, 0] += 3.0
    changed = np.asarray(plain_attend(q, k, v, mask, sink_logits_KG=moved)) != np.asarray(out)
    assert changed[:, :, 1, 0].all() and not changed[:, :, 0].any() and not changed[:, :, 1, 1].any()


def test_a_sink_of_minus_infinity_is_no_sink_exactly_and_a_large_one_shrinks_the_output_to_zero():
    q, k, v, mask, sinks = _inputs()
    plain = np.asarray(plain_attend(q, k, v, mask))
    none = np.full_like(sinks, -np.inf)
    np.testing.assert_array_equal(np.asarray(plain_attend(q, k, v, mask, sink_logits_KG=none)), plain)
    big = np.asarray(plain_attend(q, k, v, mask, sink_logits_KG=np.full_like(sinks, 60.0)))
    assert np.abs(big).max() < 1e-12 * np.abs(plain).max() and np.all(np.isfinite(big))
    middle = np.asarray(plain_attend(q, k, v, mask, sink_logits_KG=np.full_like(sinks, 2.0)))
    assert 0 < np.abs(middle).max() < np.abs(plain).max()


def test_the_speed_layer_routes_sink_layers_to_the_reference_path():
    """One rule in one place (dantinox/backend/cpu.py, CPU.attend): a call with sink logits is declined, so
    the einsum path computes it, even for a one-token decode the kernel would otherwise take."""
    q, k, v, mask, sinks = _inputs(B=1, T=1, S=5)
    arguments = dict(q_BTKGH=q, k_BKHS=k, v_BKSH=v, mask_BTS=mask, scale=None, k_scale_BKS=None,
                     v_scale_BKS=None, sink_q_BTKGH=None, sink_BS=None, with_weights=False, keys_slot_last=True,
                     scale_layout=None)
    assert ops.current().attend(**arguments, sink_logits_KG=sinks) is None
    np.testing.assert_array_equal(np.asarray(attend(q, k, v, mask, sink_logits_KG=sinks)),
                                  np.asarray(plain_attend(q, k, v, mask, sink_logits_KG=sinks)))


SINK_LAYERS = (LayerSpec("sliding", 4, learned_sinks=True), LayerSpec(learned_sinks=True))


def test_a_sink_model_decodes_step_by_step_as_its_full_forward_and_caches_the_same_bytes():
    cfg = ModelConfig.preset("test", kv_heads=2, layer_specs=SINK_LAYERS)  # a ring of 4 beside a full layer
    model = dantinox.Transformer(cfg, rngs=nnx.Rngs(0))
    assert model.blocks[0].attn.sinks[...].shape == (cfg.n_heads,)
    ids = (np.arange(9)[None] * 5 + 3) % 50
    full = np.asarray(model(ids)[0])
    cache = dantinox.init_cache(cfg, 1, 16)
    steps = []
    for t in range(9):  # one token at a time (one compiled step), past the ring's 4 slots
        logits, cache, _ = model(ids[:, t:t + 1], use_cache=True, kv_caches=cache)
        steps.append(logits)
    np.testing.assert_allclose(np.concatenate(steps, 1), full, rtol=1e-4, atol=1e-5)
    plain = cfg.replace(layer_specs=(LayerSpec("sliding", 4), LayerSpec()))
    assert cache.nbytes == dantinox.init_cache(plain, 1, 16).nbytes == dantinox.kv_cache_bytes(plain, 1, 16)
    for block in model.blocks:  # the sinks are read: at -inf (plain attention) the logits move
        block.attn.sinks[...] = np.full((cfg.n_heads,), -np.inf, np.float32)
    assert np.abs(np.asarray(model(ids)[0]) - full).max() > 1e-3


@pytest.mark.parametrize(("fields", "spec", "expected"), [
    (dict(attention="latent", kv_latent_dim=16, rope_head_dim=8), LayerSpec(learned_sinks=True),
     "got attention='latent'"),
    (dict(), LayerSpec("state", learned_sinks=True), "got kind='state'"),
    (dict(), LayerSpec(learned_sinks=1), "expected True or False"),
])
def test_sinks_outside_a_heads_attention_are_refused_in_one_line(fields, spec, expected):
    with pytest.raises(ValueError) as excinfo:
        ModelConfig.preset("test", layer_specs=(LayerSpec(), spec), **fields)
    message = str(excinfo.value)
    assert "\n" not in message and message.startswith("layer_specs[1].learned_sinks: ") and expected in message
