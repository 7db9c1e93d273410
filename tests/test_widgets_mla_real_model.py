"""The MLA lab's real-model section (widgets/mla_real_model.py), headless: stored rows and formulas, live decode."""

import numpy as np
import pytest
from flax import nnx
from invariants import token_ids

import content
import dantinox
from widgets.mla_real_model import RealModelMlaLab, decode_live, load_variants


@pytest.fixture(scope="module")
def entry():
    return content.load_entry("multi-head-latent-attention")


def test_every_stored_variant_reads_with_its_cache_equal_to_the_content_formula(entry):
    stored = load_variants()
    lab = RealModelMlaLab(entry)
    labels = [label for label in lab.variant.options]
    assert {"MHA", "GQA (published)", "MQA"} <= set(labels) and sum(la.startswith("MLA C=") for la in labels) >= 3
    for label in labels:
        lab.variant.value = label
        r = lab.reading
        assert lab.error == "" and r.residual == 0, label  # measured arrays == the content formula, to the byte
        converted = r.row["convert"] is not None
        assert ("converted, not retrained" in lab.readout_html.value) == converted
    gqa = next(r for r in stored["rows"] if r["convert"] is None)
    mha = next(r for r in stored["rows"] if r["convert"] == "mha")
    assert mha["cache_bytes_512"] == 3 * gqa["cache_bytes_512"]


def test_an_unknown_variant_is_refused_in_one_line(entry):
    lab = RealModelMlaLab(entry)
    with pytest.raises(ValueError, match="^variant: expected one of MHA, "):
        lab.update(variant="MLA C=7")


def test_live_decode_measures_the_latent_cache_the_converted_model_wrote():
    cfg = dantinox.ModelConfig.preset("test", kv_heads=2)
    model = dantinox.convert_attention(dantinox.Transformer(cfg, rngs=nnx.Rngs(0)), "mla", latent_dim=12,
                                       rope_pairs=2, calibration_ids=token_ids(1, 16))

    class Bytes:  # the byte-level tokenizer of the test preset, as decode_live calls it
        def encode(self, text):
            return list(text.encode())

        def decode(self, ids, skip_special=True):
            return bytes(i for i in ids if i < 256).decode(errors="replace")

    d = decode_live(model, Bytes(), "latent", 5)
    assert d["tokens"] == 11 and d["payload"] == "LatentCache"
    assert d["cache_bytes"] == d["formula_bytes"] == cfg.n_layers * 11 * (12 + 8) * 4
    assert d["shapes"]["ckv"] == [1, 11, 20]


def test_the_button_decodes_with_the_selected_model(entry, smollm, monkeypatch):
    import widgets.mla_real_model as section
    from widgets._a11y import LIVE

    lab = RealModelMlaLab(entry, variant="GQA (published)")
    lab.prompt.value = "The cache"
    held, decode = [], section.decode_live

    def watched(*args):  # seconds here, a minute the first time: the lab says it works and holds its controls
        held.append((lab.status_html.value, [c.disabled for c in (lab.variant, lab.prompt, lab.new_tokens,
                                                                  lab.button)]))
        return decode(*args)

    monkeypatch.setattr(section, "decode_live", watched)
    lab.button.click()
    assert lab.error == "", lab.error
    assert "working… decoding 16 new tokens with GQA (published)" in held[0][0] and all(held[0][1])
    assert LIVE in lab.status_html._dom_classes and "Decoded 16 new tokens" in lab.status_html.value
    assert not any(c.disabled for c in (lab.variant, lab.prompt, lab.new_tokens, lab.button))
    d = lab.decoded
    assert d["cache_bytes"] == d["formula_bytes"] == 30 * d["tokens"] * 2 * 3 * 64 * 4
    assert "nbytes of the arrays the model wrote" in lab.decode_html.value
    assert np.isfinite(d["seconds"])
