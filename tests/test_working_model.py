"""A working model of a published architecture: its real per-layer cache geometry runs (prefill, decode) and the
bytes of the cache it decodes with, read from the arrays, equal the ledger's (which tests/test_kv_ledger.py checks
against transformers' StaticCache)."""

from __future__ import annotations

import json

import pytest

from dantinox.accounting.kv_ledger import kv_ledger, with_working_model
from dantinox.accounting.working_model import D_MODEL, measure_working_model, working_config
from dantinox.architectures.catalogue import catalogue, load_architecture
from dantinox.cache import cache_shapes, tree_nbytes


# Every kind the working model builds, once each (a run costs seconds: one dispatch per op and layer): gpt-oss
# above its window (sliding W = 128 beside full layers, int8 codes with scales), Llama 4 (chunked C = 8192 beside
# NoPE full layers), DeepSeek-V2 (60 MLA latent layers); Llama 3.2 through the command line, below. The shapes of
# every catalogue model's cache, at T below and above each window, are checked in the next test.
@pytest.mark.parametrize(("name", "tokens", "dtype"), [
    ("gpt-oss-20b", 131, "int8"), ("llama-4-scout", 9, "bfloat16"), ("deepseek-v2", 12, "bfloat16")])
def test_the_working_model_decodes_and_its_arrays_equal_the_ledger(name, tokens, dtype):
    arch = load_architecture(name)
    run = measure_working_model(arch, tokens, batch=2, cache_dtype=dtype)
    assert run.source == "arrays" and run.lengths == (run.prompt + run.decoded,) * 2 and run.decoded >= 1
    ledger = kv_ledger(arch, tokens, 2, dtype, measure=False)
    assert list(run.layer_bytes) == [row.bytes for row in ledger.rows]
    assert run.config.n_layers == len(arch.layers) and run.config.d_model == D_MODEL  # every layer, narrow width


def test_every_catalogue_model_gets_its_geometry_or_a_one_line_refusal():
    """The working model's whole cache (the pytree it decodes with, as shapes) equals the ledger at T below and
    above each window, for every catalogue model it builds; a recurrent-state kind stops in one line."""
    for name in catalogue():
        arch = load_architecture(name)
        kinds = {layer.kind for layer in arch.layers}
        if kinds & {"mamba", "mlp"}:
            with pytest.raises(ValueError, match="Mamba-2 state|MLP block") as excinfo:
                working_config(arch, 10)
            assert "\n" not in str(excinfo.value)
            continue
        windows = [layer.window for layer in arch.layers if layer.window and layer.window < 5000]
        for tokens in {37, (min(windows) + 3) if windows else 300}:
            cfg = working_config(arch, tokens)
            shapes = cache_shapes(cfg, 1, tokens)
            ledger = kv_ledger(arch, tokens, 1, measure=False)
            assert [tree_nbytes(p) for p in shapes.layers] == [r.bytes for r in ledger.rows], (name, tokens)


def test_over_the_guard_the_same_run_is_measured_as_shapes():
    arch = load_architecture("llama-3.2-1b")
    run = measure_working_model(arch, 20, guard=0)
    assert run.source == "shapes" and run.total_bytes == kv_ledger(arch, 20, measure=False).total_bytes


def test_cli_measure_prints_measured_bytes_beside_the_ledger(capsys):
    from dantinox_labs.cli import main

    assert main(["kv", "llama-3.2-1b", "--tokens", "8", "--batch", "2", "--measure", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["model", "tokens", "batch", "cache_dtype", "total_bytes", "per_token_bytes",
                         "measured_total_bytes", "measured_from", "layers"]
    assert out["measured_from"] == "working model arrays" and out["measured_total_bytes"] == out["total_bytes"]
    assert all(list(r) == ["layer", "kind", "slots", "bytes", "measured_bytes"] and r["measured_bytes"] == r["bytes"]
               for r in out["layers"]) and len(out["layers"]) == 16
    assert out["total_bytes"] == 16 * 2 * 8 * 2 * 8 * 64 * 2  # L · B · T · 2·K·H · 2 bytes
    assert main(["kv", "llama-3.2-1b", "--tokens", "8", "--measure"]) == 0
    text = capsys.readouterr().out
    assert "measured (each layer)" in text and "measured from the arrays of a working model" in text
    ledger = with_working_model(kv_ledger("llama-3.2-1b", 8, 2, measure=False), "llama-3.2-1b")
    assert ledger.measured_from == "working model arrays" and ledger.to_json() == out
    assert main(["kv", "nemotron-h-8b", "--tokens", "8", "--measure"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Mamba-2 state" in err and "layer 0" in err
