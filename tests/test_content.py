"""The shipped concept entries: they validate, their formulas agree with dantinox, their checks recompute."""

from __future__ import annotations

import itertools
import math
import string

import pytest

import dantinox
from dantinox import content
from dantinox.content.loader import UNIT_FAMILIES

ENTRIES = content.load_all()


def test_every_entry_validates_and_matches_its_file_name():
    files = sorted(p.stem for p in content.CONTENT_DIR.glob("*.yaml"))
    assert sorted(ENTRIES) == files
    for entry_id in files:
        assert content.load_entry(entry_id).id == entry_id


def test_every_entry_has_three_checks_one_numeric_and_sources():
    for entry in ENTRIES.values():
        assert len(entry.checks) >= 3, entry.id
        assert any(isinstance(c, content.NumericCheck) for c in entry.checks), entry.id
        assert all(s.url.startswith(("http://", "https://")) for s in entry.sources), entry.id


def test_prerequisite_graph_is_acyclic_and_resolved():
    graph = content.prerequisite_graph(ENTRIES)
    assert set(graph) == set(ENTRIES)
    for entry in ENTRIES.values():
        assert set(entry.related) <= set(ENTRIES), entry.id
        assert set(graph[entry.id]) <= set(ENTRIES), entry.id
    done: list[str] = []  # topological order must exist
    remaining = dict(graph)
    while remaining:
        ready = [k for k, deps in remaining.items() if set(deps) <= set(done)]
        assert ready, f"prerequisite cycle among {sorted(remaining)}"
        done += ready
        for k in ready:
            del remaining[k]


def _unit_factor(target: str, base: str) -> float:
    if target == base:
        return 1.0
    family = next(f for f in UNIT_FAMILIES if target in f and base in f)
    return family[target] / family[base]


@pytest.mark.parametrize("entry_id,index", [(e.id, i) for e in ENTRIES.values()
                                             for i, _ in content.iter_numeric_checks(e)])
def test_every_numeric_check_answer_is_recomputed(entry_id, index):
    entry = ENTRIES[entry_id]
    check = entry.checks[index]
    item = entry.science_item(check.science)
    answer = content.check_answer(entry, index)
    assert math.isfinite(answer) and answer != 0
    assert answer == pytest.approx(content.evaluate(entry, check.science, **check.params)
                                   / _unit_factor(check.unit, item.unit), rel=1e-12)
    assert content.is_correct(entry, index, answer * (1 + check.tolerance / 2))
    assert not content.is_correct(entry, index, answer * (1 + 2 * check.tolerance))
    question = content.render_question(entry, index)
    assert "{" not in question and "}" not in question
    # overriding a parameter changes the answer and the question together
    name, value = next(iter(check.params.items()))
    moved = content.check_answer(entry, index, {name: value * 2})
    assert moved != answer
    assert content.render_question(entry, index, {name: value * 2}) != question


def test_choice_checks_have_an_answer_in_range():
    for entry in ENTRIES.values():
        for check in entry.checks:
            if isinstance(check, content.ChoiceCheck):
                assert 0 <= check.answer < len(check.options), entry.id


def test_computed_specs_show_the_formula_value():
    entry = ENTRIES["kv-cache"]
    values = {s.label: s.value for s in entry.specs}
    assert values["Cache per token, Llama-2-7B in fp16 (multi-head attention)"] == "512 KiB"
    assert values["Cache per token, Llama-3-8B in bf16 (grouped-query attention)"] == "128 KiB"
    assert values["dantinox reference model, one sequence, bf16 cache"] == dantinox.format_bytes(
        dantinox.kv_cache_bytes(dantinox.ModelConfig.preset("reference", cache_dtype="bfloat16"), 1, 512))


VARIANTS = (dict(attention="mha"), dict(attention="gqa", kv_heads=2), dict(attention="mqa"))


GRID = list(itertools.product(VARIANTS, (1, 3), ("float32", "bfloat16")))


@pytest.mark.parametrize("variant,batch,cache_dtype", GRID)
def test_kv_cache_formula_equals_dantinox(variant, batch, cache_dtype):
    entry = ENTRIES["kv-cache"]
    cfg = dantinox.ModelConfig.preset("test", cache_dtype=cache_dtype, **variant)
    for tokens in (1, 17, cfg.max_context):
        formula = content.evaluate(entry, "KV cache size", L=cfg.n_layers, B=batch, T=tokens, H_kv=cfg.kv_heads,
                                   d_h=cfg.head_size, bytes=cfg.cache_itemsize)
        assert formula == dantinox.kv_cache_bytes(cfg, batch_size=batch, tokens=tokens)
        assert formula == dantinox.tree_nbytes(dantinox.init_cache(cfg, batch, length=tokens))
        per_token = content.evaluate(entry, "KV cache per token", L=cfg.n_layers, H_kv=cfg.kv_heads,
                                     d_h=cfg.head_size, bytes=cfg.cache_itemsize)
        assert per_token * batch * tokens == formula


def test_kv_cache_check_matches_the_reference_model():
    entry = ENTRIES["kv-cache"]
    cfg = dantinox.ModelConfig.preset("reference", cache_dtype="bfloat16")
    check = entry.checks[0]
    assert check.params == dict(L=cfg.n_layers, B=1, T=512, H_kv=cfg.kv_heads, d_h=cfg.head_size, bytes=2)
    assert content.check_answer(entry, 0) * 2**20 == dantinox.kv_cache_bytes(cfg, 1, 512)
    assert content.check_answer(entry, 0, {"T": 1024, "B": 4}) * 2**20 == dantinox.kv_cache_bytes(cfg, 4, 1024)


def test_questions_only_use_declared_placeholders():
    for entry in ENTRIES.values():
        for i, check in content.iter_numeric_checks(entry):
            fields = {f for _, f, _, _ in string.Formatter().parse(check.question) if f}
            assert fields == set(check.params), (entry.id, i)


MLA_GRID = list(itertools.product(((8, 4), (16, 8)), (1, 2), ("float32", "bfloat16")))


@pytest.mark.parametrize("widths,batch,cache_dtype", MLA_GRID)
def test_mla_formula_equals_dantinox(widths, batch, cache_dtype):
    entry = ENTRIES["multi-head-latent-attention"]
    C, R = widths
    cfg = dantinox.ModelConfig.preset("test", attention="mla", kv_latent_dim=C, rope_head_dim=R,
                                      cache_dtype=cache_dtype)
    for tokens in (1, 33):
        formula = content.evaluate(entry, "MLA latent cache size", L=cfg.n_layers, B=batch, T=tokens, C=C, R=R,
                                   bytes=cfg.cache_itemsize)
        assert formula == dantinox.kv_cache_bytes(cfg, batch_size=batch, tokens=tokens)
        assert formula == dantinox.tree_nbytes(dantinox.init_cache(cfg, batch, length=tokens))


def test_mla_equivalent_heads_follow_the_papers_ratios():
    entry = ENTRIES["multi-head-latent-attention"]
    # DeepSeek-V2 sets the latent to four head sizes and the rotary key to half a head size: 2.25 groups
    for d_h in (64, 128, 256):
        assert content.evaluate(entry, "Equivalent GQA KV heads", C=4 * d_h, R=d_h // 2, d_h=d_h) == 2.25
    mla = dantinox.ModelConfig.preset("test", attention="mla", kv_latent_dim=16, rope_head_dim=8)
    mha = dantinox.ModelConfig.preset("test")
    ratio = content.evaluate(entry, "MLA cache relative to MHA", C=16, R=8, N=mha.n_heads, d_h=mha.head_size)
    assert ratio == dantinox.kv_cache_bytes(mla, 1, 8) / dantinox.kv_cache_bytes(mha, 1, 8)


def test_gqa_formulas_equal_dantinox():
    entry = ENTRIES["grouped-query-attention"]
    mha = dantinox.ModelConfig.preset("test", cache_dtype="bfloat16")
    for kv_heads in (1, 2, 4):
        gqa = mha.replace(attention="gqa", kv_heads=kv_heads)
        saved = content.evaluate(entry, "KV bytes saved per token", L=gqa.n_layers, N=gqa.n_heads, H_kv=kv_heads,
                                 d_h=gqa.head_size, bytes=gqa.cache_itemsize)
        assert saved == dantinox.kv_cache_bytes(mha, 1, 1) - dantinox.kv_cache_bytes(gqa, 1, 1)
        share = content.evaluate(entry, "GQA cache relative to MHA", H_kv=kv_heads, N=gqa.n_heads)
        assert share == dantinox.kv_cache_bytes(gqa, 2, 40) / dantinox.kv_cache_bytes(mha, 2, 40)


def test_dual_cache_size_is_a_cache_of_everything_but_the_block():
    entry = ENTRIES["diffusion-dual-cache"]
    cfg = dantinox.ModelConfig.preset("test", paradigm="diffusion", attention="gqa", kv_heads=2)
    for T, W in ((64, 8), (48, 16)):
        size = content.evaluate(entry, "DualCache size", L=cfg.n_layers, B=2, T=T, W=W, H_kv=cfg.kv_heads,
                                d_h=cfg.head_size, bytes=cfg.cache_itemsize)
        assert size == dantinox.tree_nbytes(dantinox.init_cache(cfg, 2, length=T - W))
    # one step per block: nothing is reused; more steps approach T / W
    assert content.evaluate(entry, "DualCache work ratio", s=1, T=64, W=8) == 1
    assert content.evaluate(entry, "DualCache work ratio", s=10**6, T=64, W=8) == pytest.approx(64 / 8, rel=1e-4)
