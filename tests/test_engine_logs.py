"""Published engine log lines (benchmarks/data/engine-logs.json) against the project's engine rules."""

import json
import re
from pathlib import Path

import pytest

from dantinox.accounting.engine_logs import DIFFERS, EQUAL, ROUNDING, architecture, predict
from dantinox.accounting.peer_allocation import llama_cpp_column as llama_column
from dantinox.accounting.peer_allocation import llama_cpp_size_lines, state_elements, vllm_pool
from dantinox.architectures.catalogue import load_architecture

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "engine-logs.json"
ROWS = json.loads(DATA.read_text())["rows"]


def test_every_published_line_is_predicted_equal_or_within_the_printed_memorys_rounding():
    kinds = set()
    for i, row in enumerate(ROWS):
        p = predict(row, f"rows[{i}]")
        assert p.relation in (EQUAL, ROUNDING), (row["url"], row["line"], p)
        assert (p.shown, p.low, p.high, p.relation) == (row["predicted"], row["low"], row["high"],
                                                       row["relation"]), "run benchmarks/engine_logs.py"
        kinds.add(frozenset(layer.kind for layer in architecture(row, "row").layers) - {"mlp"})
        assert row["url"].startswith("https://github.com/") and row["settings_text"]
    assert len(ROWS) >= 8
    assert {frozenset({"full"}), frozenset({"full", "sliding"}), frozenset({"full", "linear"})} <= kinds
    assert {row["engine"] for row in ROWS} == {"vLLM", "llama.cpp"}


def test_llama_cpp_rows_name_the_cells_and_layers_the_rules_give():
    for row in (r for r in ROWS if r["engine"] == "llama.cpp"):
        cells, layers = map(int, re.search(r"\(\s*(\d+) cells,\s*(\d+) layers", row["line"]).groups())
        s = row["settings"]
        lines = llama_cpp_size_lines(architecture(row, "row"), s["n_ctx"], s["cache_dtype"],
                                     s.get("swa_full", True), s["n_seq"], s.get("pad", 256))
        line = lines[row["quantity"].split("_")[1]]
        assert (line["cells"], line["layers"]) == (cells, layers), row["line"]
    # the 2025 release padded to 32 cells without flash attention: today's 256 would not give its 2016 cells
    old = next(r for r in ROWS if r["settings"].get("pad") == 32 and r["quantity"] == "llama_kv_mib")
    assert predict({**old, "settings": {**old["settings"], "pad": 256}}).relation == DIFFERS


def test_a_published_number_the_rules_do_not_give_is_reported_as_a_difference():
    tokens = next(r for r in ROWS if r["quantity"] == "vllm_tokens" and r["relation"] == EQUAL)
    assert predict({**tokens, "published": tokens["published"] + 10_000}).relation == DIFFERS
    state = next(r for r in ROWS if r["quantity"] == "llama_recurrent_mib")
    assert predict({**state, "published": state["published"] + 0.01}).relation == DIFFERS


@pytest.mark.parametrize("change, field", [({"quantity": "gpu_tokens"}, "quantity"),
                                           ({"settings": {"max_model_len": 4}}, "settings.available_gib"),
                                           ({"published": "42k"}, "published")])
def test_a_bad_row_is_refused_in_one_line_naming_its_field(change, field):
    with pytest.raises(ValueError) as e:
        predict({**ROWS[0], **change}, "rows[0]")
    assert "\n" not in str(e.value) and field in str(e.value) and str(e.value).startswith("rows[0]")


def test_vllm_groups_share_one_page_size_and_count_the_pool_as_if_every_layer_held_every_token():
    avail = 10 * 2**30
    oss = vllm_pool(load_architecture("gpt-oss-120b"), avail)
    assert oss.groups == (("sliding", 16), ("full", 16)) and oss.group_size == 18
    assert oss.num_blocks == avail // (16 * 2 * 8 * 64 * 2 * 18)  # a pool page: one page in 18 layers
    assert oss.tokens == oss.num_blocks // 2 * 16
    assert abs(oss.tokens - avail / (36 * 2 * 8 * 64 * 2)) <= 2 * 16  # as if all 36 layers held every token
    gemma = vllm_pool(load_architecture("gemma-4-31b"), 2**34)
    assert gemma.group_size == 10 and len(gemma.groups) == 6  # 10 full + 50 sliding: 1 + 5 groups of 10
    assert dict(gemma.groups)["full"] == 32  # 4 × 512 per token against 16 × 256: twice the tokens per page
    with pytest.raises(ValueError, match="state"):
        vllm_pool(load_architecture("qwen3-next-80b-a3b"), 2**34)


def test_llama_cpp_keeps_one_f32_state_cell_per_sequence_for_state_layers():
    arch = load_architecture("granite-4.0-h-tiny")
    mamba = next(layer for layer in arch.layers if layer.kind == "mamba")
    column = llama_column(arch, 4096, n_seq=3)
    assert column.per_layer_bytes[mamba.index] == 3 * 4 * (
        (mamba.conv - 1) * mamba.channels + mamba.value_heads * mamba.value_size * mamba.state_size)
    assert llama_column(arch, 100_000, n_seq=3).per_layer_bytes[mamba.index] == \
        column.per_layer_bytes[mamba.index]  # constant in n_ctx
    qwen = load_architecture("qwen3.5-9b")
    linear = next(layer for layer in qwen.layers if layer.kind == "linear")
    assert state_elements(linear) == 3 * (2 * 16 * 128 + 32 * 128) + 32 * 128 * 128
    with pytest.raises(ValueError, match="n_seq"):
        llama_column(qwen, 4096, n_seq=0)
