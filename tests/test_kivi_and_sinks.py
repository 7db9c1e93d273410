"""KIVI low-bit storage, StreamingLLM attention sinks and H2O eviction: bytes equal the formula, attention equals
numpy references."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from invariants import token_ids

import content
import dantinox
from dantinox.architectures.windows import local_layers
from dantinox.cache import cache_length, layouts
from dantinox.cache.kivi import KiviCache, pack, unpack
from dantinox.generation import quality

P = lambda a: np.asarray(a[...], np.float64)  # noqa: E731


entry = functools.cache(content.load_entry)  # validating an entry costs about a second


@functools.cache
def model_for(cfg):
    """One model per config for the whole module, so its compiled steps are reused."""
    return dantinox.Transformer(cfg, rngs=nnx.Rngs(0))


def kivi(bits=4, **kw):
    kw = {"kv_heads": 2, "kivi_group": 4, "kivi_residual": 6, **kw}
    return dantinox.ModelConfig.preset("test", cache_dtype=f"kivi{bits}", **kw)


_STEPS = {}


def decode(model, cfg, x, prefill, slots):
    """Prefill, then one token at a time (one compiled step per model): the logits of every position and the cache."""
    if id(model) not in _STEPS:
        graphdef, params = nnx.split(model)
        _STEPS[id(model)] = (model, jax.jit(lambda ids, cache: nnx.merge(graphdef, params).forward(ids, cache)))
    step = _STEPS[id(model)][1]
    logits, cache = step(jnp.asarray(x[:, :prefill]), dantinox.init_cache(cfg, x.shape[0], slots))
    steps = [logits]
    for t in range(prefill, x.shape[1]):
        logits, cache = step(jnp.asarray(x[:, t:t + 1]), cache)
        steps.append(logits)
    return np.asarray(jnp.concatenate(steps, axis=1)), cache


def np_rope(x, pos, base):
    half = x.shape[-1] // 2
    ang = np.asarray(pos, np.float64)[..., None] * base ** (-np.arange(half) / half)
    c, s = np.cos(ang)[..., None, :], np.sin(ang)[..., None, :]
    return np.concatenate([x[..., :half] * c - x[..., half:] * s, x[..., half:] * c + x[..., :half] * s], -1)


def np_forward(model, tokens_T, attention):
    """Numpy forward; `attention(layer, q_TNH, k_TKH, v_TKH) -> [T, N, H]` gets the pre-RoPE q and k."""
    cfg = model.cfg
    N, K, H, T = cfg.n_heads, cfg.n_kv_heads, cfg.head_size, len(tokens_T)
    norm = lambda x, s: x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.norm_eps) * P(s)  # noqa: E731
    x = P(model.embed.embedding)[tokens_T]
    for i, block in enumerate(model.blocks):
        q, k, v = np.split(norm(x, block.norm1.scale) @ P(block.attn.wqkv.kernel), [N * H, (N + K) * H], -1)
        out = attention(i, q.reshape(T, N, H), k.reshape(T, K, H), v.reshape(T, K, H))
        x = x + out.reshape(T, N * H) @ P(block.attn.wo.kernel)
        gate, up = np.split(norm(x, block.norm2.scale) @ P(block.mlp.gate_up.kernel), 2, axis=-1)
        x = x + (gate / (1 + np.exp(-gate)) * up) @ P(block.mlp.down.kernel)
    return norm(x, model.norm.scale) @ P(model.embed.embedding).T / np.sqrt(cfg.d_model)


def np_softmax_attend(q_NH, k_SKH, v_SKH):
    N, K, H = q_NH.shape[0], k_SKH.shape[1], q_NH.shape[-1]
    out = np.zeros((N, H))
    for n in range(N):
        scores = k_SKH[:, n // (N // K)] @ q_NH[n] / np.sqrt(H)
        w = np.exp(scores - scores.max())
        out[n] = (w / w.sum()) @ v_SKH[:, n // (N // K)]
    return out


# KIVI ------------------------------------------------------------------------------------------------------------

def np_kivi(x_TKH, G, bits, R, per_channel):
    """Keys (per_channel) or values of T tokens as a KIVI cache returns them: complete key groups of G tokens
    quantized per channel, values per token in groups of G channels, the last R tokens in full precision."""
    top, f16 = 2**bits - 1, lambda a: a.astype(np.float16).astype(np.float64)  # noqa: E731

    def q(x, axis):
        lo, hi = x.min(axis, keepdims=True), x.max(axis, keepdims=True)
        s, z = f16((hi - lo) / top), f16(lo)
        return np.clip(np.round((x - z) / np.where(s > 0, s, 1.0)), 0, top) * s + z

    T, K, H = x_TKH.shape
    out = x_TKH.copy()
    if per_channel:
        for g in range(T // G):
            out[g * G:(g + 1) * G] = q(x_TKH[g * G:(g + 1) * G], 0)
    else:
        out = q(x_TKH.reshape(T, K, H // G, G), 3).reshape(T, K, H)
    return np.where((np.arange(T) >= T - R)[:, None, None], x_TKH, out)


def kivi_formula(cfg, batch, tokens):
    L, K, H, G, R, bits = cfg.n_layers, cfg.n_kv_heads, cfg.head_size, 4, 6, cfg.kivi_bits
    per_layer = (2 * tokens * K * H * bits / 8  # packed codes of keys and values
                 + 2 * 2 * -(-tokens // G) * K * H  # float16 scale and zero per key channel per token group
                 + 2 * 2 * tokens * K * (H // G)  # float16 scale and zero per value token per channel group
                 + 2 * 4 * min(tokens, R) * K * H)  # float32 keys and values of the last R tokens
    return batch * L * per_layer


@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize("batch,tokens", [(1, 1), (2, 7), (3, 40), (1, 129)])
def test_kivi_bytes_equal_the_formula(bits, batch, tokens):
    cfg = kivi(bits, max_context=256)
    assert dantinox.kv_cache_bytes(cfg, batch, tokens) == kivi_formula(cfg, batch, tokens)
    assert dantinox.init_cache(cfg, batch, tokens).nbytes == kivi_formula(cfg, batch, tokens)


@pytest.mark.parametrize("bits", [4, 2])
def test_pack_round_trips(bits):
    codes = np.random.RandomState(0).randint(0, 2**bits, (3, 2, 16))
    packed = pack(jnp.asarray(codes), bits)
    assert packed.dtype == jnp.uint8 and packed.shape == (3, 2, 16 * bits // 8)
    np.testing.assert_array_equal(unpack(packed, bits), codes)


@pytest.mark.parametrize("bits,prefill", [(4, 1), (4, 11), (2, 11)])  # token by token; a prompt past the window
def test_kivi_attention_equals_attention_over_numpy_dequantized_values(bits, prefill):
    cfg = kivi(bits)
    model = model_for(cfg)
    x = token_ids(2, 21)
    cached, cache = decode(model, cfg, x, prefill, 24)
    assert type(cache.layers[0]) is KiviCache and cache.nbytes == kivi_formula(cfg, 2, 24)  # after decoding too
    G, R = cfg.kivi_group, cfg.kivi_residual

    def kivi_attention(i, q, k, v):  # each query reads the cache as it was after its own write
        T = q.shape[0]
        q, k = np_rope(q, np.arange(T), cfg.rope_base), np_rope(k, np.arange(T), cfg.rope_base)
        out = np.zeros_like(q)
        for p in range(T):
            if p < prefill:  # the prompt attends to itself in full precision
                kk, vv = k[:p + 1], v[:p + 1]
            else:
                kk, vv = np_kivi(k[:p + 1], G, bits, R, True), np_kivi(v[:p + 1], G, bits, R, False)
            out[p] = np_softmax_attend(q[p], kk, vv)
        return out

    for b in range(2):
        np.testing.assert_allclose(cached[b], np_forward(model, x[b], kivi_attention), atol=2e-4, rtol=2e-4)
    # and the stored layer, read back, is the numpy-dequantized keys and values (layer 0 sees the embeddings)
    layer0 = cache.layers[0]
    k_read, v_read = (np.asarray(a) for a in layer0.read(cfg, cache.lengths))
    float_cfg = cfg.replace(cache_dtype="float32")
    _, float_cache = decode(model_for(float_cfg), float_cfg, x, 21, 24)
    float_k = float_cache.layers[0].k.transpose(0, 1, 3, 2)  # stored slot-last
    k_f, v_f = (np.asarray(a, np.float64)[:, :, :21].transpose(0, 2, 1, 3) for a in (float_k, float_cache.layers[0].v))
    for b in range(2):
        np.testing.assert_allclose(k_read[b, :, :21].transpose(1, 0, 2), np_kivi(k_f[b], G, bits, R, True), atol=1e-4)
        np.testing.assert_allclose(v_read[b, :, :21].transpose(1, 0, 2), np_kivi(v_f[b], G, bits, R, False), atol=1e-4)
    assert np.abs(k_read[:, :, :21] - k_f.transpose(0, 2, 1, 3)).max() > 1e-3  # something was quantized


def test_kivi_is_exact_while_every_token_is_in_the_full_precision_window():
    cfg = kivi(4)
    x = token_ids(2, 21)
    cached, _ = decode(model_for(cfg), cfg, x, 1, 24)  # the compiled step of the test above
    float_logits = np.asarray(model_for(cfg.replace(cache_dtype="float32"))(x)[0])
    R = cfg.kivi_residual
    np.testing.assert_allclose(cached[:, :R], float_logits[:, :R], atol=2e-5, rtol=2e-5)
    assert np.abs(cached[:, R:] - float_logits[:, R:]).max() > 1e-4  # and not after


@pytest.mark.parametrize("kw,match", [
    (dict(attention="latent", kv_heads=None, kv_latent_dim=8, rope_head_dim=4), "attention: cache_dtype='kivi4'"),
    (dict(sliding_windows=(4, 4)), "sliding_windows: cache_dtype='kivi4'"),
    (dict(kivi_group=3), "kivi_group: .* must divide head_size"),
    (dict(kivi_residual=2), "kivi_residual: .* at least kivi_group"),
    (dict(kivi_group=0), "kivi_group: expected a positive integer"),
])
def test_kivi_config_errors_name_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        kivi(4, **kw)


# Attention sinks -------------------------------------------------------------------------------------------------

def sinks(window=5, n_sinks=2, local_per_global=None):
    cfg = dantinox.ModelConfig.preset("test", kv_heads=2, sliding_windows=local_layers(2, window, local_per_global),
                                      attention_sinks=n_sinks)
    return cfg, model_for(cfg)


def paper_attention(cfg):
    """StreamingLLM's rule, literally: query p's cache holds the first S tokens and its last W; the kept tokens
    are numbered 0, 1, ... in cache order and rotated at those numbers, the query at the next one."""
    W, S = cfg.sliding_window, cfg.attention_sinks

    def attention(i, q, k, v):
        out = np.zeros_like(q)
        for p in range(q.shape[0]):
            kept = np.arange(p + 1)
            if cfg.layer_windows[i] is not None:
                kept = kept[(kept < S) | (p - kept < W)]
            cache_pos = np.arange(len(kept))
            q_p = np_rope(q[p][None], cache_pos[-1:], cfg.rope_base)[0]
            out[p] = np_softmax_attend(q_p, np_rope(k[kept], cache_pos, cfg.rope_base), v[kept])
        return out
    return attention


# a prompt shorter than W + S, and one longer (the ring has wrapped); Gemma-style alternation with global layers
@pytest.mark.parametrize("local_per_global,prefill", [(None, 3), (None, 12), (1, 12)])
def test_sinks_decode_equals_the_paper_position_rule(local_per_global, prefill):
    cfg, model = sinks(local_per_global=local_per_global)
    x = token_ids(2, 23)
    cached, cache = decode(model, cfg, x, prefill, 32)
    assert [layer.slots for layer in cache.layers] == [7 if w else 32 for w in cfg.layer_windows]
    for b in range(2):
        np.testing.assert_allclose(cached[b], np_forward(model, x[b], paper_attention(cfg)), atol=2e-4, rtol=2e-4)
    np.testing.assert_allclose(cached, np.asarray(model(x)[0]), atol=2e-5, rtol=2e-5)  # the masked full forward
    window_only = model_for(cfg.replace(attention_sinks=0))
    assert np.abs(np.asarray(window_only(x)[0]) - cached)[:, 7:].max() > 1e-3  # the sinks change what is seen


@pytest.mark.parametrize("tokens", [1, 6, 7, 30])
def test_sink_ring_bytes_equal_the_formula_and_hold_the_first_and_latest(tokens):
    cfg, model = sinks(window=5, n_sinks=2)
    L, K, H = cfg.n_layers, cfg.n_kv_heads, cfg.head_size
    formula = 2 * L * 2 * min(tokens, 5 + 2) * K * H * 4  # B = 2, keys and values of min(T, W + S) slots, f32
    assert dantinox.kv_cache_bytes(cfg, 2, tokens) == formula == dantinox.init_cache(cfg, 2, tokens).nbytes
    _, cache = decode(model, cfg, token_ids(2, tokens), 1, tokens)
    assert cache.nbytes == formula
    addr = layouts(cfg)[0].addressing  # the layout the cache gives layer 0
    held = np.asarray(addr.positions(cache.lengths, cache.layers[0].slots))[0]
    want = list(range(tokens)) if tokens <= 7 else [0, 1, *range(tokens - 5, tokens)]
    assert sorted(held.tolist()) == want


def test_a_sink_ring_below_its_full_size_grows_like_a_linear_layer():
    cfg, _ = sinks(window=6, n_sinks=4)
    assert cache_length(cfg, dantinox.init_cache(cfg, 1, 8)) == 8  # 8 of its 10 slots: not yet a ring
    assert cache_length(cfg, dantinox.init_cache(cfg, 1, 12)) == cfg.max_context  # full: takes any


def test_sinks_need_a_window():
    with pytest.raises(ValueError, match="attention_sinks: kept beside a sliding window's ring; set sliding_windows"):
        dantinox.ModelConfig.preset("test", attention_sinks=4)


@pytest.mark.parametrize("cfg", [kivi(4), kivi(2, dtype="bfloat16"), kivi(2, kivi_group=8, kivi_residual=8),
                                 dantinox.ModelConfig.preset("test", sliding_windows=(5, 5), attention_sinks=2),
                                 dantinox.ModelConfig.preset("test", sliding_windows=(9, 9), attention_sinks=3,
                                                             cache_dtype="bfloat16")],
                         ids=["kivi4", "kivi2-bf16", "kivi2-g8", "sinks", "sinks-bf16"])
def test_the_concept_entry_formula_sizes_the_new_layouts_to_the_byte(cfg):
    for batch, tokens in ((1, 1), (2, 7), (1, 33), (3, 64)):
        entry_id, title, variables = quality.formula_for(cfg, batch, tokens)
        formula = content.evaluate(entry(entry_id), title, **variables)
        assert formula == dantinox.kv_cache_bytes(cfg, batch, tokens) == dantinox.init_cache(cfg, batch, tokens).nbytes


# H2O eviction -------------------------------------------------------------------------------------------------------

def h2o(budget=6):
    cfg = dantinox.ModelConfig.preset("test", kv_heads=2, cache_budget=budget, eviction="h2o")
    return cfg, model_for(cfg)


def h2o_reference(cfg, prefill, kept_log):
    """H2O as the paper states it, per layer: each call's queries attend over the kept tokens and the call's own
    (causally), every candidate's score adds the weights it received (all heads), then the latest N // 2 positions
    and the N - (recent kept) highest scores stay (ties: the older token). `kept_log[i]` gets the final set."""
    N, r = cfg.cache_budget, cfg.recent_budget

    def attention(i, q, k, v):
        T = q.shape[0]
        q, k = np_rope(q, np.arange(T), cfg.rope_base), np_rope(k, np.arange(T), cfg.rope_base)
        N_heads, K = q.shape[1], k.shape[1]
        kept, score, out = [], {}, np.zeros_like(q)
        for call in [range(prefill)] + [range(p, p + 1) for p in range(prefill, T)]:
            cand = kept + list(call)
            for c in call:
                score[c] = 0.0
            for p in call:
                seen = [c for c in cand if c <= p]
                for n in range(N_heads):
                    s_ = k[seen, n // (N_heads // K)] @ q[p, n] / np.sqrt(q.shape[-1])
                    w = np.exp(s_ - s_.max())
                    w /= w.sum()
                    out[p, n] = w @ v[seen, n // (N_heads // K)]
                    for c, wc in zip(seen, w, strict=True):
                        score[c] += wc
            end = call[-1] + 1
            recent = [c for c in cand if c >= end - r]
            rest = sorted((c for c in cand if c < end - r), key=lambda c: (-score[c], c))
            kept = sorted(recent + rest[:max(0, N - len(recent))])
        kept_log[i] = kept
        return out
    return attention


@pytest.mark.parametrize("prefill", [1, 9])  # token by token; a prompt longer than the budget, compressed once
def test_h2o_keeps_recent_tokens_and_heavy_hitters_as_the_reference_does(prefill):
    cfg, model = h2o(6)
    x = token_ids(2, 20)
    cached, cache = decode(model, cfg, x, prefill, 20)
    assert cache.nbytes == dantinox.kv_cache_bytes(cfg, 2, 20)  # after decoding too
    for b in range(2):
        kept = {}
        np.testing.assert_allclose(cached[b], np_forward(model, x[b], h2o_reference(cfg, prefill, kept)),
                                   atol=2e-4, rtol=2e-4)
        for i, layer in enumerate(cache.layers):
            assert sorted(np.asarray(layer.pos)[b].tolist()) == kept[i]
    assert any(0 < p < 17 for layer in cache.layers for p in np.asarray(layer.pos).ravel())  # a heavy hitter kept
    full = np.asarray(model_for(cfg.replace(cache_budget=None, eviction=None))(x)[0])
    if prefill == 1:  # while the text fits in the budget, nothing is evicted: the full cache's logits
        np.testing.assert_allclose(cached[:, :6], full[:, :6], atol=2e-5, rtol=2e-5)
    assert np.abs(cached[:, 7:] - full[:, 7:]).max() > 1e-3  # and after it, eviction changes what is seen


@pytest.mark.parametrize("batch,tokens", [(1, 1), (2, 5), (3, 6), (2, 40)])
def test_h2o_bytes_equal_the_formula_with_scores_and_positions(batch, tokens):
    cfg = dantinox.ModelConfig.preset("test", kv_heads=2, cache_budget=6, eviction="h2o", cache_dtype="bfloat16")
    slots = min(tokens, 6)
    formula = batch * cfg.n_layers * slots * (2 * 2 * 8 * 2 + 4 + 4)  # K, V of 2 heads x 8 in bf16, score, position
    assert dantinox.kv_cache_bytes(cfg, batch, tokens) == formula == dantinox.init_cache(cfg, batch, tokens).nbytes
    entry_id, title, variables = quality.formula_for(cfg, batch, tokens)
    assert content.evaluate(entry(entry_id), title, **variables) == formula


@pytest.mark.parametrize("kw,match", [
    (dict(cache_budget=8), "eviction: a budget and a policy go together"),
    (dict(cache_budget=8, eviction="lru"), "eviction: expected one of h2o"),
    (dict(cache_budget=1, eviction="h2o"), "cache_budget: expected an integer >= 2"),
    (dict(cache_budget=8, eviction="h2o", cache_dtype="int8"), "cache_dtype: eviction='h2o' keeps float"),
    (dict(cache_budget=8, eviction="h2o", sliding_windows=(4, 4)), "sliding_windows: eviction='h2o'"),
])
def test_eviction_config_errors_name_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        dantinox.ModelConfig.preset("test", **kw)
