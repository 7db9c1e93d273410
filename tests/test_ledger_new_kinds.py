"""The ledger and the working model for the conv (LFM2), mamba (Mamba-2), mlp and indexed-latent
(DeepSeek-V3.2) kinds: a config's fields read into each layer's geometry, the ledger's formula, and the bytes
of the arrays a working model decodes with, equal at every step; DeepSeek-V3.2's rows say what a step reads
beside what is stored."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dantinox.accounting.kv_ledger import kv_ledger
from dantinox.architectures.catalogue import load_architecture, parse_config

# Tiny configs of the published model types (the fields transformers' Lfm2Config, DeepseekV32Config and
# NemotronHConfig read), narrow so that a working model decodes in a second.
LFM2 = {"model_type": "lfm2", "hidden_size": 48, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 64, "conv_L_cache": 3,
        "layer_types": ["conv", "full_attention", "conv", "full_attention"]}
DSV32 = {"model_type": "deepseek_v32", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "kv_lora_rank": 32, "qk_rope_head_dim": 8, "max_position_embeddings": 64, "index_head_dim": 16,
         "index_topk": 4, "index_n_heads": 8}
NEMOTRON = {"model_type": "nemotron_h", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 2, "attention_head_dim": 16, "max_position_embeddings": 64,
            "hybrid_override_pattern": "M-*E", "mamba_num_heads": 4, "mamba_head_dim": 8, "ssm_state_size": 6,
            "n_groups": 2, "conv_kernel": 4}


def test_the_config_fields_give_each_layer_its_geometry():
    lfm2 = parse_config(LFM2, "lfm2.json")
    assert [layer.kind for layer in lfm2.layers] == ["conv", "full", "conv", "full"]
    assert (lfm2.layers[0].channels, lfm2.layers[0].conv) == (48, 3)
    older = {**{k: v for k, v in LFM2.items() if k != "layer_types"}, "full_attn_idxs": [1, 3]}  # older files
    assert parse_config(older, "lfm2.json").layers == lfm2.layers
    dsv32 = parse_config(DSV32, "dsv32.json")
    geometry = {(g.kind, g.latent, g.rope, g.indexer, g.index_topk) for g in dsv32.layers}
    assert geometry == {("latent", 32, 8, 16, 4)}
    with pytest.raises(ValueError) as excinfo:  # the indexer's fields on a model type that has none
        parse_config({**DSV32, "model_type": "deepseek_v3"}, "c.json")
    assert str(excinfo.value).startswith("c.json: index_head_dim: this field changes the cache")


def hybrid():
    """Every new kind in one architecture: LFM2's conv and full layers, then Nemotron-H's mamba, mlp, full."""
    layers = parse_config(LFM2, "lfm2.json").layers + parse_config(NEMOTRON, "n.json").layers
    layers = tuple(dataclasses.replace(layer, index=i) for i, layer in enumerate(layers))
    return dataclasses.replace(parse_config(LFM2, "lfm2.json", "hybrid"), layers=layers)


def test_the_working_model_decodes_and_its_arrays_equal_the_ledger_at_every_step():
    """The working model of an architecture with conv, mamba, mlp and full layers decodes a token per compiled
    step (widgets/cache_fill.py, the lab's view; `dantinox kv --measure` runs the same model op by op): each
    layer's bytes equal the ledger's after every step, the states stay flat while the full layers grow."""
    from widgets.cache_fill import decode_fill, disagreements, fill_plan

    plan = fill_plan(hybrid(), tokens=6)
    assert plan.kinds == ("conv", "full", "conv", "full", "mamba", "mlp", "full", "mlp")
    steps = [step for step, _ in decode_fill(plan)]
    assert disagreements(plan, steps) == [] and len(steps) == 6
    assert [steps[0].bytes[i] for i in (0, 4, 5)] == [steps[-1].bytes[i] for i in (0, 4, 5)]  # flat in T
    assert steps[-1].bytes[1] == 6 * steps[0].bytes[1] > 0  # the full layer grows by one slot per token
    assert steps[-1].bytes[5] == 0  # an MLP-only block stores nothing


def test_the_ledger_sizes_each_state_from_its_formula():
    lfm2 = kv_ledger(parse_config(LFM2, "lfm2.json"), 10, 3)
    assert lfm2.rows[0].bytes == 3 * 48 * 3 * 2  # B · hidden · conv_L_cache, bf16
    nemotron = kv_ledger(parse_config(NEMOTRON, "n.json"), 10, 3)
    assert [r.kind for r in nemotron.rows] == ["mamba", "mlp", "full", "mlp"]
    assert nemotron.rows[0].bytes == 3 * (4 * 8 * 6 * 4 + (4 * 8 + 2 * 2 * 6) * 4 * 2)  # heads·P·N f32, conv
    assert nemotron.rows[1].bytes == nemotron.rows[3].bytes == 0


def test_deepseek_v32_stores_latent_and_indexer_key_but_reads_k_latents():
    arch = parse_config(DSV32, "dsv32.json")
    for tokens, cache_dtype, s, scale in ((3, "bfloat16", 2, 0), (50, "bfloat16", 2, 0), (50, "int8", 1, 4)):
        ledger = kv_ledger(arch, tokens, 2, cache_dtype)
        latent, key = (32 + 8) * s + scale, 16 * s + scale
        assert [r.bytes for r in ledger.rows] == [2 * tokens * (latent + key)] * 2  # stored: T of both
        assert [r.measured_bytes for r in ledger.rows] == [r.bytes for r in ledger.rows]
        read = 2 * (tokens * key + min(4, tokens) * latent)  # read: every indexer key, k = 4 latents
        assert [r.read_bytes for r in ledger.rows] == [read] * 2 and ledger.read_total_bytes == 2 * read
    out = json.loads(json.dumps(kv_ledger(arch, 50, 1).to_json()))
    assert out["read_total_bytes"] < out["total_bytes"] and all("read_bytes" in r for r in out["layers"])
    assert "read_bytes" not in kv_ledger(parse_config(LFM2, "lfm2.json"), 50, 1).to_json()["layers"][0]


def test_the_cache_fill_view_reads_k_latents_and_every_indexer_key():
    from widgets.cache_fill import decode_fill, disagreements, fill_plan, kind_summary

    plan = fill_plan(parse_config(DSV32, "c.json", "dsv32"), tokens=6)
    steps = [step for step, _ in decode_fill(plan)]
    assert plan.index_per_slot == (16 * 2,) * 2 and plan.per_slot == ((32 + 8 + 16) * 2,) * 2  # bf16
    assert [s.read for s in steps] == [(min(n, 4),) * 2 for n in range(1, 7)]  # top k = 4 of n tokens
    assert steps[-1].read_bytes == (6 * 32 + 4 * 80,) * 2 and disagreements(plan, steps) == []
    assert "read 4 latents (its top k = 4)" in dict(kind_summary(plan, steps[-1]))["2 latent layers"]


def test_the_sparse_attention_entry_computes_what_dantinox_stores_and_reads():
    """sparse-attention-indexer's two equations equal the ledger's stored bytes and the bytes a step reads as
    accounting/memory.py counts them for the working model (an independent sum)."""
    import content
    from dantinox.accounting.memory import kv_read_bytes
    from dantinox.accounting.working_model import working_config

    arch = parse_config(DSV32, "dsv32.json")
    entry = content.load_entry("sparse-attention-indexer")
    shape = dict(L=len(arch.layers), C=32, R=8, d_I=16, bytes=2, bytes_I=2)
    for tokens in (3, 50):
        assert content.evaluate(entry, "Cache stored with a lightning indexer", B=2, T=tokens, **shape) == \
            kv_ledger(arch, tokens, 2).total_bytes
        read = content.evaluate(entry, "Cache read by one sparse decode step", B=2, T=tokens, k=4, **shape)
        assert read == kv_ledger(arch, tokens, 2).read_total_bytes
        assert read == kv_read_bytes(working_config(arch, tokens), 2, tokens)


def test_mtp_layers_count_only_when_an_engine_drafts_with_them():
    """DeepSeek-V3's one MTP layer (DeepseekV3Config's default num_nextn_predict_layers): plain decoding caches
    it nowhere; an engine drafting with it (vLLM's deepseek_mtp) caches one more latent layer."""
    plain = kv_ledger("deepseek-v3", 1000, 2)
    drafting = kv_ledger("deepseek-v3", 1000, 2, mtp=True)
    assert len(plain.rows) == 61 and len(drafting.rows) == 62 and drafting.rows[-1].layer == 61
    assert drafting.total_bytes == plain.total_bytes * 62 // 61 == drafting.measured_bytes
    assert drafting.naive_bytes == plain.naive_bytes  # a calculator counts num_hidden_layers
    assert "not counted" in plain.notes[-1] and "deepseek_mtp" in drafting.notes[-1]
    assert kv_ledger("deepseek-v2", 1000).notes == ()  # DeepSeek-V2 has no MTP module
    with_three = parse_config({**DSV32, "num_nextn_predict_layers": 3}, "c.json")
    assert with_three.mtp_layers == 3 and len(with_three.with_mtp_layers().layers) == 5


def test_deepseek_v32s_published_mtp_layer_counts_as_deepseek_v3s(capsys):
    """The catalogue's DeepSeek-V3.2 declares its one MTP layer (num_nextn_predict_layers 1, as published):
    `dantinox kv --mtp` counts it by the rule DeepSeek-V3's follows (vLLM's deepseek_mtp: one more layer of the
    last layer's geometry, here a latent with its indexer key), plain decoding by none."""
    from dantinox_labs.cli import main

    assert load_architecture("deepseek-v3.2").mtp_layers == load_architecture("deepseek-v3").mtp_layers == 1
    for name in ("deepseek-v3", "deepseek-v3.2"):
        plain, drafting = kv_ledger(name, 1000, 2), kv_ledger(name, 1000, 2, mtp=True)
        assert len(drafting.rows) == 62 and drafting.rows[-1].layer == 61
        assert drafting.rows[-1].bytes == plain.rows[-1].bytes and drafting.rows[-1].kind == "latent"
        assert drafting.total_bytes == plain.total_bytes * 62 // 61 == drafting.measured_bytes
        assert "deepseek_mtp" in drafting.notes[-1] and "not counted" in plain.notes[-1]
    per_layer = 2 * 1000 * (512 + 64 + 128) * 2  # B · T · (C + R + I) · 2 bytes
    assert main(["kv", "deepseek-v3.2", "--tokens", "1000", "--batch", "2", "--mtp", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["layers"]) == 62 and out["total_bytes"] == 62 * per_layer
    assert main(["kv", "deepseek-v3.2", "--tokens", "1000", "--batch", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total_bytes"] == 61 * per_layer
