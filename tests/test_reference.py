"""Independent references: attention and the whole model re-implemented in numpy, K/V repeated G times."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from invariants import token_ids

import dantinox
from dantinox.architectures.attention import attend

VARIANTS = [dict(), dict(kv_heads=2), dict(kv_heads=1)]


def make(**kw):
    cfg = dantinox.ModelConfig.preset("test", **kw)
    return cfg, dantinox.Transformer(cfg, rngs=nnx.Rngs(0))


ids = token_ids


def np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_attention(q_TNH, k_SKH, v_SKH, causal, q_pos_T=None, kv_len=None):
    """softmax(Q K^T / sqrt(H)) V for one sequence, every KV head repeated for its G query heads."""
    G = q_TNH.shape[1] // k_SKH.shape[1]
    k, v = np.repeat(k_SKH, G, axis=1), np.repeat(v_SKH, G, axis=1)
    scores = np.einsum("tnh,snh->nts", q_TNH, k) / np.sqrt(q_TNH.shape[-1])
    S = k.shape[0]
    q_pos_T = np.arange(q_TNH.shape[0]) if q_pos_T is None else q_pos_T
    visible = np.arange(S)[None, :] < (S if kv_len is None else kv_len)
    if causal:
        visible = visible & (np.arange(S)[None, :] <= q_pos_T[:, None])
    scores = np.where(visible[None], scores, -np.inf)
    return np.einsum("nts,snh->tnh", np_softmax(scores), v)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("B, T, K, G", [(2, 3, 2, 3), (2, 1, 2, 3), (2, 1, 2, 1), (2, 1, 1, 3), (1, 1, 2, 3)])
def test_attend_matches_a_numpy_reference(causal, B, T, K, G):
    """(2, 1, 2, 3) is a batch decoding GQA, which takes attend's one-token arrangement; the others do not."""
    rs = np.random.RandomState(0)
    S, H = 7, 4
    q_BTKGH = rs.randn(B, T, K, G, H).astype(np.float32)
    k_BKSH, v_BKSH = rs.randn(2, B, K, S, H).astype(np.float32)
    q_pos_T, kv_len = np.arange(6 - T, 6), 6  # T new tokens after 6 - T cached; slot 6 is unfilled
    visible_TS = np.arange(S)[None, :] < kv_len
    if causal:
        visible_TS = visible_TS & (np.arange(S)[None, :] <= q_pos_T[:, None])
    got = attend(q_BTKGH, k_BKSH.transpose(0, 1, 3, 2), v_BKSH, jnp.broadcast_to(jnp.asarray(visible_TS), (B, T, S)))
    for b in range(B):
        want = np_attention(q_BTKGH[b].reshape(T, K * G, H), k_BKSH[b].transpose(1, 0, 2),
                            v_BKSH[b].transpose(1, 0, 2), causal, q_pos_T, kv_len)
        np.testing.assert_allclose(np.asarray(got[b]).reshape(T, K * G, H), want, atol=1e-5, rtol=1e-5)


def np_rope(x_THX, pos_T, base):
    half = x_THX.shape[-1] // 2
    angles = pos_T[:, None] * base ** (-np.arange(half) / half)
    cos, sin = np.cos(angles)[:, None], np.sin(angles)[:, None]
    x1, x2 = x_THX[..., :half], x_THX[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def np_forward(model, tokens_T):
    """The whole transformer in numpy, from the parameter arrays, for one sequence."""
    cfg = model.cfg
    P = lambda a: np.asarray(a[...], np.float64)  # noqa: E731
    N, K, H, T = cfg.n_heads, cfg.n_kv_heads, cfg.head_size, len(tokens_T)
    pos = np.arange(T)
    norm = lambda x, scale: x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.norm_eps) * P(scale)  # noqa: E731
    emb = P(model.embed.embedding)
    x = emb[tokens_T]
    kv = []  # each layer's keys and values; a shared layer (LayerSpec "shared") computes queries only
    for block, spec in zip(model.blocks, cfg.layers, strict=True):
        h = norm(x, block.norm1.scale) @ P(block.attn.wqkv.kernel)
        q = np_rope(h[:, :N * H].reshape(T, N, H), pos, cfg.rope_base)
        if spec.kind == "shared":
            k, v = kv[spec.source]
        else:
            k, v = np.split(h[:, N * H:], 2, axis=-1)
            k, v = np_rope(k.reshape(T, K, H), pos, cfg.rope_base), v.reshape(T, K, H)
        kv.append((k, v))
        x = x + np_attention(q, k, v, cfg.causal).reshape(T, N * H) @ P(block.attn.wo.kernel)
        gate, up = np.split(norm(x, block.norm2.scale) @ P(block.mlp.gate_up.kernel), 2, axis=-1)
        x = x + (gate / (1 + np.exp(-gate)) * up) @ P(block.mlp.down.kernel)
    return norm(x, model.norm.scale) @ emb.T / np.sqrt(cfg.d_model)


@pytest.mark.parametrize("variant", VARIANTS, ids=["mha", "gqa", "mqa"])
def test_full_forward_matches_a_numpy_reimplementation(variant):
    _, model = make(**variant)
    x = ids(2, 12)
    logits = np.asarray(model(x)[0])
    for b in range(2):
        np.testing.assert_allclose(logits[b], np_forward(model, x[b]), atol=2e-4, rtol=2e-4)
