"""Sliding-window layers: ring-buffer bytes equal the content formula, logits equal a full-cache band-mask reference."""

import re

import jax.numpy as jnp
import numpy as np
import pytest
from fast_compile import LEARNER_COMPILE
from flax import nnx
from invariants import token_ids

import content
import dantinox
from dantinox.architectures.attention import attend
from dantinox.architectures.windows import gemma2_windows, gemma3_windows, local_layers
from dantinox.cache import LayerCache, View
from dantinox.cache.ring import Chunked, Ring, ring_slots_held
from dantinox.generation import quality
from dantinox.generation.generate import decode_program, prefill_jit
from dantinox_labs import shipped

PER_GLOBAL = {"local": None, "1:1": 1, "2:1": 2, "5:1": 5}  # local layers per global one (None: all local)
PATTERNS = list(PER_GLOBAL)


def make(window=5, pattern="1:1", **kw):
    cfg = dantinox.ModelConfig.preset("test", n_layers=4, sliding_windows=local_layers(4, window, PER_GLOBAL[pattern]),
                                      **kw)
    return cfg, dantinox.Transformer(cfg, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("tokens", [1, 7, 8, 9, 64])
@pytest.mark.parametrize("kv_heads,cache_dtype", [(None, "float32"), (2, "bfloat16")])
def test_ring_buffer_bytes_equal_the_per_layer_formula(pattern, tokens, kv_heads, cache_dtype):
    cfg = dantinox.ModelConfig.preset("test", n_layers=6, sliding_windows=local_layers(6, 8, PER_GLOBAL[pattern]),
                                      kv_heads=kv_heads, cache_dtype=cache_dtype)
    cache = dantinox.init_cache(cfg, 3, tokens)
    local = sum(w is not None for w in cfg.layer_windows)
    entry = content.load_entry("sliding-window-attention")
    formula = content.evaluate(entry, "Hybrid sliding-window cache size", L_g=cfg.n_layers - local, L_l=local,
                               B=3, T=tokens, W=8, H_kv=cfg.n_kv_heads, d_h=cfg.head_size, bytes=cfg.cache_itemsize)
    assert cache.nbytes == formula
    if pattern == "local":  # every layer local: the entry's plain sliding-window formula agrees too
        assert formula == content.evaluate(entry, "Sliding-window cache size", L=6, B=3, T=tokens, W=8,
                                           H_kv=cfg.n_kv_heads, d_h=cfg.head_size, bytes=cfg.cache_itemsize)


def test_helpers_place_global_layers_as_gemma_does():
    four = dantinox.ModelConfig.preset("test", n_layers=4)
    assert four.with_sliding_window(4).layer_windows == local_layers(4, 4) == (4, 4, 4, 4)
    assert four.with_sliding_window(4, 1).layer_windows == gemma2_windows(4, 4) == (4, None, 4, None)  # Gemma 2
    assert gemma3_windows(12, 4) == (4,) * 5 + (None,) + (4,) * 5 + (None,)  # Gemma 3: every sixth layer global
    assert dantinox.ModelConfig.preset("test", n_layers=3).layer_windows == (None, None, None)
    assert four.with_sliding_window(4, 1).local_per_global == 1 and four.with_sliding_window(4).local_per_global == 0
    assert four.replace(sliding_windows=[None] * 4).sliding_windows is None  # no local layer: stored one way
    assert four.replace(sliding_windows=[4, 2, None, 4]).sliding_windows == (4, 2, None, 4)  # a JSON list
    assert four.with_attention_chunks(8, 3).layer_chunks == (8, 8, 8, None)


def test_run_configs_with_a_window_pattern_still_load():
    old = dict(n_layers=4, attention="gqa", kv_heads=2, sliding_window=4, window_pattern="1:1")
    cfg = dantinox.ModelConfig.from_dict(old)
    assert (cfg.attention, cfg.kv_heads, cfg.sliding_windows) == ("heads", 2, (4, None, 4, None))
    chunked = dantinox.ModelConfig.from_dict(dict(n_layers=4, attention_chunk_size=8, window_pattern="local",
                                                  sliding_window=None))
    assert chunked.layer_chunks == (8,) * 4 and chunked.sliding_windows is None
    with pytest.raises(ValueError, match="window_pattern: expected 'local' or 'n:1'"):
        dantinox.ModelConfig.from_dict(dict(old, window_pattern="1:2"))


def np_band_reference(model, tokens_T):
    """Numpy forward keeping every position's keys and values (a full cache) and masking outside the band
    (sliding-window layers) or outside the query's own chunk (chunked layers)."""
    cfg = model.cfg
    P = lambda a: np.asarray(a[...], np.float64)  # noqa: E731
    N, K, H, T = cfg.n_heads, cfg.n_kv_heads, cfg.head_size, len(tokens_T)
    pos = np.arange(T)
    norm = lambda x, s: x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.norm_eps) * P(s)  # noqa: E731

    def rope(x):
        half = H // 2
        ang = pos[:, None] * cfg.rope_base ** (-np.arange(half) / half)
        c, s = np.cos(ang)[:, None], np.sin(ang)[:, None]
        return np.concatenate([x[..., :half] * c - x[..., half:] * s, x[..., half:] * c + x[..., :half] * s], -1)

    x = P(model.embed.embedding)[tokens_T]
    for block, window, chunk in zip(model.blocks, cfg.layer_windows, cfg.layer_chunks, strict=True):
        q, k, v = np.split(norm(x, block.norm1.scale) @ P(block.attn.wqkv.kernel), [N * H, (N + K) * H], -1)
        q, k, v = rope(q.reshape(T, N, H)), rope(k.reshape(T, K, H)), v.reshape(T, K, H)
        band = pos[None, :] <= pos[:, None]
        if window is not None:
            band &= pos[:, None] - pos[None, :] < window
        if chunk is not None:
            band &= pos[:, None] // chunk == pos[None, :] // chunk
        out = np.zeros((T, N, H))
        for n in range(N):
            scores = np.where(band, q[:, n] @ k[:, n // (N // K)].T / np.sqrt(H), -np.inf)
            w = np.exp(scores - scores.max(-1, keepdims=True))
            out[:, n] = (w / w.sum(-1, keepdims=True)) @ v[:, n // (N // K)]
        x = x + out.reshape(T, N * H) @ P(block.attn.wo.kernel)
        gate, up = np.split(norm(x, block.norm2.scale) @ P(block.mlp.gate_up.kernel), 2, axis=-1)
        x = x + (gate / (1 + np.exp(-gate)) * up) @ P(block.mlp.down.kernel)
    return norm(x, model.norm.scale) @ P(model.embed.embedding).T / np.sqrt(cfg.d_model)


@pytest.mark.both_backends
@pytest.mark.parametrize("pattern", ["local", "1:1"])
@pytest.mark.parametrize("prefill", [3, 12])  # shorter than W, and longer (the ring keeps its last W)
def test_cached_decode_past_the_window_equals_the_band_mask_reference(pattern, prefill):
    cfg, model = make(window=5, pattern=pattern, kv_heads=2)
    x = token_ids(2, 23)  # 23 positions: the 5-slot ring wraps four times
    logits, cache, _ = model(x[:, :prefill], use_cache=True, kv_caches=dantinox.init_cache(cfg, 2, 32))
    steps = [logits]
    for t in range(prefill, x.shape[1]):
        logits, cache, _ = model(x[:, t:t + 1], use_cache=True, kv_caches=cache, cache_index=t)
        steps.append(logits)
    cached = np.asarray(jnp.concatenate(steps, axis=1))
    assert [layer.slots for layer in cache.layers] == [5 if w else 32 for w in cfg.layer_windows]
    for b in range(2):
        np.testing.assert_allclose(cached[b], np_band_reference(model, x[b]), atol=2e-4, rtol=2e-4)
    np.testing.assert_allclose(cached, np.asarray(model(x)[0]), atol=2e-5, rtol=2e-5)  # no-cache forward too


def test_window_changes_logits_only_past_w():
    cfg, windowed = make(window=6, pattern="local")
    full = dantinox.Transformer(cfg.replace(sliding_windows=None), rngs=nnx.Rngs(0))  # same init, same weights
    x = token_ids(1, 20)
    a, b = np.asarray(windowed(x)[0]), np.asarray(full(x)[0])
    np.testing.assert_allclose(a[:, :6], b[:, :6], atol=1e-5)  # the first W positions see the same keys
    assert np.abs(a[:, 6:] - b[:, 6:]).max(axis=-1).min() > 1e-4  # every later position lost a key


def test_ring_slots_hold_the_latest_positions_and_their_keys():
    cfg, model = make(window=4, pattern="local")
    x = token_ids(1, 11)
    _, cache, _ = model(x, use_cache=True, kv_caches=dantinox.init_cache(cfg, 1, 16))
    ring = cache.layers[0]
    assert ring.slots == 4
    held = np.asarray(Ring(4).positions(cache.lengths, 4))[0]
    assert held.tolist() == ring_slots_held(4, 11) == [8, 9, 10, 7]  # position p in slot p mod 4
    assert ring_slots_held(4, 2) == [0, 1, None, None]
    _, full_cache, _ = dantinox.Transformer(cfg.replace(sliding_windows=None), rngs=nnx.Rngs(0))(
        x, use_cache=True, kv_caches=dantinox.init_cache(cfg.replace(sliding_windows=None), 1, 16))
    np.testing.assert_allclose(ring.k[0], full_cache.layers[0].k[0][:, :, held], atol=1e-6)


def test_greedy_decode_identical_with_and_without_cache():
    cfg, model = make(window=5, pattern="1:1")
    prompt = token_ids(2, 7)
    with_cache = dantinox.generate(model, prompt, max_new_tokens=30, use_cache=True)
    without = dantinox.generate(model, prompt, max_new_tokens=30, use_cache=False)
    np.testing.assert_array_equal(with_cache, without)


def test_band_mask_in_attend_matches_numpy():
    rs = np.random.RandomState(1)
    q, k, v = rs.randn(1, 6, 1, 1, 4), rs.randn(1, 1, 6, 4), rs.randn(1, 1, 6, 4)
    pos = jnp.arange(6)[None]
    mask = View(LayerCache(k, v), pos, Ring(3)).mask(pos, causal=True)
    got = np.asarray(attend(q, k.transpose(0, 1, 3, 2), v, mask))[0, :, 0, 0]
    for t in range(6):
        keys = range(max(0, t - 2), t + 1)  # itself and the two before it
        s = np.array([q[0, t, 0, 0] @ k[0, 0, j] for j in keys]) / 2.0
        w = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
        np.testing.assert_allclose(got[t], sum(wi * v[0, 0, j] for wi, j in zip(w, keys, strict=True)), atol=1e-5)


@pytest.mark.parametrize("kw,match", [
    (dict(sliding_windows=(4,)), r"sliding_windows: expected one entry per layer \(2\)"),
    (dict(sliding_windows=4), r"sliding_windows: expected one entry per layer \(2\)"),
    (dict(sliding_windows=(4, 0)), r"sliding_windows\[1\]: expected a positive integer"),
    (dict(sliding_windows=(4, None), attention_chunks=(4, None)), "attention_chunks: a layer is either sliding"),
    (dict(sliding_windows=(4, 4), paradigm="diffusion"), "sliding_windows: paradigm='diffusion' caches float keys"),
    (dict(cache_layout="pages"), "cache_layout: expected one of contiguous, paged, got 'pages'"),
])
def test_config_errors_name_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        dantinox.ModelConfig.preset("test", **kw)


def test_trained_window_run_decodes_identically_with_and_without_cache():
    """runs/tiny-swa16-local (trained with W = 16 in every layer): 80 greedy tokens, far past W, both ways."""
    gen = dantinox.Generator(shipped.run("tiny-swa16-local"))
    assert gen.cfg.layer_windows == (16,) * 4
    prompt = "The KV cache of a sliding-window layer"
    assert gen.generate(prompt, max_new_tokens=80) == gen.generate(prompt, max_new_tokens=80, use_cache=False)


def test_cli_trains_a_window_run_and_refuses_a_bad_placement(tmp_path, capsys):
    from dantinox_labs.cli import main

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a sliding window keeps the last W keys. " * 20)
    run = tmp_path / "run"
    assert main(["train", "--run_dir", str(run), "--steps", "3", "--seq_len", "32", "--corpus", str(corpus),
                 "--sliding_window", "8", "--local_per_global", "1"]) == 0
    assert dantinox.load_run(run)[0].layer_windows == (8, None, 8, None)
    assert main(["train", "--run_dir", str(tmp_path / "bad"), "--steps", "1", "--corpus", str(corpus),
                 "--sliding_window", "8", "--local_per_global", "0"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "dantinox train: error: local_per_global: expected a positive integer, got 0")


@pytest.mark.parametrize("pattern", ["local", "1:1"])
@pytest.mark.parametrize("prefill", [3, 10])  # inside the first chunk, and past it
def test_chunked_layers_equal_the_chunk_mask_reference(pattern, prefill):
    """Llama 4's chunked attention (attention_chunk_size C): a ring of C slots per chunked layer, a query sees
    only its own chunk; cached decoding equals a numpy forward over all keys with the chunk mask."""
    cfg = dantinox.ModelConfig.preset("test", n_layers=4, attention_chunks=local_layers(4, 4, PER_GLOBAL[pattern]),
                                      kv_heads=2)
    model = dantinox.Transformer(cfg, rngs=nnx.Rngs(0))
    x = token_ids(2, 15)
    logits, cache, _ = model(x[:, :prefill], use_cache=True, kv_caches=dantinox.init_cache(cfg, 2, 16))
    steps = [logits]
    for t in range(prefill, x.shape[1]):
        logits, cache, _ = model(x[:, t:t + 1], use_cache=True, kv_caches=cache)
        steps.append(logits)
    cached = np.asarray(jnp.concatenate(steps, axis=1))
    assert [layer.slots for layer in cache.layers] == [4 if c else 16 for c in cfg.layer_chunks]
    for b in range(2):
        np.testing.assert_allclose(cached[b], np_band_reference(model, x[b]), atol=2e-4, rtol=2e-4)
    np.testing.assert_allclose(cached, np.asarray(model(x)[0]), atol=2e-5, rtol=2e-5)
    np.testing.assert_array_equal(dantinox.generate(model, x[:, :5], 20), dantinox.generate(model, x[:, :5], 20, False))
    assert Chunked(4).visible(jnp.array(5), jnp.array(3)) == jnp.array(False)  # 3 is in the chunk before 5's


@pytest.mark.parametrize("path", ["absorbed", "materialized"])
def test_mla_latents_in_a_ring(path):
    """The ring is addressing, the latent is payload: a sliding-window MLA layer caches W latents."""
    cfg, model = make(window=5, pattern="1:1", attention="latent", kv_latent_dim=16, rope_head_dim=4, mla_decode=path)
    x = token_ids(2, 14)
    cached = quality.cached_logits(model, x)
    np.testing.assert_allclose(cached, np.asarray(model(x)[0]), atol=2e-5, rtol=2e-5)
    np.testing.assert_array_equal(dantinox.generate(model, x[:, :4], 20), dantinox.generate(model, x[:, :4], 20, False))
    assert dantinox.init_cache(cfg, 2, 12).nbytes == dantinox.kv_cache_bytes(cfg, 2, 12)


@pytest.mark.both_backends
@pytest.mark.parametrize("layout", [dict(cache_dtype="int8"), dict(cache_layout="paged", page_size=5),
                                    dict(cache_layout="paged", page_size=3, cache_dtype="int8")],
                         ids=["ring-int8", "paged-ring", "paged-ring-int8"])
def test_rings_compose_with_int8_storage_and_paged_global_layers(layout):
    cfg, model = make(window=5, pattern="1:1", kv_heads=2, **layout)
    prompt = token_ids(2, 7)
    np.testing.assert_array_equal(dantinox.generate(model, prompt, 30), dantinox.generate(model, prompt, 30, False)
                                  if not cfg.quantized_cache else dantinox.generate(model, prompt, 30))
    float_cfg = cfg.replace(cache_dtype="float32", cache_layout="contiguous")
    same = quality.with_changes(model, cache_dtype="float32", cache_layout="contiguous")
    if not cfg.quantized_cache:  # paging changes where tokens live, not what attention computes
        np.testing.assert_array_equal(dantinox.generate(model, prompt, 30), dantinox.generate(same, prompt, 30))
    else:  # int8 rounding: the logits stay close to the float ring's
        ids_BT = token_ids(2, 23)
        err = quality.max_logit_error(quality.cached_logits(model, ids_BT), quality.cached_logits(same, ids_BT))
        assert err < 0.05 and float_cfg.sliding_window == 5


def test_the_ring_step_writes_in_place_and_copies_no_ring():
    """The compiled decode loop updates a ring layer's W slots in place (scatter into the donated buffer) and
    never forms a copy of the ring, nor the W + 1 slots a concatenation of ring and new token would make."""
    cfg = dantinox.ModelConfig.preset("test", sliding_windows=(5, None), kv_heads=2)
    graphdef, params = nnx.split(dantinox.Transformer(cfg, rngs=nnx.Rngs(0)))
    four, forty = jnp.full((2,), 4, jnp.int32), jnp.full((2,), 40, jnp.int32)
    state = prefill_jit(graphdef, params, jnp.asarray(token_ids(2, 4)), four, forty, 0,
                         dantinox.init_cache(cfg, 2, 64))
    ring, (B, K, W, H) = state.caches.layers[0], state.caches.layers[0].v.shape
    assert W == 5 and state.caches.layers[1].slots == 64
    program = decode_program(2, donate=True).lower(graphdef, params, state, None, 40, top_k=None, use_cache=True,
                                                   bucket=64).compile(compiler_options=LEARNER_COMPILE)
    hlo = program.as_text()
    for dims in ((B, K, H, W), (B, K, W, H)):  # keys (slot axis last) and values
        ring_shape = rf"f32\[{','.join(map(str, dims))}\]\{{[^}}]*\}}"
        made = re.findall(rf"= {ring_shape} ([\w-]+)\(([^)]*)\), (?:kind=\w+, )?(?:calls=%(\S+))?", hlo)
        assert {op for op, _, _ in made} <= {"parameter", "get-tuple-element", "fusion", "scatter",
                                              "dynamic-update-slice", "bitcast"}, made
        writes = [calls for op, _, calls in made if op == "fusion"]
        assert len(writes) == 1 and ("scatter" in writes[0] or "dynamic" in writes[0]), made  # in place
    assert f"f32[{B},{K},{W + 1},{H}]" not in hlo and f"f32[{B},{K},{H},{W + 1}]" not in hlo  # no ring + token
    out = program(params, state, None, 40)
    assert ring.k.is_deleted() and ring.v.is_deleted()  # donated: the loop wrote into the ring's own buffers
    assert out.index.tolist() == [40, 40]
