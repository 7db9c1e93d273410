"""The memory-savers measurements (tiny runs and SmolLM2), the quality metrics and the lab widgets (headless)."""

import json
import math

import numpy as np
import pytest

import content
import dantinox
from dantinox.generation import quality
from dantinox_labs import shipped
from widgets.memory_savers_lab import MEASUREMENTS, MemorySaversLab, load_measurements, quantize_key, ring_table
from widgets.real_model_savers_lab import RealModelSaversLab, kept_spans, kivi_quantize, load_smol_measurements

DATA = load_measurements()


def test_every_family_was_measured():
    families = {r["family"] for r in DATA["rows"]}
    assert {"baseline", "quantized", "heads", "latent", "window", "combined"} <= families


@pytest.mark.parametrize("row", DATA["rows"], ids=lambda r: r["label"])
def test_stored_bytes_are_the_arrays_and_the_formula_of_todays_code(row):
    cfg = dantinox.ModelConfig.from_dict(row["config"])
    measured = dantinox.tree_nbytes(dantinox.init_cache(cfg, 1, DATA["tokens"]))
    entry_id, title, variables = quality.formula_for(cfg, 1, DATA["tokens"])
    assert row["bytes"] == measured == content.evaluate(content.load_entry(entry_id), title, **variables)
    assert row["bytes_per_token"] == measured / DATA["tokens"]


def test_quality_numbers_are_consistent():
    base = next(r for r in DATA["rows"] if r["family"] == "baseline")
    assert base["agreement_vs_mha"] == 1.0 and base["max_logit_error"] == 0.0
    for r in DATA["rows"]:
        assert math.isclose(r["delta_bits_per_byte"], r["bits_per_byte"] - base["bits_per_byte"], abs_tol=1e-12)
        assert 0 < r["bits_per_byte"] < 9 and 0 <= r["agreement_vs_mha"] <= 1
    quantized = [r for r in DATA["rows"] if r["cache_dtype"] in ("int8", "fp8_e4m3")]
    assert quantized and all(0 < r["max_logit_error"] and r["agreement_vs_own_float"] < 1 for r in quantized)


def test_metrics_on_known_logits():
    ids = np.array([[1, 2, 3]])
    uniform = np.zeros((1, 3, 259), np.float32)
    assert math.isclose(quality.bits_per_byte(uniform, ids), math.log2(259), rel_tol=1e-6)
    sure = np.full((1, 3, 259), -50.0, np.float32)
    sure[0, 0, 2] = sure[0, 1, 3] = 50.0
    assert quality.bits_per_byte(sure, ids) < 1e-6
    assert quality.agreement(sure, sure) == 1.0 and quality.agreement(sure, uniform) == pytest.approx(1 / 3)
    assert quality.max_logit_error(sure, uniform) == 50.0


def test_heldout_chunks_and_errors():
    rows = quality.heldout_chunks("abcdefghij", 4)
    assert rows.tolist() == [[97, 98, 99, 100], [101, 102, 103, 104]]
    with pytest.raises(ValueError, match="text: needs at least 8 bytes"):
        quality.heldout_chunks("short", 8)
    text = shipped.heldout_text()
    assert quality.heldout_chunks(text, 256).shape[0] == DATA["heldout_rows"]


def test_lab_highlights_the_selection_and_shows_its_numbers():
    lab = MemorySaversLab(selection="MHA int8")
    assert lab.error == ""
    for label in ("GQA K=2", "MHA fp8 e4m3"):
        lab.update(selection=label)
        row = next(r for r in DATA["rows"] if r["label"] == label)
        ring = lab.figure.data[-1]  # the red ring marks the learner's selection
        assert ring.x == (row["bytes_per_token"],) and ring.y == (row["delta_bits_per_byte"],)
        assert f"{row['bits_per_byte']:.4f}" in lab.readout_html.value
    lab.update(selection="SWA W=16 local")  # a window run: ringed on the bytes-only strip
    assert lab.figure.data[-1].y == ("window, retrained",) and lab.figure.data[-1].yaxis == "y2"
    assert f"on {DATA['date']}" in lab.figure.layout.title.text
    lab.update(window=4, written=9)
    assert "holds positions 5–8" in lab.ring_html.value and "overwrites slot 1" in lab.ring_html.value
    lab.update(head=1, token=3)
    q = lab.reading.quant
    np.testing.assert_allclose(q.key, lab.keys_KTH[1, 3])
    assert 0 < q.max_error <= q.scale / 2 * (1 + 1e-5)
    with pytest.raises(ValueError, match="written: expected an integer in"):
        lab.update(written=500)
    assert lab.written.type("30") and "holds positions 26–29" in lab.ring_html.value
    assert not lab.window.type("17") and "from 2 to 16 slots" in lab.window.message and lab.reading.window == 4
    with pytest.raises(ValueError, match="selection: expected one of"):
        lab.update(selection="MHA int3")


def test_quantize_key_restores_codes_times_scale():
    q = quantize_key(np.array([0.5, -1.0, 0.25, 0.0], np.float32))
    assert q.scale == pytest.approx(1 / 127) and q.codes.tolist() == [64.0, -127.0, 32.0, 0.0]
    np.testing.assert_allclose(q.restored, q.codes * q.scale)


def test_ring_table_before_the_buffer_fills():
    assert "holds positions 0–2" in ring_table(8, 3) and ring_table(8, 3).count("empty") == 5


def test_load_measurements_errors_name_the_file(tmp_path):
    with pytest.raises(ValueError, match="not found; run `python benchmarks/memory_savers.py`"):
        load_measurements(tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"date": "x", "tokens": 256, "rows": [{"label": "a"}]}))
    with pytest.raises(ValueError, match=r"bad.json: rows\[0\] lacks family"):
        load_measurements(bad)
    assert MEASUREMENTS.is_file()


# SmolLM2-135M (benchmarks/memory_savers.py --part smollm2) ------------------------------------------------------------

SMOL = load_smol_measurements()


def smol_config(row):
    """The stored row's cache config: SmolLM2's geometry (the preset, K = 3) with the row's changes."""
    return dantinox.ModelConfig.preset("smollm2-135m", kv_heads=3, **(row["config"] or {}))


@pytest.mark.parametrize("row", SMOL["rows"], ids=lambda r: r["label"])
def test_smollm2_bytes_are_the_arrays_and_the_formula_of_todays_code(row):
    cfg = smol_config(row)
    tokens = SMOL["tokens"] if row["family"] != "recompute" else 2 * row["window"]
    measured = dantinox.cache_shapes(cfg, 1, tokens).nbytes
    entry_id, title, variables = quality.formula_for(cfg, 1, tokens)
    assert row["bytes"] == measured == dantinox.kv_cache_bytes(cfg, 1, tokens) == content.evaluate(
        content.load_entry(entry_id), title, **variables)
    assert row["bytes_per_token"] == measured / SMOL["tokens"]


def test_smollm2_quality_numbers_are_consistent():
    base = next(r for r in SMOL["rows"] if r["family"] == "baseline")
    assert base["agreement"] == 1.0 and abs(base["mean_kl"]) < 1e-6
    for r in SMOL["rows"]:
        bins = r["perplexity_by_position"]
        assert len(bins) == -(-(SMOL["tokens"] - 1) // SMOL["bin"]) and all(b > 1 for b in bins)
        assert 0 < r["agreement"] <= 1 and r["mean_kl"] > -1e-6 and r["perplexity"] > 1
    assert SMOL["wall_s"] > 0 and {m["label"] for m in SMOL["missing"]}.isdisjoint(r["label"] for r in SMOL["rows"])


def test_kivi_view_rounds_as_an_independent_numpy_kivi():
    block = SMOL["kivi_block"]
    keys, values, G = np.asarray(block["keys"]), np.asarray(block["values"]), block["group"]
    for bits in (2, 4):
        top = 2**bits - 1
        f16 = lambda a: a.astype(np.float16).astype(np.float64)  # noqa: E731
        lo, hi = keys.min(0), keys.max(0)  # one group of G tokens: a scale per channel
        s, z = f16((hi - lo) / top), f16(lo)
        want = np.clip(np.round((keys - z) / np.where(s > 0, s, 1)), 0, top) * s + z
        got = kivi_quantize(keys, bits, G, per_channel=True)
        np.testing.assert_allclose(got.restored, want, atol=1e-5)
        v = kivi_quantize(values, bits, G, per_channel=False)
        assert v.scale.shape == (values.shape[0], values.shape[1] // G)
        assert np.all(np.abs(v.error) <= v.scale.repeat(G, 1) / 2 + 1e-3)


def test_real_model_lab_follows_its_controls():
    lab = RealModelSaversLab(tiny=DATA, selection=SMOL["rows"][0]["label"])
    assert lab.error == ""
    for (metric, key), row in zip((("top-1 agreement", "agreement"), ("mean KL", "mean_kl"),
                                   ("perplexity", "perplexity")), SMOL["rows"][-3:], strict=False):
        lab.update(metric=metric, selection=row["label"])
        ring = lab.figure.data[-1]  # the red ring marks the selection on the chosen metric
        assert ring.x == (row["bytes_per_token"],) and ring.y == (row[key],)
        assert f"{row['perplexity']:.3f}" in lab.readout_html.value
    names = [t.name for t in lab.figure.data]
    lab.update(metric="top-1 agreement")
    assert any(t.name.startswith("tiny runs") for t in lab.figure.data) and not any(n.startswith("tiny") for n in names)
    window = lab.window.options[0]
    curves = [t.name for t in lab.stream_figure.data]
    assert curves[:3] == ["fp32 full cache", f"window {window} (not retrained)", f"window {window - 4} + 4 sinks"]
    assert kept_spans("sinks", 1000, 256) == [(0, 3), (749, 1000)] and kept_spans("window", 10, 256) == [(0, 10)]
    lab.update(bits=4, block="values per token (KIVI)")
    assert lab.reading.kivi.original.shape == (32, 64) and "values per token" in lab.kivi_html.value
    assert lab.position.type("1234") and lab.reading.position == 1234  # typed, used exactly
    with pytest.raises(ValueError, match="selection: expected one of"):
        lab.update(selection="kivi1")


def test_the_frontier_ranks_only_comparable_runs_and_a_click_selects():
    """The window runs of this tiny model (it memorised its text) sat in the 'better' corner, below full MHA."""
    from widgets.memory_savers_lab import comparable, frontier_figure

    fig = frontier_figure(DATA)
    ranked = [t for t in fig.data[:-1] if t.yaxis == "y"]  # the panel whose y axis is 'lower is better'
    strip = [t for t in fig.data[:-1] if t.yaxis == "y2"]
    ranked_labels = {label for t in ranked for label in t.text}
    assert ranked_labels == {r["label"] for r in DATA["rows"] if comparable(r)}
    assert not any(r["family"].startswith("window") for r in DATA["rows"] if r["label"] in ranked_labels)
    assert {label for t in strip for label in t.text} == {r["label"] for r in DATA["rows"] if not comparable(r)}
    assert all(t.name.endswith("(not comparable)") for t in strip)
    best = min((r for r in DATA["rows"] if r["label"] in ranked_labels), key=lambda r: r["delta_bits_per_byte"])
    assert comparable(best)
    assert "better" in fig.layout.annotations[0].text and "not comparable" in fig.layout.annotations[1].text
    assert all(t.marker.color not in ("white", "#fff", "#ffffff") for t in fig.data)  # legend markers visible
    lab = MemorySaversLab(selection="MHA int8")
    trace = next(t for t in lab.figure.data if "GQA K=2" in (t.text or ()))

    class Points:  # what plotly passes to an on_click callback
        point_inds = [list(trace.text).index("GQA K=2")]

    lab._on_point(trace, Points())
    assert lab.selection.value == "GQA K=2" and lab.reading.row["label"] == "GQA K=2"
