"""The shipped concept entries: they validate, their formulas agree with dantinox, their checks recompute."""

from __future__ import annotations

import itertools
import math
import random
import re
from urllib.parse import urlsplit

import pytest

import content
import dantinox
from content.schema import MIRROR_HOSTS, mirror_host, round_significant
from content.units import UNIT_FAMILIES
from dantinox.architectures.catalogue import catalogue

ENTRIES = content.load_all()


def test_every_entry_validates_and_matches_its_file_name():
    files = sorted(p.stem for p in content.CONTENT_DIR.glob("*.yaml"))
    assert sorted(ENTRIES) == files
    for entry_id in files:
        assert content.load_entry(entry_id).id == entry_id


def _unit_factor(target: str, base: str) -> float:
    if target == base:
        return 1.0
    family = next(f for f in UNIT_FAMILIES if target in f and base in f)
    return family[target] / family[base]


NUMERIC = [(e.id, i) for e in ENTRIES.values() for i, _ in content.iter_numeric_checks(e)]


@pytest.mark.parametrize("entry_id,index", NUMERIC)
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


@pytest.mark.parametrize("entry_id,index", NUMERIC)
def test_every_numeric_question_states_its_precision_and_grades_at_it(entry_id, index):
    entry = ENTRIES[entry_id]
    check = entry.checks[index]
    words = ("one", "two", "three", "four", "five", "six")[check.precision - 1]
    assert content.render_question(entry, index).endswith(f"Give the answer to {words} significant figure"
                                                           + ("s." if check.precision > 1 else "."))
    answer = content.check_answer(entry, index)
    rounded = round_significant(answer, check.precision)
    assert content.is_correct(entry, index, rounded)
    coarse = round_significant(answer, check.precision - 1) if check.precision > 1 else rounded
    if coarse != rounded:
        assert not content.is_correct(entry, index, coarse)
    # with a lab's numbers the tolerance may not cover the rounding any more; the rounded answer still counts
    name, value = next(iter(check.params.items()))
    moved = content.check_answer(entry, index, {name: value * 3})
    assert content.is_correct(entry, index, round_significant(moved, check.precision), {name: value * 3})


def _check_of(entry_id: str, science: str) -> int:
    return next(i for i, c in content.iter_numeric_checks(ENTRIES[entry_id]) if c.science == science)


def test_the_quizzes_the_review_named_accept_what_their_sources_print():
    decode, step = ENTRIES["prefill-and-decode"], _check_of("prefill-and-decode", "Decode step time lower bound")
    assert content.check_answer(decode, step) == pytest.approx(2.5363, rel=1e-4)  # 8.2e11 B/s, the book's current text
    assert content.is_correct(decode, step, 2.5) and not content.is_correct(decode, step, 2.6)  # the book prints 2.5
    assert not content.is_correct(decode, step, 3)
    mla, share = ENTRIES["multi-head-latent-attention"], _check_of("multi-head-latent-attention",
                                                                   "MLA cache relative to MHA")
    assert content.is_correct(mla, share, 0.018) and not content.is_correct(mla, share, 0.02)
    intensity = _check_of("prefill-and-decode", "Attention arithmetic intensity")
    check = decode.checks[intensity]
    assert check.unit == "FLOPs per byte" and "constant factor" not in check.question
    G = check.params["G"]  # bf16: G·T·S/(G·T+S) FLOPs/byte, about G at one query token
    assert G > 1 and content.check_answer(decode, intensity) == pytest.approx(G, rel=1e-3)


URL = re.compile(r"https?://[^\s'\"<>)\]]+")
# hosts whose pages are primary for what our entries correct: papers, official docs, vendors, standards
PRIMARY_HOSTS = {"arxiv.org", "jax-ml.github.io", "docs.vllm.ai", "docs.sglang.io", "docs.nvidia.com",
                 "www.nvidia.com", "nvidianews.nvidia.com", "www.usenix.org", "www.jedec.org", "cloud.google.com"}
# repositories of the organisations that publish the model, engine or method
PRIMARY_REPOS = ("huggingface.co/meta-llama/", "huggingface.co/deepseek-ai/", "huggingface.co/google/",
                 "huggingface.co/mistralai/", "huggingface.co/Qwen/", "huggingface.co/openai/",
                 "github.com/vllm-project/vllm", "github.com/NVlabs/",
                 "github.com/jy-yuan/KIVI", "github.com/mit-han-lab/streaming-llm")


def test_no_entry_cites_a_mirror_host_anywhere_in_its_text():
    assert mirror_host("https://www.mintlify.com/vllm-project/vllm/concepts/paged-attention") == "mintlify.com"
    assert all(reason.strip() for reason in MIRROR_HOSTS.values())
    for path in sorted(content.CONTENT_DIR.glob("*.yaml")):
        urls = URL.findall(path.read_text())
        assert urls, path.name
        cited = [url for url in urls if mirror_host(url)]
        assert cited == [], f"{path.name} cites a mirror: {cited}"


def test_every_misconception_is_corrected_by_a_primary_source_other_than_where_it_appears():
    for entry in ENTRIES.values():
        for m in entry.misconception:
            host, path = urlsplit(m.corrected_by).netloc, m.corrected_by.split("://", 1)[1]
            assert host in PRIMARY_HOSTS or path.startswith(PRIMARY_REPOS), (entry.id, m.corrected_by)
            assert urlsplit(m.appears_in).netloc and m.appears_in != m.corrected_by, (entry.id, m.claim)


def test_the_card_links_where_each_belief_appears_and_what_corrects_it():
    from widgets.card import ConceptCard

    for entry_id in ("paged-attention", "kv-cache"):
        entry = ENTRIES[entry_id]
        html = ConceptCard(entry).sections["misconception"].value
        for m in entry.misconception:
            assert f"href='{m.appears_in}'" in html and f"href='{m.corrected_by}'" in html
        beliefs = sum(m.shows == "belief" for m in entry.misconception)
        assert html.count(">where this belief appears</a>") == beliefs
        assert html.count(">the fix of this belief</a>") == len(entry.misconception) - beliefs
        assert html.count(">corrected by</a>") == len(entry.misconception)
    assert {m.shows for m in ENTRIES["paged-attention"].misconception} == {"belief", "fix"}  # both links rendered


def test_computed_specs_show_the_formula_value():
    entry = ENTRIES["kv-cache"]
    values = {s.label: content.spec_value(entry, s) for s in entry.specs}
    assert all(s.value is None for s in entry.specs if s.compute is not None)  # validation never writes back
    assert values["Cache per token, Llama-2-7B in fp16 (multi-head attention)"] == "512 KiB"
    assert values["Cache per token, Llama-3-8B in bf16 (grouped-query attention)"] == "128 KiB"
    assert values["dantinox reference model, one sequence, bf16 cache"] == dantinox.format_bytes(
        dantinox.kv_cache_bytes(dantinox.ModelConfig.preset("reference", cache_dtype="bfloat16"), 1, 512))


VARIANTS = (dict(), dict(kv_heads=2), dict(kv_heads=1))


GRID = list(itertools.product(VARIANTS, (1, 3), ("float32", "bfloat16")))


@pytest.mark.parametrize("variant,batch,cache_dtype", GRID)
def test_kv_cache_formula_equals_dantinox(variant, batch, cache_dtype):
    entry = ENTRIES["kv-cache"]
    cfg = dantinox.ModelConfig.preset("test", cache_dtype=cache_dtype, **variant)
    for tokens in (1, 17, cfg.max_context):
        formula = content.evaluate(entry, "KV cache size", L=cfg.n_layers, B=batch, T=tokens, H_kv=cfg.n_kv_heads,
                                   d_h=cfg.head_size, bytes=cfg.cache_itemsize)
        assert formula == dantinox.kv_cache_bytes(cfg, batch_size=batch, tokens=tokens)
        assert formula == dantinox.tree_nbytes(dantinox.init_cache(cfg, batch, length=tokens))
        per_token = content.evaluate(entry, "KV cache per token", L=cfg.n_layers, H_kv=cfg.n_kv_heads,
                                     d_h=cfg.head_size, bytes=cfg.cache_itemsize)
        assert per_token * batch * tokens == formula


def test_kv_cache_check_matches_the_reference_model():
    entry = ENTRIES["kv-cache"]
    cfg = dantinox.ModelConfig.preset("reference", cache_dtype="bfloat16")
    check = entry.checks[0]
    assert check.params == dict(L=cfg.n_layers, B=1, T=512, H_kv=cfg.n_kv_heads, d_h=cfg.head_size, bytes=2)
    assert content.check_answer(entry, 0) * 2**20 == dantinox.kv_cache_bytes(cfg, 1, 512)
    assert content.check_answer(entry, 0, {"T": 1024, "B": 4}) * 2**20 == dantinox.kv_cache_bytes(cfg, 4, 1024)


MLA_GRID = list(itertools.product(((8, 4), (16, 8)), (1, 2), ("float32", "bfloat16")))


@pytest.mark.parametrize("widths,batch,cache_dtype", MLA_GRID)
def test_mla_formula_equals_dantinox(widths, batch, cache_dtype):
    entry = ENTRIES["multi-head-latent-attention"]
    C, R = widths
    cfg = dantinox.ModelConfig.preset("test", attention="latent", kv_latent_dim=C, rope_head_dim=R,
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
    mla = dantinox.ModelConfig.preset("test", attention="latent", kv_latent_dim=16, rope_head_dim=8)
    mha = dantinox.ModelConfig.preset("test")
    ratio = content.evaluate(entry, "MLA cache relative to MHA", C=16, R=8, N=mha.n_heads, d_h=mha.head_size)
    assert ratio == dantinox.kv_cache_bytes(mla, 1, 8) / dantinox.kv_cache_bytes(mha, 1, 8)


def test_gqa_formulas_equal_dantinox():
    entry = ENTRIES["grouped-query-attention"]
    mha = dantinox.ModelConfig.preset("test", cache_dtype="bfloat16")
    for kv_heads in (1, 2, 4):
        gqa = mha.replace(kv_heads=kv_heads)
        saved = content.evaluate(entry, "KV bytes saved per token", L=gqa.n_layers, N=gqa.n_heads, H_kv=kv_heads,
                                 d_h=gqa.head_size, bytes=gqa.cache_itemsize)
        assert saved == dantinox.kv_cache_bytes(mha, 1, 1) - dantinox.kv_cache_bytes(gqa, 1, 1)
        share = content.evaluate(entry, "GQA cache relative to MHA", H_kv=kv_heads, N=gqa.n_heads)
        assert share == dantinox.kv_cache_bytes(gqa, 2, 40) / dantinox.kv_cache_bytes(mha, 2, 40)


def test_dual_cache_size_is_a_cache_of_everything_but_the_block():
    entry = ENTRIES["diffusion-dual-cache"]
    cfg = dantinox.ModelConfig.preset("test", paradigm="diffusion", kv_heads=2)
    for T, W in ((64, 8), (48, 16)):
        size = content.evaluate(entry, "DualCache size", L=cfg.n_layers, B=2, T=T, W=W, H_kv=cfg.n_kv_heads,
                                d_h=cfg.head_size, bytes=cfg.cache_itemsize)
        assert size == dantinox.tree_nbytes(dantinox.init_cache(cfg, 2, length=T - W))
    # one step per block: nothing is reused; more steps approach T / W
    assert content.evaluate(entry, "DualCache work ratio", s=1, T=64, W=8) == 1
    assert content.evaluate(entry, "DualCache work ratio", s=10**6, T=64, W=8) == pytest.approx(64 / 8, rel=1e-4)


# Every science item, written again in plain Python: catches a compute expression that drifts from its intent.
INDEPENDENT = {
    "KV cache size": lambda v: 2 * v["L"] * v["B"] * v["T"] * v["H_kv"] * v["d_h"] * v["bytes"],
    "KV cache per token": lambda v: 2 * v["L"] * v["H_kv"] * v["d_h"] * v["bytes"],
    "Head size": lambda v: v["D"] / v["N"],
    "Softmax scale": lambda v: (v["D"] / v["N"]) ** -0.5,
    "Attention scores per layer": lambda v: v["B"] * v["N"] * v["T"] * v["S"],
    "GQA cache relative to MHA": lambda v: v["H_kv"] / v["N"],
    "KV cache per device on a mesh": lambda v: 2 * v["L"] * v["B"] * v["T"] * v["H_kv"] * v["d_h"] * v["bytes"]
    / v["data"] / (v["H_kv"] if v["model"] > v["H_kv"] else v["model"]),  # heads cut at most K ways
    "KV bytes saved per token": lambda v: 2 * v["L"] * v["N"] * v["d_h"] * v["bytes"]
    - 2 * v["L"] * v["H_kv"] * v["d_h"] * v["bytes"],
    "Per-layer KV cache of a hybrid model": lambda v: v["B"] * v["bytes"] * (
        2 * v["H_kv"] * v["d_h"] * (v["L_f"] * v["T"] + v["L_s"] * min(v["T"], v["W"]))
        + v["L_m"] * (v["C"] + v["R"]) * v["T"]),
    "Naive calculator": lambda v: 2 * v["L"] * v["H_kv"] * v["D"] / v["N"] * v["T"] * v["B"] * v["bytes"],
    "MLA latent cache size": lambda v: v["L"] * v["B"] * v["T"] * (v["C"] + v["R"]) * v["bytes"],
    "Equivalent GQA KV heads": lambda v: (v["C"] + v["R"]) / v["d_h"] / 2,
    "MLA cache relative to MHA": lambda v: (v["C"] + v["R"]) / (2 * v["N"] * v["d_h"]),
    "Absorbed MLA decode attention FLOPs": lambda v: 2 * v["L"] * v["B"] * v["N"] * (  # multiply-adds per head:
        v["T"] * (v["C"] + v["R"]) + v["T"] * v["C"]  # a score per cached row, a sum of the cached latents
        + v["d_h"] * v["C"] + v["C"] * v["d_h"]),  # the query through W_UK, the summed latent through W_UV
    "Pages per sequence": lambda v: -(-v["T"] // v["P"]),
    "Paged cache size": lambda v: -(-v["T"] // v["P"]) * v["P"] * 2 * v["L"] * v["H_kv"] * v["d_h"] * v["bytes"],
    "Wasted share of the allocation": lambda v: 1 - v["T"] / (-(-v["T"] // v["P"]) * v["P"]),
    "DualCache size": lambda v: 2 * v["L"] * v["B"] * (v["T"] - v["W"]) * v["H_kv"] * v["d_h"] * v["bytes"],
    "DualCache work ratio": lambda v: v["s"] * v["T"] / (v["T"] + (v["s"] - 1) * v["W"]),
    "Decode step time lower bound": lambda v: (v["B"] * v["T"] * v["m"] + v["W"]) / (v["n"] * v["BW"]),
    "Critical batch size": lambda v: v["F"] / v["BW"],
    "Attention arithmetic intensity": lambda v: 1 / (1 / v["S"] + 1 / (v["G"] * v["T"])),
    "Stack bandwidth": lambda v: v["w"] * v["r"] / 8,
    "Stack capacity": lambda v: v["h"] * v["g"] / 8,
    "Time to read memory once": lambda v: v["M"] / v["BW"],
    "Bandwidth ratio": lambda v: v["BW_a"] / v["BW_b"],
    "Bandwidth per stack": lambda v: v["BW"] / v["s"],
    "Largest finite value of a float format": lambda v: math.ldexp(1 + v["k"] / 2 ** v["m"], v["e"] - v["b"]),
    "Output head parameters": lambda v: v["V"] * v["D"],
    "Parameters of a Llama-style decoder": lambda v: (2 - v["t"]) * v["V"] * v["D"] + v["D"] + v["L"] * (  # a layer:
        2 * v["D"] * v["N"] * v["d_h"] + 2 * v["D"] * v["K"] * v["d_h"]  # q and o, k and v
        + 3 * v["D"] * v["F"] + 2 * v["D"]),  # the gated MLP, two norms
    "Tied head share of a Llama-style decoder": lambda v: v["V"] * v["D"] / (v["V"] * v["D"] + v["D"] + v["L"] * (
        2 * v["D"] * v["N"] * v["d_h"] + 2 * v["D"] * v["K"] * v["d_h"] + 3 * v["D"] * v["F"] + 2 * v["D"])),
    "Logits memory": lambda v: v["B"] * v["T"] * v["V"] * v["bytes"],
    "End-to-end latency": lambda v: v["ttft"] + v["n"] * v["tpot"],
    "Sequences that fit": lambda v: (v["M"] - v["W"]) // (v["T"] * v["m"]),
    "Requests in flight": lambda v: v["X"] * v["R"],
    "Pages saved by a shared prefix": lambda v: sum(v["P"] // v["b"] for _ in range(int(v["n"]) - 1)),
    "Iterations to prefill a prompt": lambda v: len(range(0, int(v["P"]), int(v["C"] - v["d"]))),
    "Expected tokens per verify": lambda v: sum(v["a"] ** i for i in range(int(v["k"]) + 1)),
    "Sliding-window cache size": lambda v: 2 * v["L"] * v["B"] * min(v["T"], v["W"]) * v["H_kv"] * v["d_h"]
    * v["bytes"],
    "Hybrid sliding-window cache size": lambda v: sum(  # layer by layer: global layers first, then window layers
        2 * v["B"] * (v["T"] if layer < v["L_g"] else min(v["T"], v["W"])) * v["H_kv"] * v["d_h"] * v["bytes"]
        for layer in range(int(v["L_g"] + v["L_l"]))),
    "Theoretical attention span": lambda v: v["L"] * v["W"],
    "Cache reduction from the window": lambda v: v["T"] / min(v["T"], v["W"]),
    "Hybrid cache relative to full attention": lambda v: (v["L_g"] * v["T"] + v["L_l"] * min(v["T"], v["W"]))
    / ((v["L_g"] + v["L_l"]) * v["T"]),
    "Quantized KV cache size": lambda v: 2 * v["L"] * v["B"] * v["T"] * v["H_kv"] * v["d_h"]
    * (v["q"] / 8 + v["z"] / v["G"]),
    "Compression relative to 16-bit": lambda v: 16 * v["G"] / (v["q"] * v["G"] + 8 * v["z"]),
    "KIVI-style cache size (dantinox)": lambda v: v["B"] * v["L"] * v["H_kv"] * (  # codes, scales+zeros, window
        2 * v["T"] * v["d_h"] * v["q"] / 8 + 2 * v["s"] * -(-v["T"] // v["G"]) * v["d_h"]
        + 2 * v["s"] * v["T"] * v["d_h"] / v["G"] + 2 * min(v["T"], v["R"]) * v["d_h"] * v["bytes"]),
    "KIVI cache size (KIVI's code)": lambda v: v["B"] * v["L"] * v["H_kv"] * v["d_h"] * sum(  # token by token
        (v["bytes"] if full else v["q"] / 8 + (2 * v["s"] / v["G"] if value else 0))  # a value's scale+zero
        for value in (False, True) for i in range(int(v["T"]))
        for full in [i >= v["T"] - (min(v["T"], v["R"]) if value else v["T"] % v["R"])])  # keys: an unflushed residual
    + v["B"] * v["L"] * v["H_kv"] * v["d_h"] * 2 * v["s"] * -(-(v["T"] - v["T"] % v["R"]) // v["G"]),  # key groups
    "Cache with attention sinks": lambda v: 2 * v["L"] * v["B"] * min(v["T"], v["W"] + v["S"]) * v["H_kv"] * v["d_h"]
    * v["bytes"],
    "Cache reduction from sinks and a window": lambda v: v["T"] / min(v["T"], v["W"] + v["S"]),
    "Sink share of the cache": lambda v: v["S"] / (v["W"] + v["S"]),
    "Learned sink parameters": lambda v: v["L"] * v["N"],
    "Eviction cache size": lambda v: sum(  # slot by slot: keys and values of every KV head, then the bookkeeping
        2 * v["H_kv"] * v["d_h"] * v["bytes"] + v["a"] for _ in range(int(min(v["T"], v["N"])))) * v["L"] * v["B"],
    "Share of the text kept": lambda v: min(v["T"], v["N"]) / v["T"],
    "Cache with a full-precision window": lambda v: 2 * v["L"] * v["H_kv"] * v["d_h"]
    * (v["n_fp"] * v["bytes"] + (v["T"] - v["n_fp"]) * (v["q"] / 8 + v["z"] / v["G"])),
    # the 2026 layer kinds: a state's matrices and convolution apart; sharing as owners' cache plus sharers' re-reads;
    # a sparse layer's latents and indexer keys apart
    "Gated DeltaNet state per layer": lambda v: v["B"] * _matrices_and_conv(v),
    "Linear-attention states of a hybrid": lambda v: v["L_lin"] * v["B"] * _matrices_and_conv(v),
    "Crossover length of a hybrid": lambda v: v["L_lin"] * _matrices_and_conv(v)
    / (v["L_att"] * 2 * v["H_kv"] * v["d_h"] * v["bytes"]),
    "Cache with cross-layer sharing": lambda v: _owners(v),
    "Bytes a decode step reads with sharing": lambda v: _owners(v) + 2 * v["B"] * v["H_kv"] * v["d_h"] * v["bytes"]
    * (v["S_f"] * v["T"] + v["S_s"] * (v["W"] if v["T"] > v["W"] else v["T"])),
    "Cache stored with a lightning indexer": lambda v: v["B"] * v["L"] * v["T"] * (v["C"] + v["R"]) * v["bytes"]
    + v["B"] * v["L"] * v["T"] * v["d_I"] * v["bytes_I"],
    "Cache read by one sparse decode step": lambda v: v["B"] * v["L"] * (
        (v["k"] if v["T"] > v["k"] else v["T"]) * (v["C"] + v["R"]) * v["bytes"] + v["T"] * v["d_I"] * v["bytes_I"]),
    "Stored over read per step": lambda v: (v["T"] * (v["C"] + v["R"]) * v["bytes"] + v["T"] * v["d_I"] * v["bytes_I"])
    / ((v["k"] if v["T"] > v["k"] else v["T"]) * (v["C"] + v["R"]) * v["bytes"] + v["T"] * v["d_I"] * v["bytes_I"]),
}


def _matrices_and_conv(v) -> float:
    """One Gated DeltaNet layer's state for one sequence: float32 matrices, then the convolution's inputs."""
    matrices = v["H_v"] * v["d_k"] * v["d_v"] * 4
    conv_channels = v["H_k"] * v["d_k"] + v["H_k"] * v["d_k"] + v["H_v"] * v["d_v"]  # queries, keys, values
    return matrices + conv_channels * v["K_c"] * v["bytes"]


def _owners(v) -> float:
    """The cache of the layers that own one: global layers T slots, sliding ones the window at most."""
    per_slot = 2 * v["H_kv"] * v["d_h"] * v["bytes"] * v["B"]
    return per_slot * v["L_f"] * v["T"] + per_slot * v["L_s"] * (v["W"] if v["T"] > v["W"] else v["T"])


@pytest.mark.parametrize("entry_id,title", [(e.id, s.title) for e in ENTRIES.values() for s in e.science])
def test_every_science_item_matches_an_independent_formula(entry_id, title):
    entry = ENTRIES[entry_id]
    item = entry.science_item(title)
    assert title in INDEPENDENT, f"{entry_id}: add {title!r} to INDEPENDENT"
    rng = random.Random(title)
    for _ in range(20):
        values = {name: rng.randint(1, 4096) for name in item.variables}
        if {"T", "W"} <= set(values) and "s" not in values and "L_g" not in values:
            values["T"] = max(values["T"], values["W"] + 1)  # DualCache: the sequence is longer than a block
        if {"e", "b", "k", "m"} <= set(values):  # a float format: exponents within what the evaluator allows
            values.update(e=rng.randint(1, 31), b=rng.randint(1, 16), k=rng.randint(0, 7), m=rng.randint(2, 3))
        if "n_fp" in values:
            values["T"] = values["n_fp"] + rng.randint(0, 4096)
        if {"M", "W"} <= set(values) and "BW" not in values:
            values["M"] = values["W"] + rng.randint(0, 10**9)
        if {"C", "d"} <= set(values):  # chunked prefill: the budget leaves room beside the decodes
            values["C"] = values["d"] + rng.randint(1, 4096)
        if {"a", "k"} <= set(values):  # speculation: an acceptance probability, a few drafts
            values.update(a=rng.uniform(0.01, 0.99), k=rng.randint(1, 16))
        assert content.evaluate(entry, title, **values) == pytest.approx(INDEPENDENT[title](values), rel=1e-12)


def test_fp8_maxima_equal_the_formats_as_ml_dtypes_defines_them():
    import ml_dtypes

    entry = ENTRIES["kv-cache-quantization"]
    specs = {s.label: s for s in entry.specs}
    for label, dtype in (("Largest finite value of the FP8 E4M3 format (E4M3FN)", ml_dtypes.float8_e4m3fn),
                         ("Largest finite value of the E4M3FNUZ variant", ml_dtypes.float8_e4m3fnuz)):
        inputs = specs[label].compute.with_
        assert content.evaluate(entry, "Largest finite value of a float format", **inputs) == \
            float(ml_dtypes.finfo(dtype).max)


def test_serving_capacity_equals_dantinox_max_batch_size():
    entry = ENTRIES["serving"]
    cfg = dantinox.ModelConfig.preset("reference", cache_dtype="bfloat16")
    per_token = dantinox.kv_cache_bytes(cfg, 1, 1)
    for memory, weights, tokens in ((10**9, 10**7, 512), (80 * 10**9, 13 * 10**9, 1024), (10**6, 10**5, 64)):
        fit = content.evaluate(entry, "Sequences that fit", M=memory, W=weights, T=tokens, m=per_token)
        assert fit == dantinox.max_batch_size(cfg, memory, tokens, weight_bytes=weights)


def test_output_head_parameters_equal_what_untying_adds_in_dantinox():
    entry = ENTRIES["output-head"]
    cfg = dantinox.ModelConfig.preset("test")
    added = dantinox.param_bytes(cfg.replace(tie_embeddings=False)) - dantinox.param_bytes(cfg)
    head = content.evaluate(entry, "Output head parameters", V=cfg.vocab_size, D=cfg.d_model)
    assert head * 4 == added  # float32 parameters


def test_llama_3_2_1b_has_one_parameter_count_computed_from_its_config():
    """The output-head entry, dantinox's parameter arrays and the catalogue's device fit use one count."""
    entry = ENTRIES["output-head"]
    spec = next(s for s in entry.specs if s.compute and s.compute.science == "Parameters of a Llama-style decoder")
    shape = spec.compute.with_
    counted = content.evaluate(entry, "Parameters of a Llama-style decoder", **shape)
    cfg = dantinox.ModelConfig(vocab_size=int(shape["V"]), d_model=int(shape["D"]), n_layers=int(shape["L"]),
                               n_heads=int(shape["N"]), kv_heads=int(shape["K"]), head_size=int(shape["d_h"]),
                               mlp_width=int(shape["F"]), tie_embeddings=shape["t"] == 1, max_context=16)
    assert counted == dantinox.param_bytes(cfg) // 4  # float32 parameters
    model = catalogue()["llama-3.2-1b"]
    config = model["config"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["num_key_value_heads"], config["head_dim"]) == (shape["D"], shape["L"], shape["N"], shape["K"],
                                                                   shape["d_h"])
    assert model["parameters"] == counted
    share = next(s for s in entry.specs
                 if s.compute and s.compute.science == "Tied head share of a Llama-style decoder")
    assert share.compute.with_ == {k: v for k, v in shape.items() if k != "t"}


def test_window_paging_and_quantization_reduce_to_the_kv_cache_formula():
    kv, swa = ENTRIES["kv-cache"], ENTRIES["sliding-window-attention"]
    paged, quant = ENTRIES["paged-attention"], ENTRIES["kv-cache-quantization"]
    cfg = dantinox.ModelConfig.preset("test", kv_heads=2, cache_dtype="bfloat16")
    shape = dict(L=cfg.n_layers, H_kv=cfg.n_kv_heads, d_h=cfg.head_size)
    for T in (16, 64):
        measured = dantinox.tree_nbytes(dantinox.init_cache(cfg, 1, length=T))
        assert content.evaluate(kv, "KV cache size", B=1, T=T, bytes=2, **shape) == measured
        assert content.evaluate(swa, "Sliding-window cache size", B=1, T=T, W=T, bytes=2, **shape) == measured
        assert content.evaluate(paged, "Paged cache size", T=T, P=16, bytes=2, **shape) == measured
        assert content.evaluate(quant, "Quantized KV cache size", B=1, T=T, q=16, z=0, G=1, **shape) == measured
        assert content.evaluate(quant, "Cache with a full-precision window", T=T, n_fp=T, bytes=2, q=4, z=4, G=32,
                                **shape) == measured
    # hybrid with only global layers is full attention; a window never enlarges the cache
    assert content.evaluate(swa, "Hybrid cache relative to full attention", L_g=1, L_l=0, T=100, W=10) == 1
    assert content.evaluate(swa, "Cache reduction from the window", T=10, W=100) == 1
