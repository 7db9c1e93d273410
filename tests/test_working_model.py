"""A working model of a published architecture: its real per-layer cache geometry runs (prefill, decode) and the
bytes of the cache it decodes with, read from the arrays, equal the ledger's (which tests/test_kv_ledger.py checks
against transformers' StaticCache)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dantinox.accounting.kv_ledger import kv_ledger, with_working_model
from dantinox.accounting.working_model import D_MODEL, measure_working_model, working_config
from dantinox.architectures.catalogue import catalogue, load_architecture
from dantinox.cache import cache_shapes, tree_nbytes

# what transformers allocates per layer, at T below, at and above each window (benchmarks/kv_conformance.py)
TRANSFORMERS = json.loads((Path(__file__).parent / "data" / "kv_conformance.json").read_text())
# the kinds the working model does not build, each refused in one line naming the layer: the ledger derives them


# Every kind the working model builds, once each (a run costs seconds: one dispatch per op and layer): gpt-oss
# above its window (sliding W = 128 beside full layers, int8 codes with scales), Llama 4 (chunked C = 8192 beside
# NoPE full layers), DeepSeek-V2 (60 MLA latent layers); Llama 3.2 through the command line, below. The shapes of
# every catalogue model's cache, at every T of the transformers fixture (Gemma 4's global layers with K and H of
# their own among them), are checked in the next test.
@pytest.mark.parametrize(("name", "tokens", "dtype"), [
    ("gpt-oss-20b", 131, "int8"), ("llama-4-scout", 9, "bfloat16"), ("deepseek-v2", 12, "bfloat16")])
def test_the_working_model_decodes_and_its_arrays_equal_the_ledger(name, tokens, dtype):
    arch = load_architecture(name)
    run = measure_working_model(arch, tokens, batch=2, cache_dtype=dtype)
    assert run.source == "arrays" and run.lengths == (run.prompt + run.decoded,) * 2 and run.decoded >= 1
    ledger = kv_ledger(arch, tokens, 2, dtype, measure=False)
    assert list(run.layer_bytes) == [row.bytes for row in ledger.rows]
    assert run.config.n_layers == len(arch.layers) and run.config.d_model == D_MODEL  # every layer, narrow width
    # gpt-oss decodes with its learned sink logits in every layer (weights: the bytes above are unchanged)
    assert {spec.learned_sinks for spec in run.config.layers} == {name == "gpt-oss-20b"}


def test_every_catalogue_model_equals_transformers_or_is_refused_in_one_line():
    """For every catalogue model the working model builds, the cache it decodes with (its pytree, as shapes: the
    decodes above show the arrays equal them) equals the ledger and what transformers allocates, layer by layer, at
    every T of the transformers fixture (below, at and above each window). What it does not build (MLA beside
    kinds other than linear attention, a linear layer with values wider than its keys) stops in one line."""
    built = []
    for name in catalogue():
        arch = load_architecture(name)
        kinds = {layer.kind for layer in arch.layers}
        refused = [f"keys of {layer.head_size} and values of {layer.value_size}" for layer in arch.layers
                   if layer.kind == "linear" and layer.value_size != layer.head_size][:1]
        if "latent" in kinds and len(kinds - {"latent", "linear"}):  # Kimi Linear's KDA beside MLA is built
            refused.append("MLA only with one latent width")
        if refused:
            with pytest.raises(ValueError) as excinfo:
                working_config(arch, 10)
            message = str(excinfo.value)
            assert "\n" not in message and message.startswith(f"{name}: ") and refused[0] in message, message
            continue
        built.append(name)
        sinks = {spec.learned_sinks for spec in working_config(arch, 10).layers}
        assert sinks == {arch.model_type == "gpt_oss"}, name  # gpt-oss's sink logits, in every layer
        batch = TRANSFORMERS["batch"]
        # an entry not yet in the fixture (its checked_against says so): below and above its smallest window
        windows = [layer.window for layer in arch.layers if layer.window]
        fixture = TRANSFORMERS["models"].get(name, {"tokens": {t: None for t in (37, min(windows or [300]) + 3)}})
        for tokens, runs in fixture["tokens"].items():
            tokens = int(tokens)
            shapes = cache_shapes(working_config(arch, tokens), batch, tokens)
            ledger = [r.bytes for r in kv_ledger(arch, tokens, batch, measure=False).rows]
            assert [tree_nbytes(p) for p in shapes.layers] == ledger, (name, tokens)
            if runs is not None:
                assert ledger == [sum(t[2] for t in held.values()) for count, _, held in runs for _ in range(count)]
    assert len(built) >= 25 and "kimi-linear-48b-a3b" in built  # MLA beside Kimi Delta Attention


def test_over_the_guard_the_same_run_is_measured_as_shapes():
    arch = load_architecture("llama-3.2-1b")
    run = measure_working_model(arch, 20, guard=0)
    assert run.source == "shapes" and run.total_bytes == kv_ledger(arch, 20, measure=False).total_bytes


def test_cli_measure_prints_measured_bytes_beside_the_ledger(capsys, tmp_path):
    from dantinox_labs.cli import main

    assert main(["kv", "llama-3.2-1b", "--tokens", "8", "--batch", "2", "--measure", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["model", "tokens", "batch", "cache_dtype", "total_bytes", "per_token_bytes",
                         "measured_total_bytes", "measured_from", "layers"]
    assert out["measured_from"] == "working model arrays" and out["measured_total_bytes"] == out["total_bytes"]
    assert all(list(r) == ["layer", "kind", "slots", "bytes", "measured_bytes"] and r["measured_bytes"] == r["bytes"]
               for r in out["layers"]) and len(out["layers"]) == 16
    assert out["total_bytes"] == 16 * 2 * 8 * 2 * 8 * 64 * 2  # L · B · T · 2·K·H · 2 bytes
    assert main(["kv", "llama-3.2-1b", "--tokens", "8", "--batch", "2", "--measure"]) == 0  # the same run, kept
    text = capsys.readouterr().out
    assert "measured (each layer)" in text and "measured from the arrays of a working model" in text
    ledger = with_working_model(kv_ledger("llama-3.2-1b", 8, 2, measure=False), "llama-3.2-1b")
    assert ledger.measured_from == "working model arrays" and ledger.to_json() == out
    unequal = {"model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 64, "linear_num_key_heads": 2,
               "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 32,
               "linear_conv_kernel_dim": 4}  # Gated DeltaNet with values wider than keys: not built
    (tmp_path / "config.json").write_text(json.dumps(unequal))
    assert main(["kv", str(tmp_path / "config.json"), "--tokens", "8", "--measure"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "keys of 16 and values of 32" in err and "layer 0" in err


def test_cli_measure_reads_deepseek_v32s_read_bytes_from_the_arrays_its_step_gathered(capsys, tmp_path):
    """DeepSeek-V3.2's entry cut to 2 of its 61 layers (the same per-layer geometry: C = 512, R = 64, I = 128,
    k = 2,048), below and above k: a decode step reads every indexer key and min(T, k) latents, and the
    working model's `measured_read_bytes` come from the arrays its top-k selection gathered."""
    from dantinox.architectures.catalogue import catalogue
    from dantinox_labs.cli import main

    entry = catalogue()["deepseek-v3.2"]["config"]
    (tmp_path / "config.json").write_text(json.dumps({**entry, "num_hidden_layers": 2}))
    for tokens in (2000, 2100):  # below and above index_topk = 2048
        assert main(["kv", str(tmp_path / "config.json"), "--tokens", str(tokens), "--measure", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["measured_from"] == "working model arrays"
        per_layer = tokens * 128 * 2 + min(tokens, 2048) * (512 + 64) * 2  # indexer keys + the latents read
        for row in out["layers"]:
            assert row["measured_read_bytes"] == row["read_bytes"] == per_layer
            assert row["measured_bytes"] == row["bytes"] == tokens * (512 + 64 + 128) * 2
        assert out["measured_read_total_bytes"] == out["read_total_bytes"] == 2 * per_layer
    assert main(["kv", str(tmp_path / "config.json"), "--tokens", "2100", "--measure"]) == 0
    assert f"the indexer keys it scored): {2 * per_layer:,} B" in capsys.readouterr().out
