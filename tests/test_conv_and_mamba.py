"""The 'conv' (LFM2's gated short convolution) and 'mamba' (Mamba-2) layer kinds: each checked against a numpy
loop written from its published recurrence, run with a cache (a prefill, then one-token steps) against the
full forward, in bytes (constant in T, equal to the formula) and in its one-line refusals."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from invariants import token_ids

import dantinox
from dantinox import LayerSpec
from dantinox.cache.state import ConvCache, MambaCache, state_bytes

MAMBA = LayerSpec("mamba", value_heads=4, head_size=4, ssm_state=6, ssm_groups=2, conv=3)
HYBRID = (LayerSpec("conv", conv=3), LayerSpec(), MAMBA, LayerSpec("sliding", 4))


def hybrid_cfg(specs=HYBRID, **kw):
    cfg = dantinox.ModelConfig.preset("test", kv_heads=2, **kw)
    return cfg.replace(n_layers=len(specs), layer_specs=specs)


def P(a):
    return np.asarray(a[...], np.float64)


def np_conv(window_inputs, kernel):
    """Causal depthwise convolution of [T, C] inputs with a [C, W] kernel, zeros before the first input."""
    W = kernel.shape[1]
    padded = np.concatenate([np.zeros((W - 1, window_inputs.shape[1])), window_inputs])
    return np.stack([(padded[t:t + W] * kernel.T).sum(0) for t in range(len(window_inputs))])


def np_short_conv(layer, x_TD):
    """LFM2's ShortConv in numpy: B, C, x = in_proj(x); y = C · conv(B · x); out_proj(y)."""
    b, c, h = np.split(x_TD @ P(layer.in_proj.kernel), 3, axis=-1)
    return (c * np_conv(b * h, P(layer.conv))) @ P(layer.out.kernel)


def np_mamba2(layer, x_TD):
    """A Mamba-2 mixer in numpy, token by token (float64): the sequential scan of Dao and Gu's recurrence."""
    spec = layer.layer
    Nh, Ph, S, G = spec.value_heads, spec.head_size, spec.ssm_state, spec.ssm_groups
    proj = x_TD @ P(layer.in_proj.kernel)
    z, xbc, dt = proj[:, :Nh * Ph], proj[:, Nh * Ph:-Nh], proj[:, -Nh:]
    xbc = np_conv(xbc, P(layer.conv))
    xbc = xbc / (1 + np.exp(-xbc))
    xs, bs, cs = xbc[:, :Nh * Ph], xbc[:, Nh * Ph:Nh * Ph + G * S], xbc[:, Nh * Ph + G * S:]
    h = np.zeros((Nh, Ph, S))
    ys = []
    for t in range(len(x_TD)):
        y = np.zeros((Nh, Ph))
        for n in range(Nh):
            g = n // (Nh // G)  # head n reads its group's B and C
            delta = np.log1p(np.exp(dt[t, n] + P(layer.dt_bias)[n]))
            A = -np.exp(P(layer.a_log)[n])
            xn = xs[t].reshape(Nh, Ph)[n]
            h[n] = np.exp(delta * A) * h[n] + delta * np.outer(xn, bs[t].reshape(G, S)[g])
            y[n] = h[n] @ cs[t].reshape(G, S)[g] + P(layer.skip)[n] * xn
        ys.append(y.reshape(-1))
    gated = np.asarray(ys) * (z / (1 + np.exp(-z)))
    grouped = gated.reshape(len(x_TD), G, -1)
    rms = np.sqrt((grouped ** 2).mean(-1, keepdims=True) + layer.cfg.norm_eps)
    normed = grouped / rms * P(layer.norm.scale)
    return normed.reshape(len(x_TD), -1) @ P(layer.out.kernel)


@pytest.mark.parametrize("index, reference", [(0, np_short_conv), (2, np_mamba2)])
def test_each_layer_computes_its_published_recurrence(index, reference):
    model = dantinox.Transformer(hybrid_cfg(), rngs=nnx.Rngs(0))
    layer = model.blocks[index].attn
    x = np.random.default_rng(0).standard_normal((2, 7, model.cfg.d_model)).astype(np.float32)
    got, _, _ = layer(jnp.asarray(x), jnp.broadcast_to(jnp.arange(7), (2, 7)))
    for b in range(2):
        np.testing.assert_allclose(np.asarray(got[b]), reference(layer, x[b].astype(np.float64)), atol=2e-4,
                                   rtol=2e-4)


def test_a_prefill_then_one_token_steps_equal_the_full_forward():
    cfg = hybrid_cfg()
    model = dantinox.Transformer(cfg, rngs=nnx.Rngs(1))
    x = token_ids(2, 11)
    full = np.asarray(model(jnp.asarray(x))[0])
    cache = dantinox.init_cache(cfg, 2, 16)
    at = 0
    for n in (5,) + (1,) * 6:  # the windows and the SSM state go from one call to the next
        logits, cache, _ = model(jnp.asarray(x[:, at:at + n]), use_cache=True, kv_caches=cache)
        np.testing.assert_allclose(np.asarray(logits), full[:, at:at + n], atol=2e-4, rtol=2e-4)
        at += n


def test_the_states_are_the_same_bytes_at_any_length():
    cfg = hybrid_cfg(dtype="bfloat16")
    conv, mamba = cfg.layers[0], cfg.layers[2]
    assert state_bytes(cfg, conv) == 32 * 3 * 2  # D x conv inputs in bf16 (transformers' Lfm2 conv state)
    assert state_bytes(cfg, mamba) == 4 * 4 * 6 * 4 + (4 * 4 + 2 * 2 * 6) * 3 * 2  # heads·P·N f32, conv bf16
    sizes = []
    for T in (4, 32):
        cache = dantinox.init_cache(cfg, 3, T)
        assert (type(cache.layers[0]), type(cache.layers[2])) == (ConvCache, MambaCache)
        assert cache.layers[2].ssm.dtype == jnp.float32
        assert cache.nbytes == dantinox.kv_cache_bytes(cfg, 3, T)  # measured == the formula
        sizes.append([dantinox.tree_nbytes(layer) for layer in cache.layers])
    assert sizes[0][0] == sizes[1][0] == 3 * state_bytes(cfg, conv)
    assert sizes[0][2] == sizes[1][2] == 3 * state_bytes(cfg, mamba)
    assert sizes[1][1] == 8 * sizes[0][1]  # the full layer grows with T, the states do not


@pytest.mark.parametrize("specs, field", [
    ((LayerSpec("conv", kv_heads=2), LayerSpec()), "layer_specs[0].kv_heads"),
    ((LayerSpec("conv", ssm_state=4), LayerSpec()), "layer_specs[0].ssm_state"),
    ((LayerSpec("mamba", value_heads=4, ssm_groups=3), LayerSpec()), "layer_specs[0].ssm_groups"),
    ((LayerSpec("mamba", kv_heads=2), LayerSpec()), "layer_specs[0].kv_heads"),
    ((LayerSpec(), LayerSpec(ssm_state=8)), "layer_specs[1].value_heads"),
    ((LayerSpec("conv"), LayerSpec("shared", source=0)), "layer_specs[1].source"),
])
def test_a_recurrent_layer_it_cannot_build_is_refused_in_one_line(specs, field):
    with pytest.raises(ValueError) as excinfo:
        hybrid_cfg(specs)
    message = str(excinfo.value)
    assert message.startswith(field + ":") and "\n" not in message, message
