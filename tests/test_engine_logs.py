"""Published engine log lines (benchmarks/data/engine-logs.json) against the project's engine rules."""

import json
import re
from pathlib import Path

import pytest

from dantinox.accounting.engine_logs import DIFFERS, EQUAL, ROUNDING, architecture, predict
from dantinox.accounting.peer_allocation import llama_cpp_column as llama_column
from dantinox.accounting.peer_allocation import (
    llama_cpp_size_lines,
    state_elements,
    vllm_column,
    vllm_hybrid_block,
    vllm_pool,
)
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
    assert {frozenset({"full"}), frozenset({"full", "sliding"}), frozenset({"full", "linear"}),
            frozenset({"full", "mamba"})} <= kinds
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


def test_vllm_grows_the_attention_block_to_the_state_page_and_pads_the_state_page_to_it():
    """vLLM's hybrid config (vllm/model_executor/models/config.py, HybridAttentionMambaModelConfig): attention
    block B = 16 · ceil(state page / (16 · attention bytes per token)); the state page padded to B tokens' bytes.
    Every number below is derived by hand from the configs and that rule."""
    qwen = load_architecture("qwen3-next-80b-a3b")  # 36 Gated DeltaNet + 12 full layers, bf16
    state = 3 * (2 * 16 * 128 + 32 * 128) * 2 + 32 * 128 * 128 * 2  # (conv - 1) inputs of q, k, v; V·d_k·d_v
    assert state == 1_097_728
    token = 2 * 2 * 256 * 2  # K = 2 heads of 256, keys and values
    block = vllm_hybrid_block(qwen)
    assert (block.state_bytes, block.token_bytes) == (state, token)
    assert block.block_tokens == 16 * 34 == 544  # 1,097,728 / (16 · 2,048) = 33.5 -> 34 sixteen-token steps
    assert block.page_bytes == 544 * 2048 == 1_114_112 and f"{block.padding_percent:.2f}" == "1.49"
    assert vllm_hybrid_block(qwen, block_size=1024).block_tokens == 1024  # a larger --block-size is kept
    assert vllm_hybrid_block(qwen, block_size=16).block_tokens == 544  # a smaller one is overridden
    pool = vllm_pool(qwen, 10 * 2**30)
    assert pool.group_size == 12 and [kind for kind, _ in pool.groups].count("state") == 3  # 36 / 12
    assert len(pool.groups) == 4 and pool.num_blocks == 10 * 2**30 // (1_114_112 * 12) == 803
    assert pool.tokens == 803 // 4 * 544 == 108_800  # blocks // groups · the attention block
    column = vllm_column(qwen, 1000, 1)
    full, linear = (next(layer.index for layer in qwen.layers if layer.kind == k) for k in ("full", "linear"))
    assert column.per_layer_bytes[full] == 2 * 1_114_112  # ceil(1000 / 544) pages of 544 tokens
    assert column.per_layer_bytes[linear] == 1_114_112  # one padded page per sequence, at any T
    qwen35 = vllm_hybrid_block(load_architecture("qwen3.5-9b"))  # its config's mamba_ssm_dtype: a float32 state
    assert qwen35.state_bytes == 3 * (2 * 16 * 128 + 32 * 128) * 2 + 32 * 128 * 128 * 4 == 2_146_304
    assert qwen35.block_tokens == 16 * 33 == 528 and f"{qwen35.padding_percent:.2f}" == "0.76"  # K = 4 of 256
    nemotron = vllm_hybrid_block(load_architecture("nemotron-h-8b"))  # Mamba-2: 128 heads of 64, 8 groups
    assert nemotron.state_bytes == (3 * (128 * 64 + 2 * 8 * 128) + 128 * 64 * 128) * 2 == 2_158_592
    assert nemotron.block_tokens == 16 * 33 == 528 and f"{nemotron.padding_percent:.2f}" == "0.19"
    lfm2 = vllm_hybrid_block(load_architecture("lfm2-1.2b"))  # a short convolution keeps conv - 1 inputs
    assert lfm2.state_bytes == 2 * 2048 * 2 and lfm2.block_tokens == 16  # 8 KiB fit one 16-token page
    assert lfm2.page_bytes == 16 * 2 * 8 * 64 * 2 and lfm2.padding_percent == 300.0
    with pytest.raises(ValueError) as e:  # Kimi Linear: MLA beside Kimi Delta Attention
        vllm_pool(load_architecture("kimi-linear-48b-a3b"), 2**34)
    assert "\n" not in str(e.value) and str(e.value).startswith("kimi-linear-48b-a3b: ") and "MLA" in str(e.value)


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
