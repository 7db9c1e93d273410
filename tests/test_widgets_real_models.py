"""The real-models lab, headless: controls drive the ledger, a user's file loads, errors show in one line."""

from __future__ import annotations

import json

from dantinox.accounting.kv_ledger import kv_ledger
from dantinox.architectures.catalogue import catalogue
from widgets.real_models_lab import RealModelsLab, token_choices


def test_the_lab_reads_the_ledger_and_follows_its_controls(tmp_path):
    lab = RealModelsLab(model="gemma-3-27b", tokens=32_768)
    assert lab.error == "" and lab.reading.ledger.total_bytes == kv_ledger("gemma-3-27b", 32_768).total_bytes
    assert "52 of 62 layers are sliding" in lab.readout_html.value and "max context" in lab.readout_html.value
    assert [t.name for t in lab.layers_fig.data] == ["full", "sliding"]
    assert "vLLM" in lab.engines_html.value and "llama.cpp" in lab.engines_html.value
    lab.update(model="deepseek-v3", tokens=4096, batch=2, cache_dtype="int8")
    assert lab.reading.ledger.total_bytes == kv_ledger("deepseek-v3", 4096, 2, "int8").total_bytes
    assert [t.name for t in lab.layers_fig.data] == ["latent"] and "weights alone do not fit" in lab.readout_html.value
    lab.model.value = "llama-2-7b"  # a shorter context: the T stops follow the model
    assert lab.tokens.slider.options[-1][1] == 4096 and lab.tokens.value == 4096
    (tmp_path / "config.json").write_text(json.dumps({**catalogue()["qwen3-8b"]["config"], "global_head_dim": 512}))
    lab.path.value = str(tmp_path / "config.json")
    lab.load_button.click()
    assert "global_head_dim" in lab.error and "\n" not in lab.error
    (tmp_path / "config.json").write_text(json.dumps(catalogue()["qwen3-8b"]["config"]))
    lab.load_button.click()
    assert lab.model.value.startswith("your file") and lab.error == ""
    assert token_choices(40_960)[-2:] == [32_768, 40_960]


def test_typed_tokens_are_used_exactly_and_a_new_model_keeps_them(tmp_path, monkeypatch):
    lab = RealModelsLab(model="gemma-3-27b", tokens=131_072)
    assert lab.tokens.type("4096") and lab.tokens.value == 4096  # was ignored: every number stayed at 131,072
    assert lab.reading.ledger.tokens == 4096 and "T = 4,096" in lab.layers_fig.layout.title.text
    assert lab.tokens.type("100,000") and lab.reading.ledger.tokens == 100_000  # off the powers of two
    assert not lab.tokens.type("200000") and lab.reading.ledger.tokens == 100_000
    assert "from 1 to 131,072 tokens" in lab.tokens.message
    lab.tokens.type("3000")
    (tmp_path / "config.json").write_text(json.dumps(catalogue()["qwen3-8b"]["config"]))
    monkeypatch.setenv("HOME", str(tmp_path))
    lab.path.value = "~/config.json"  # '~' expanded as a shell would
    lab.load_button.click()
    assert lab.error == "" and lab.model.value.startswith("your file") and lab.tokens.value == 3000  # T kept
    lab.model.value = "llama-2-7b"
    assert lab.tokens.value == 3000 and lab.tokens.max == 4096


def test_the_readouts_say_what_limits_and_what_the_naive_formula_misses():
    lab = RealModelsLab(model="gemma-3-27b", tokens=512)  # T below the 1,024-token window
    html = lab.readout_html.value
    assert "not T = 512" not in html and "the window covers every token" in html
    assert "+0.0 %" not in html
    assert "context limit (max_position_embeddings)" in html  # 1 sequence: the model's limit stops it, not memory
    lab.update(batch=256, tokens=32_768)
    assert "memory limit" in lab.readout_html.value
    title = lab.layers_fig.layout.title.text
    assert "<br>" in title and len(title.split("<br>")[0]) < 70  # one long line was cut off


def test_the_fit_says_which_weights_format_it_assumes_and_takes_the_users():
    lab = RealModelsLab(model="gpt-oss-120b", tokens=32_768, device="H200 141GB")  # the published MXFP4 checkpoint
    html = lab.readout_html.value
    assert "4.25 bits (mxfp4, the published checkpoint&#x27;s format)" in html and "max batch" in html
    assert "href='https://arxiv.org/abs/2508.10925'" in html
    lab.update(weights_format="bf16")  # what the lab assumed for every model before: the weights alone do not fit
    assert "weights alone do not fit" in lab.readout_html.value and "published checkpoint is mxfp4" in \
        lab.readout_html.value
    lab.update(model="llama-3.1-8b", weights_format="published")
    assert "bf16 is assumed" in lab.readout_html.value and lab.reading.ledger.fit.weight_bytes == 16_000_000_000
