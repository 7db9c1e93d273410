"""The 'state' layer kind: Gated DeltaNet, whose cache is a recurrent state of constant size
(dantinox/cache/state.py, GatedDeltaNet in dantinox/architectures/model.py). Checked against a numpy loop
written from the paper's recurrence, against decoding without a cache, across chunks and ragged rows, in
bytes (constant in T, equal to the formula) and in its one-line refusals."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from invariants import token_ids

import dantinox
from dantinox import LayerSpec
from dantinox.accounting.memory import kv_read_bytes
from dantinox.cache.state import StateCache, state_bytes

HYBRID = (LayerSpec("state", value_heads=4), LayerSpec(), LayerSpec("state"), LayerSpec("sliding", 6))


def hybrid_cfg(specs=HYBRID, **kw):
    kw = {"kv_heads": 2, **kw}
    return dantinox.ModelConfig.preset("test", **kw).replace(n_layers=len(specs), layer_specs=specs)


def np_gated_delta(layer, x_TD):
    """One GatedDeltaNet layer in numpy, token by token from its parameters (float64)."""
    spec = layer.layer
    K, V, H, W = spec.kv_heads, spec.value_heads, spec.head_size, spec.conv
    P = lambda a: np.asarray(a[...], np.float64)  # noqa: E731
    T = x_TD.shape[0]
    qkvz = x_TD @ P(layer.in_proj.kernel)
    C = (2 * K + V) * H
    qkv, z = qkvz[:, :C], qkvz[:, C:].reshape(T, V, H)
    gates = x_TD @ P(layer.gates.kernel)  # β per value head, then its decay input: 1 per head or H per channel
    b, a = gates[:, :V], gates[:, V:].reshape(T, V, H if spec.decay == "channel" else 1)
    padded = np.concatenate([np.zeros((W - 1, C)), qkv])
    conv = np.stack([(padded[t:t + W] * P(layer.conv).T).sum(0) for t in range(T)])
    conv = conv / (1 + np.exp(-conv))
    S = np.zeros((V, H, H))
    out = np.zeros((T, V, H))
    for t in range(T):
        q, k, v = conv[t, :K * H].reshape(K, H), conv[t, K * H:2 * K * H].reshape(K, H), conv[t, 2 * K * H:]
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) / np.sqrt(H)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
        for h in range(V):  # value head h reads key head h // G
            kh, qh, vh = k[h // (V // K)], q[h // (V // K)], v.reshape(V, H)[h]
            gate = np.exp(-np.exp(P(layer.a_log)[h]) * np.log1p(np.exp(a[t, h] + P(layer.dt_bias)[h])))
            beta = 1 / (1 + np.exp(-b[t, h]))
            S[h] = gate[:, None] * S[h]  # Diag(α_t) S: key channel i (row i) decays by α_t[i] (one α per head)
            S[h] = S[h] + np.outer(kh, beta * (vh - S[h].T @ kh))
            out[t, h] = S[h].T @ qh
    o = out / np.sqrt((out * out).mean(-1, keepdims=True) + layer.cfg.norm_eps) * P(layer.norm.scale)
    o = o * (z / (1 + np.exp(-z)))
    return o.reshape(T, V * H) @ P(layer.out.kernel)


@pytest.mark.parametrize("decay", ["head", "channel"])
def test_a_state_layer_computes_the_gated_delta_rule(decay):
    """Gated DeltaNet (one decay per value head) and Kimi Delta Attention (one per key channel, arXiv:2510.26692:
    S_t = (I - β_t k_t k_tᵀ) Diag(α_t) S_{t-1} + β_t k_t v_tᵀ) against the numpy loop."""
    specs = (LayerSpec("state", value_heads=4, decay=decay), *HYBRID[1:])
    model = dantinox.Transformer(hybrid_cfg(specs), rngs=nnx.Rngs(0))
    layer = model.blocks[0].attn
    assert layer.dt_bias.shape == (4, 8 if decay == "channel" else 1)  # V heads x (H channels or one)
    x = np.random.default_rng(0).standard_normal((2, 9, model.cfg.d_model)).astype(np.float32)
    got, _, _ = layer(jnp.asarray(x), jnp.broadcast_to(jnp.arange(9), (2, 9)))
    for b in range(2):
        np.testing.assert_allclose(np.asarray(got[b]), np_gated_delta(layer, x[b].astype(np.float64)),
                                   atol=2e-4, rtol=2e-4)


KIMI = (LayerSpec("state", kv_heads=2, head_size=8, decay="channel"), LayerSpec(),
        LayerSpec("state", kv_heads=2, head_size=8, value_heads=4, decay="channel"), LayerSpec())


def test_kimi_delta_attention_beside_mla_prefills_then_steps_as_one_forward():
    """Kimi Linear's pattern: Kimi Delta Attention 'state' layers (their own K and H) beside MLA latent layers in
    one model. Prefill then one-token steps equal the full forward; each layer's cache is its own payload
    (a state constant in T, a latent growing with it) and the bytes equal the formula."""
    cfg = hybrid_cfg(KIMI, attention="latent", kv_heads=None, kv_latent_dim=16, rope_head_dim=4)
    model = dantinox.Transformer(cfg, rngs=nnx.Rngs(2))
    x = token_ids(2, 9)
    full = np.asarray(model(jnp.asarray(x))[0])
    cache = dantinox.init_cache(cfg, 2, 16)
    logits, cache, _ = model(jnp.asarray(x[:, :5]), use_cache=True, kv_caches=cache)
    np.testing.assert_allclose(np.asarray(logits), full[:, :5], atol=2e-4, rtol=2e-4)
    for t in range(5, 9):
        logits, cache, _ = model(jnp.asarray(x[:, t:t + 1]), use_cache=True, kv_caches=cache)
        np.testing.assert_allclose(np.asarray(logits), full[:, t:t + 1], atol=2e-4, rtol=2e-4)
    assert [type(p).__name__ for p in cache.layers] == ["StateCache", "LatentCache"] * 2
    assert cache.layers[2].s.shape == (2, 4, 8, 8) and cache.layers[1].ckv.shape[-2:] == (16, 16 + 4)
    assert cache.nbytes == dantinox.kv_cache_bytes(cfg, 2, 16)  # measured == the formula


def test_the_state_carries_across_calls_and_ragged_rows():
    cfg = hybrid_cfg()
    model = dantinox.Transformer(cfg, rngs=nnx.Rngs(1))
    x = token_ids(2, 14)
    full = np.asarray(model(jnp.asarray(x))[0])
    cache = dantinox.init_cache(cfg, 2, 32)
    at = 0
    for n in (5, 1, 3, 1, 4):  # chunks: the state and the convolution's window go from one call to the next
        logits, cache, _ = model(jnp.asarray(x[:, at:at + n]), use_cache=True, kv_caches=cache)
        np.testing.assert_allclose(np.asarray(logits), full[:, at:at + n], atol=2e-4, rtol=2e-4)
        at += n
    prompts = [x[0, :7], x[1, :3]]  # ragged: the short row's padding neither moves its state nor its window
    both = dantinox.generate(model, prompts, 8)
    for row, prompt in zip(both, prompts, strict=True):
        np.testing.assert_array_equal(np.asarray(row), np.asarray(dantinox.generate(model, prompt[None], 8))[0])
    greedy = np.asarray(dantinox.generate(model, x[:, :4], 16))  # the chunks above checked it against no cache
    paged = dantinox.generate(model, x[:, :4], 16, cache_layout="paged", page_size=4)
    np.testing.assert_array_equal(greedy, np.asarray(paged))


def test_a_state_is_the_same_bytes_at_any_length():
    cfg = hybrid_cfg(dtype="bfloat16")
    spec = cfg.layers[0]
    assert state_bytes(cfg, spec) == 4 * 8 * 8 * 4 + (2 * 2 + 4) * 8 * 4 * 2  # V·H·H float32 + C·conv bf16
    sizes = []
    for T in (8, 64):
        cache = dantinox.init_cache(cfg, 3, T)
        assert type(cache.layers[0]) is StateCache and cache.layers[0].s.dtype == jnp.float32
        assert cache.nbytes == dantinox.kv_cache_bytes(cfg, 3, T)  # measured == the formula
        sizes.append([dantinox.tree_nbytes(layer) for layer in cache.layers])
    assert sizes[0][0] == sizes[1][0] == 3 * state_bytes(cfg, spec) and sizes[0][2] == sizes[1][2]
    assert sizes[1][1] == 8 * sizes[0][1]  # the full layer grows with T, the states do not
    assert kv_read_bytes(cfg, 3, 64) == dantinox.kv_cache_bytes(cfg, 3, 64)  # each state read once per step


def test_the_engine_serves_a_hybrid_without_prefix_caching():
    model = dantinox.Transformer(hybrid_cfg(), rngs=nnx.Rngs(0))
    prompts = [np.asarray(token_ids(1, 9, seed=3)[0]), np.asarray(token_ids(1, 4, seed=4)[0])]
    engine = dantinox.Engine(model, num_pages=32, page_size=4, prefix_caching=False, chunk_tokens=3, max_seqs=2)
    rids = [engine.add(p, 6) for p in prompts]
    out = engine.run()
    for rid, prompt in zip(rids, prompts, strict=True):
        assert list(out[rid]) == np.asarray(dantinox.generate(model, prompt[None], 6))[0, len(prompt):].tolist()
    with pytest.raises(ValueError, match=r"^prefix_caching: layer 0 keeps a recurrent state"):
        dantinox.Engine(model, num_pages=32)


@pytest.mark.parametrize("specs, kw, field", [
    ((LayerSpec("state", value_heads=3), LayerSpec()), {}, "layer_specs[0].value_heads"),
    ((LayerSpec("state", 8), LayerSpec()), {}, "layer_specs[0].window"),
    ((LayerSpec(), LayerSpec(value_heads=4)), {}, "layer_specs[1].value_heads"),
    ((LayerSpec("state"), LayerSpec("shared", source=0)), {}, "layer_specs[1].source"),
    ((LayerSpec("conv"), LayerSpec()), {"attention": "latent", "kv_heads": None, "kv_latent_dim": 16,
                                         "rope_head_dim": 4}, "layer_specs[0].kind"),
    ((LayerSpec("state", decay="row"), LayerSpec()), {}, "layer_specs[0].decay"),
    ((LayerSpec("mamba", decay="channel"), LayerSpec()), {}, "layer_specs[0].decay"),
    ((LayerSpec(decay="channel"), LayerSpec()), {}, "layer_specs[0].value_heads"),
    ((LayerSpec("state"), LayerSpec()), {"eviction": "h2o", "cache_budget": 8}, "layer_specs"),
])
def test_a_state_layer_it_cannot_build_is_refused_in_one_line(specs, kw, field):
    with pytest.raises(ValueError) as excinfo:
        hybrid_cfg(specs, **kw)
    message = str(excinfo.value)
    assert message.startswith(field + ":") and "\n" not in message, message
