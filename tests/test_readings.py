"""The pure readings behind the labs: measure_cache, the content/code alphabet, read_kv_cache, read_mla_cache."""

import jax
import pytest
from compile_log import compile_log

import content
import dantinox
from dantinox.accounting.memory import CONTENT_SYMBOLS, measure_cache
from widgets.readings import (
    evaluate_bytes,
    formula_params,
    read_kv_cache,
    read_mla_cache,
    variant_label,
)

VARIANTS = [dict(), dict(kv_heads=2), dict(kv_heads=1),
            dict(attention="latent", kv_latent_dim=16, rope_head_dim=4)]


@pytest.fixture(scope="module")
def kv_entry():
    return content.load_entry("kv-cache")


@pytest.fixture(scope="module")
def mla_entry():
    return content.load_entry("multi-head-latent-attention")


@pytest.mark.parametrize("variant", VARIANTS, ids=["mha", "gqa", "mqa", "mla"])
def test_measure_cache_allocates_under_the_budget_and_sizes_from_shapes_above(variant):
    cfg = dantinox.ModelConfig.preset("test", cache_dtype="bfloat16", **variant)
    expected = dantinox.kv_cache_bytes(cfg, 3, 40)
    before = len(jax.live_arrays())
    real = measure_cache(cfg, 3, 40, budget=expected)
    assert (real.nbytes, real.source) == (expected, "arrays")
    assert len(jax.live_arrays()) == before  # measured, then freed
    shapes = measure_cache(cfg, 3, 40, budget=expected - 1)
    assert (shapes.nbytes, shapes.source) == (expected, "shapes")
    assert measure_cache(cfg, 3, 40, budget=0).source == "shapes"
    if cfg.attention == "latent":
        assert real.layer_shapes == shapes.layer_shapes == {"ckv": (3, 40, 16 + 4)}
    else:
        k, v = (3, cfg.n_kv_heads, cfg.head_size, 40), (3, cfg.n_kv_heads, 40, cfg.head_size)  # keys slot-last
        assert real.layer_shapes == shapes.layer_shapes == {"k": k, "v": v}


def test_measure_cache_refuses_bad_arguments_in_one_line():
    cfg = dantinox.ModelConfig.preset("test")
    with pytest.raises(ValueError, match=r"^budget: expected an integer >= 0, got -1$"):
        measure_cache(cfg, 1, 8, budget=-1)
    with pytest.raises(ValueError, match=r"^budget: expected an integer >= 0, got '1 MiB'$"):
        measure_cache(cfg, 1, 8, budget="1 MiB")
    with pytest.raises(ValueError, match=r"^batch: expected a positive integer, got 0$"):
        measure_cache(cfg, 0, 8, budget=2**20)
    with pytest.raises(ValueError, match=r"^tokens: a cache holds at most max_context=64 tokens, got 65$"):
        measure_cache(cfg, 1, 65, budget=2**20)


def test_a_repeated_measurement_compiles_nothing():
    cfg = dantinox.ModelConfig.preset("test", kv_heads=2)
    measure_cache(cfg, 2, 24, budget=2**20)  # the zero-fill compiles once for this shape
    with compile_log() as compiled:
        measure_cache(cfg, 2, 24, budget=2**20)
        measure_cache(cfg, 2, 64, budget=0)  # shapes only: traced, never compiled
    assert compiled == []


@pytest.mark.parametrize("variant", VARIANTS, ids=["mha", "gqa", "mqa", "mla"])
def test_the_content_alphabet_maps_onto_the_config(kv_entry, mla_entry, variant):
    cfg = dantinox.ModelConfig.preset("reference", cache_dtype="bfloat16", **variant)
    params = formula_params(cfg, 4, 100)
    assert params["H_kv"] == cfg.n_kv_heads and params["d_h"] == cfg.head_size and params["L"] == cfg.n_layers
    assert (params["B"], params["T"], params["bytes"]) == (4, 100, 2)
    entry, title = (mla_entry, "MLA latent cache size") if cfg.attention == "latent" else (kv_entry, "KV cache size")
    assert evaluate_bytes(entry, title, params) == dantinox.kv_cache_bytes(cfg, 4, 100)
    assert ("C" in params) == ("R" in params) == (cfg.attention == "latent")


def test_every_symbol_the_lab_formulas_use_is_mapped(kv_entry, mla_entry):
    arguments = {"B", "T"}
    for entry in (kv_entry, mla_entry):
        for item in entry.science:
            assert set(item.variables) <= set(CONTENT_SYMBOLS) | arguments, (entry.id, item.title)
    assert [code for code, _ in CONTENT_SYMBOLS.values()] == ["L", "N", "K", "H", "C", "R", "bytes"]


def test_a_fractional_byte_count_is_refused_naming_the_item(mla_entry):
    params = dict(C=16, R=4, d_h=8)  # (16 + 4) / (2 · 8) = 1.25 heads: not a byte count
    with pytest.raises(ValueError, match=r"multi-head-latent-attention\.science\['Equivalent GQA KV heads'\]: "
                                         r"expected a whole number of bytes, got 1\.25"):
        evaluate_bytes(mla_entry, "Equivalent GQA KV heads", params)


@pytest.mark.parametrize("kv_heads", [None, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kv_reading_formula_equals_real_arrays(kv_entry, kv_heads, dtype):
    cfg = dantinox.ModelConfig.preset("test", kv_heads=kv_heads, cache_dtype=dtype)
    for batch, tokens in ((1, 1), (3, 17), (5, 64)):
        r = read_kv_cache(kv_entry, cfg, batch, tokens, device="A100 40GB")
        assert (r.batch, r.tokens, r.source, r.residual) == (batch, tokens, "arrays", 0)
        assert r.measured_bytes == dantinox.tree_nbytes(dantinox.init_cache(cfg, batch, tokens))
        assert r.per_token_bytes == dantinox.kv_cache_bytes(cfg, 1, 1)
        assert r.weight_bytes == dantinox.param_bytes(cfg)
        assert r.max_batch == dantinox.max_batch_size(cfg, dantinox.DEVICE_PRESETS["A100 40GB"].memory_bytes, tokens)
        assert r.formula_params == dict(L=2, B=batch, T=tokens, H_kv=cfg.n_kv_heads, d_h=8, bytes=cfg.cache_itemsize)


def test_reference_bf16_mha_at_512_tokens_is_6_mib_not_0_375_mb(kv_entry):
    cfg = dantinox.ModelConfig.preset("reference", cache_dtype="bfloat16")
    r = read_kv_cache(kv_entry, cfg, 1, 512)
    assert r.formula_bytes == r.measured_bytes == 6 * 2**20 and r.label == "MHA (K=8)"


def test_kv_reading_above_the_budget_comes_from_shapes(kv_entry):
    cfg = dantinox.ModelConfig.preset("test")
    r = read_kv_cache(kv_entry, cfg, 2, 64, budget=1024)
    assert r.source == "shapes" and r.residual == 0 and r.measured_bytes == dantinox.kv_cache_bytes(cfg, 2, 64)
    with pytest.raises(ValueError, match=r"^device: expected one of A100 40GB, .*, got 'TPU'$"):
        read_kv_cache(kv_entry, cfg, 1, 8, device="TPU")


def test_mla_reading_measures_the_latent_and_its_peers(kv_entry, mla_entry):
    cfg = dantinox.ModelConfig.preset("test", attention="latent", kv_latent_dim=16, rope_head_dim=4)
    r = read_mla_cache(mla_entry, kv_entry, cfg, 3, 40)
    assert (r.source, r.residual, r.layer_shapes) == ("arrays", 0, {"ckv": (3, 40, 20)})
    H, N = cfg.head_size, cfg.n_heads
    assert r.equivalent_kv_heads == r.measured_kv_heads == (16 + 4) / (2 * H)
    assert r.mha_fraction == pytest.approx((16 + 4) / (2 * N * H))
    assert [p.label for p in r.peers] == ["MHA (K=4)", "GQA (K=2)", "MQA (K=1)"]
    for p in r.peers:
        assert p.residual == 0 and p.layer_shapes["k"] == (3, p.cfg.n_kv_heads, H, 40)
        assert p.formula == "KV cache size" and p.cfg.kv_latent_dim is None
    with pytest.raises(ValueError, match=r"^cfg: expected attention='latent' \(MLA\), got 'gqa'$"):
        read_mla_cache(mla_entry, kv_entry, r.peers[1].cfg, 1, 8)
    with pytest.raises(ValueError, match="gqa_kv_heads: expected a divisor of n_heads=4"):
        read_mla_cache(mla_entry, kv_entry, cfg, 1, 8, gqa_kv_heads=3)
    assert variant_label(cfg) == "MLA (C=16, R=4)"
