"""The roofline: bytes and FLOPs against hand-counted values, the critical batch, timings, readings and the lab."""

from __future__ import annotations

import dataclasses
import math

import pytest
from flax import nnx

import content
import dantinox
from dantinox.accounting import roofline
from widgets.roofline_lab import RooflineLab
from widgets.roofline_reading import points, read_decode, read_prefill, roofline_reading

# The test preset: D=32, L=2, N=4, H=8, F=64, V=259, tied embeddings, float32.
MHA = dantinox.ModelConfig.preset("test")
GQA = dantinox.ModelConfig.preset("test", kv_heads=2, cache_dtype="bfloat16")
MLA = dantinox.ModelConfig.preset("test", attention="latent", kv_latent_dim=8, rope_head_dim=4, cache_dtype="bfloat16")
TOY = roofline.Machine("toy", bandwidth=2e9, peak_flops=1e10, compute_dtype="float32", kind="measured",
                       source="hand-made for tests", memory_bytes=10**9)


@pytest.fixture(scope="module")
def entry():
    return content.load_entry("prefill-and-decode")


def test_weights_counted_by_hand_and_equal_to_the_parameter_arrays():
    # per layer: QKV 32·(4+2·4)·8 = 3072, out 32·32 = 1024, gate/up 32·128 = 4096, down 64·32 = 2048, norms 64
    mha_layer = 3072 + 1024 + 4096 + 2048 + 64
    assert roofline.weight_count(MHA) == 2 * mha_layer + 259 * 32 + 32 == 28_928
    gqa_layer = 32 * (4 + 2 * 2) * 8 + 1024 + 4096 + 2048 + 64  # K = 2 shrinks only the QKV projection
    assert roofline.weight_count(GQA) == 2 * gqa_layer + 259 * 32 + 32 == 26_880
    for cfg in (MHA, GQA, dantinox.ModelConfig.preset("reference", kv_heads=1)):
        assert roofline.weight_count(cfg) * 4 == dantinox.param_bytes(cfg)  # measured from the shapes


def test_mla_weights_by_hand_and_equal_to_the_parameter_arrays_native_and_converted():
    # per layer: query 32·4·(8 + 4) = 1536, latent 32·8 = 256, RoPE key 32·4 = 128, W_UK and W_UV 8·4·(8 + 8)
    # = 512, output 1024, MLP 6144, norms 64 + the latent's 8
    assert roofline.weight_count(MLA) == 2 * (1536 + 256 + 128 + 512 + 1024 + 6144 + 72) + 259 * 32 + 32 == 27_664
    native = (MLA, MLA.replace(q_latent_dim=16, mla_decode="materialized"))
    converted = dantinox.convert_attention(dantinox.Transformer(GQA, rngs=nnx.Rngs(0)), to="mla", latent_dim=8,
                                           rope_pairs=1, keep="high")  # MHA2MLA: 2 RoPE key heads, nope 6, no norm
    for cfg in native:
        assert roofline.weight_count(cfg) * 4 == dantinox.param_bytes(cfg)  # measured from the shapes
    assert roofline.weight_count(converted.cfg) * 4 == dantinox.param_bytes(converted)  # its arrays
    assert roofline.decode_cost(converted.cfg, 2, 16).cache_read_bytes == 2 * 2 * 16 * (8 + 4) * 2  # bf16, as GQA


def test_mla_step_reads_the_latent_cache_and_counts_the_absorbed_decode_as_the_content_does():
    """The MLA entry's cache size and absorbed-decode FLOPs; the materialized path re-forms K and V instead."""
    mla = content.load_entry("multi-head-latent-attention")
    size = dict(L=2, B=3, C=8, R=4, bytes=2)  # bf16 latents
    c = roofline.decode_cost(MLA, batch=3, context=16)
    assert c.cache_read_bytes == content.evaluate(mla, "MLA latent cache size", T=16, **size) == 2_304
    assert c.cache_write_bytes == content.evaluate(mla, "MLA latent cache size", T=1, **size) == 144
    up = 8 * 4 * (8 + 8)  # W_UK and W_UV of a layer, multiplied once per query in the absorbed path
    assert c.matmul_flops == 2 * 3 * (2 * (1536 + 256 + 128 + up + 1024 + 6144) + 259 * 32)
    attention = content.evaluate(mla, "Absorbed MLA decode attention FLOPs", L=2, B=3, T=16, N=4, C=8, R=4, d_h=8)
    assert c.attention_flops + 2 * 3 * 2 * up == attention == 21_504  # scores C + R wide, sums C wide, + folds
    m = roofline.decode_cost(MLA.replace(mla_decode="materialized"), batch=3, context=16)
    assert m.bytes == c.bytes  # the same cache read: only the arithmetic differs
    assert m.matmul_flops == c.matmul_flops - 2 * 3 * 2 * up + 2 * 3 * 16 * 2 * up  # every cached latent, up
    assert m.attention_flops == 3 * 16 * 2 * 2 * 4 * (8 + 4 + 8)  # per head: nope + R key, then an 8-wide value
    p = roofline.prefill_cost(MLA, batch=1, prompt=8)
    assert p.attention_flops == 8 * 8 * 2 * 2 * 4 * (2 * 8 + 4) and p.cache_write_bytes == 2 * 8 * 12 * 2


def test_decode_step_bytes_and_flops_by_hand():
    c = roofline.decode_cost(MHA, batch=3, context=16)
    assert c.weight_bytes == 28_928 * 4
    assert c.cache_read_bytes == 2 * 3 * 16 * 2 * 4 * 8 * 4  # L · B · S · 2 · K · H · 4 bytes = 24,576
    assert c.cache_write_bytes == 2 * 3 * 1 * 2 * 4 * 8 * 4  # one new token per sequence
    matmul_weights = 2 * (3072 + 1024 + 4096 + 2048) + 259 * 32  # the tied embedding is the output head
    assert c.matmul_flops == 2 * 3 * matmul_weights == 172_608
    assert c.attention_flops == 4 * 3 * 16 * 2 * 4 * 8  # scores and weighted values: 4 · B · S · L · N · H
    assert c.bytes == 115_712 + 24_576 + 1_536 and c.flops == 172_608 + 12_288
    g = roofline.decode_cost(GQA, batch=3, context=16)
    assert g.cache_read_bytes == 2 * 3 * 16 * 2 * 2 * 8 * 2  # K = 2 heads, bf16
    assert g.attention_flops == c.attention_flops  # every query head still attends over every slot
    assert roofline.decode_cost(MHA.replace(cache_layout="paged", page_size=5), batch=40, context=16).bytes == \
        roofline.decode_cost(MHA, batch=40, context=16).bytes  # the pool kernel: each sequence's own pages


def test_paged_decode_step_bytes_and_flops_read_through_xla(xla_pool_reads):
    c = roofline.decode_cost(MHA, batch=3, context=16)
    paged_cfg = MHA.replace(cache_layout="paged", page_size=5)
    pooled = roofline.decode_cost(paged_cfg, batch=3, context=16)  # 3 x 4 pages of 5: read whole, no copy
    assert pooled.page_gather_bytes == 0 and pooled.bytes == c.bytes
    assert pooled.attention_flops == c.attention_flops + 4 * 3 * (3 * 20 - 16) * 2 * 4 * 8  # every page, every query
    paged = roofline.decode_cost(paged_cfg, batch=40, context=16)  # 39 other sequences' pages per own: gathered
    assert paged.page_gather_bytes == 2 * (2 * 40 * 20 * 2 * 4 * 8 * 4)  # 4 pages of 5 slots, copied then read
    plain = roofline.decode_cost(MHA, batch=40, context=16)
    assert paged.bytes == plain.bytes + paged.page_gather_bytes and plain.page_gather_bytes == 0
    assert paged.attention_flops == plain.attention_flops
    ring = MHA.replace(cache_layout="paged", page_size=5, sliding_windows=(4, None))  # the ring is not paged
    assert roofline.decode_cost(ring, 40, 16).page_gather_bytes == paged.page_gather_bytes // 2


def test_prefill_bytes_and_flops_by_hand():
    c = roofline.prefill_cost(MHA, batch=2, prompt=8)
    assert c.matmul_flops == 2 * 2 * 8 * 28_768
    assert c.attention_flops == 4 * (2 * 8) * 8 * 2 * 4 * 8  # the full 8 × 8 score matrix, masked half too
    assert c.cache_write_bytes == c.cache_read_bytes == 2 * 2 * 8 * 2 * 4 * 8 * 4


def test_roofline_is_the_larger_of_memory_and_compute_time():
    small, large = roofline.decode_cost(MHA, 1, 16), roofline.decode_cost(MHA, 4096, 16)
    assert small.time(TOY) == small.bytes / 2e9 > small.flops / 1e10 and small.bound(TOY) == "memory"
    assert large.time(TOY) == large.flops / 1e10 > large.bytes / 2e9 and large.bound(TOY) == "compute"
    b = roofline.crossover_batch(MHA, 16, TOY)
    assert roofline.decode_cost(MHA, b, 16).bound(TOY) == "compute"
    assert roofline.decode_cost(MHA, b - 1, 16).bound(TOY) == "memory"
    assert roofline.crossover_batch(MHA, 16, dataclasses.replace(TOY, peak_flops=1e20)) is None


def test_generate_roofline_is_the_prefill_then_each_step_over_its_filled_slots():
    """benchmarks/decode.py's "% of roofline" divides this by a measured generate() call."""
    memory_bound = dataclasses.replace(TOY, peak_flops=1e30)  # every part then costs its bytes / bandwidth
    got = roofline.generate_seconds(MHA, batch=2, prompt=5, new_tokens=3, machine=memory_bound)
    weights, per_slot = 28_928 * 4, 2 * 2 * 2 * 4 * 8 * 4  # L · B · (K and V) · K · H · 4 bytes per filled slot
    prefill = weights + 2 * 5 * per_slot  # reads back and writes its 5 slots
    steps = sum(weights + filled * per_slot + per_slot for filled in (6, 7, 8))  # read the filled slots, write one
    assert got == pytest.approx((prefill + steps) / 2e9, rel=1e-12)
    assert roofline.generate_seconds(MHA, 2, 5, 0, memory_bound) == pytest.approx(prefill / 2e9, rel=1e-12)


def test_critical_batch_is_flops_over_bandwidth(entry):
    bf16 = roofline.Machine("x", bandwidth=3.35e12, peak_flops=9.89e14, compute_dtype="bfloat16", kind="derived",
                            source="", memory_bytes=1)
    assert bf16.critical_batch() == pytest.approx(9.89e14 / 3.35e12)
    assert bf16.critical_batch() == pytest.approx(content.evaluate(entry, "Critical batch size", F=9.89e14,
                                                                   BW=3.35e12))
    assert TOY.critical_batch() == pytest.approx(1e10 / 2e9 * 4 / 2)  # f32: a weight is 4 bytes, 2 FLOPs per token


def test_datasheet_machines_come_from_content(entry):
    machines = {m.name: m for m in roofline.datasheet_machines(entry.specs)}
    assert set(machines) == {"A100 80GB", "H100 80GB", "H200 141GB"}
    hbm = content.load_entry("hbm-stack")
    published = {v for s in hbm.specs if s.compute for k, v in s.compute.with_.items() if k.startswith("BW")}
    for m in machines.values():
        assert m.kind == "derived" and m.bandwidth in published  # the same bandwidths hbm-stack cites
        assert m.memory_bytes == dantinox.DEVICE_PRESETS[m.name].memory_bytes
    assert machines["H100 80GB"].critical_batch() > 250 > 15 > TOY.critical_batch()


@pytest.mark.parametrize("call, message", [
    (lambda: roofline.decode_cost(MHA, 0, 16), "batch: expected a positive integer"),
    (lambda: roofline.prefill_cost(MHA, 1, -3), "prompt: expected a positive integer"),
    (lambda: roofline.generate_seconds(MHA, 1, 4, -1, TOY), "new_tokens: expected"),
    (lambda: roofline.decode_step_seconds(dantinox.Transformer(MHA, rngs=nnx.Rngs(0)), 1, 65),
     "context: expected at most max_context=64"),
])
def test_bad_arguments_are_one_line_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_machine_microbenchmarks_measure_positive_rates():
    bw = roofline.measure_bandwidth(nbytes=8 * 2**20, repeats=2)
    flops = roofline.measure_matmul_flops(n=256, repeats=2)
    assert 1e8 < bw < 1e13 and 1e8 < flops < 1e15


def test_reading_functions_return_measured_points_with_labels():
    decode = read_decode(MHA, 16, (1, 8), repeats=2)
    prefill = read_prefill(MHA, (8, 32), repeats=2)
    assert decode.xs == (1, 8) and all(s > 0 and math.isfinite(s) for s in decode.seconds)
    pts = points(decode, TOY)
    assert [p.x for p in pts] == [1, 8]
    assert all(p.label.startswith("measured, this machine: decode step, B=") for p in pts)
    assert pts[1].roofline_seconds == roofline.decode_cost(MHA, 8, 16).time(TOY)
    assert pts[0].percent_of_roofline == pytest.approx(100 * pts[0].roofline_seconds / decode.seconds[0])
    assert all("prefill" in p.label for p in points(prefill, TOY))


def test_reading_shows_points_only_for_the_model_they_timed(entry):
    decode = read_decode(MHA, 16, (1, 8), repeats=2)
    same = roofline_reading(entry, MHA, 4, 16, TOY, decode=decode)
    assert len(same.decode_points) == 2 and same.measured_knee == pytest.approx(
        decode.seconds[0] * 8 / decode.seconds[1])
    assert roofline_reading(entry, MHA, 4, 32, TOY, decode=decode).decode_points == ()
    assert roofline_reading(entry, GQA, 4, 16, TOY, decode=decode).decode_points == ()
    # the content's memory floor is the roofline's bytes without the one-token write
    cost = same.decode_cost
    assert same.floor_formula_seconds == pytest.approx((cost.weight_bytes + cost.cache_read_bytes) / TOY.bandwidth)


def test_lab_renders_and_responds(entry):
    devices = tuple(roofline.datasheet_machines(entry.specs))
    lab = RooflineLab(entry, TOY, devices=devices, preset="test", batch=2, context=16,
                      decode=read_decode(GQA, 16, (1, 8), repeats=2), batches=(1, 2), prompts=(8,), repeats=2)
    assert lab.error == "" and len(lab.reading.decode_points) == 2 and len(lab.reading.devices) == 4
    assert "measured" in lab.readout_html.value and "H200 141GB" in lab.devices_html.value
    assert lab.figure.data[3].x == (1, 8)  # the measured dots are drawn
    legend = {t.legendgroup: t.line.color for t in lab.figure.data[:3]}  # the legend shows the decode panel's
    assert all(legend[t.legendgroup] == t.line.color for t in lab.figure.data[4:7])  # prefill: the same colours
    assert len(set(legend.values())) == 3 and lab.figure.layout.width is None  # fits the notebook's width
    lab.batch.value = 256
    assert lab.reading.batch == 256 and lab.reading.devices[0].bound == "compute"
    assert lab.figure.data[10].x == (256,)
    lab.attention.value = "mha"  # another model: its dots are not the ones timed, so they are hidden
    assert lab.reading.cfg.n_kv_heads == 4 and lab.reading.decode_points == ()
    assert "time this model here" in lab.status_html.value
    lab.context.value = 64  # loops of 4 and 20 steps: at 16 slots the two lengths were too close to time on a busy CPU
    lab.measure_button.click()  # the button, as a learner presses it (the browser test does not: tests/browser)
    lab.wait()  # the button's timing runs in a thread (the kernel hears its stop button meanwhile)
    assert lab.error == "" and [p.x for p in lab.reading.decode_points] == [1, 2]
    assert [p.x for p in lab.reading.prefill_points] == [8]
    busy = []  # while a measurement runs, neither button takes a second click
    lab._measure("timing", lambda: busy.append((lab.measure_button.disabled, lab.profile_button.disabled,
                                                lab.batch.disabled, lab.context.disabled,
                                                lab.measure_button.description, lab.status_html.value)))
    assert busy[0][:4] == (True, True, True, True) and busy[0][4].startswith("working")
    assert "timing" in busy[0][5]  # the note is on screen while it works
    assert not lab.measure_button.disabled and not lab.profile_button.disabled and not lab.batch.disabled
    assert lab.measure_button.description == "time this model here"
    assert lab.context.type("37") and lab.reading.context == 37  # typed, used exactly
    with pytest.raises(ValueError, match=r"context: expected an integer in \[1, 64\], got 65"):
        lab.update(context=65)


def test_stop_ends_the_timing_before_its_next_point_and_keeps_what_was_timed(entry, monkeypatch):
    lab = RooflineLab(entry, TOY, preset="test", batch=2, context=24, batches=(1, 2), prompts=(8,), repeats=1)
    timed = []
    real = read_decode

    def stop_after_the_first(cfg, context, batches, repeats):
        timed.append(batches)
        if len(timed) == 1:
            assert not lab.stop_button.disabled and lab.measure_button.disabled  # offered while it times
            lab.stop_button.click()
        return real(cfg, context, batches, repeats)

    monkeypatch.setattr("widgets.roofline_lab.read_decode", stop_after_the_first)
    lab.measure_button.click()
    lab.wait()
    assert timed == [(1,)] and "Stopped after 1 of 3 timings" in lab.status_html.value
    assert lab.reading.decode_points == () and lab.error == ""  # a part of a sweep is not drawn as a sweep
    assert lab.stop_button.disabled and not lab.measure_button.disabled
    hits = read_decode.cache_info().hits
    lab.measure_button.click()  # again: the kept timing is not repeated (read_decode is cached per point)
    lab.wait()
    assert [p.x for p in lab.reading.decode_points] == [1, 2] and "Stopped" not in lab.status_html.value
    assert timed == [(1,), (1,), (2,)] and read_decode.cache_info().hits == hits + 1  # B=1 from the cache


def test_profile_sorts_a_decode_step_into_categories_that_cover_it():
    from dantinox.accounting.profile import ATTENTION, CATEGORIES, WEIGHTS, categorize, profile_decode_step

    model = dantinox.Transformer(GQA, rngs=nnx.Rngs(0))
    p = profile_decode_step(model, batch=2, context=48, steps=5)
    assert set(p.seconds) == set(CATEGORIES) and p.seconds[WEIGHTS] > 0 and p.seconds[ATTENTION] > 0
    assert sum(t > 0 for t in p.seconds.values()) >= 3 and p.total == sum(p.seconds.values())
    assert p.read_bytes == {WEIGHTS: 26_880 * 4, ATTENTION: dantinox.kv_cache_bytes(GQA, 2, 48)}
    assert p.bandwidth(WEIGHTS) == p.read_bytes[WEIGHTS] / p.seconds[WEIGHTS] and p.bandwidth(CATEGORIES[3]) is None
    hlo = """%body.1 (p: (f32[2])) -> (f32[2]) {
  %dot.1 = f32[2,96]{1,0} dot(%x, %w), metadata={op_name="jit(f)/while/body/mlp/dot_general"}
  %dot.2 = f32[2,2,4,48]{3,2,1,0} dot(%q, %k), lhs_batch_dims={0,1}
  %fusion.3 = f32[2,2,48,8]{3,2,1,0} fusion(%k, %new), metadata={op_name="jit(f)/while/body/cache_write/dus"}
  %add.4 = f32[2,32]{1,0} add(%a, %b), metadata={op_name="jit(f)/while/body/add"}
}

ENTRY %main.2 (c: f32[2,2,48,8]) -> (f32[2]) {
  %copy.6 = f32[2,2,48,8]{3,2,1,0} copy(%c)
  %while.5 = (f32[2]) while(%t), condition=%cond.3, body=%body.1
}"""
    assert categorize(hlo, 48) == {"dot.1": WEIGHTS, "dot.2": ATTENTION, "fusion.3": CATEGORIES[2],
                                   "add.4": CATEGORIES[3]}  # the entry's one-off copy and the loop are left out
    with pytest.raises(ValueError, match="context: expected at most max_context=64"):
        profile_decode_step(model, 1, 65)


def test_lab_profile_stops_between_stages_then_profiles_an_mla_step(entry, monkeypatch):
    from dantinox.accounting import profile as profiling
    from widgets._a11y import LIVE
    from widgets.roofline_lab import PROFILE_STAGES

    lab = RooflineLab(entry, TOY, preset="test", batch=2, context=16, batches=(1, 2), prompts=(8,), repeats=1,
                      attention="mla", latent=16)
    cfg = lab.reading.cfg
    assert cfg.variant == "mla" and (cfg.kv_latent_dim, cfg.rope_head_dim) == (16, 4) and lab.error == ""
    assert lab.kv_heads.layout.display == "none" and lab.latent.layout.display is None  # C instead of K
    assert "MLA (C=16, R=4)" in lab.figure.layout.title.text
    assert "press <b>where does a step's time go?</b>" in lab.profile_html.value
    seen, categorize = [], profiling.categorize

    def stop_while_compiling(*args):  # the learner presses stop while XLA compiles: it ends before the next stage
        seen.append((lab.status_html.value, lab.stop_button.disabled, lab.profile_button.disabled,
                     lab.profile_button.description, lab.latent.disabled))
        lab.stop_button.click()
        return categorize(*args)

    monkeypatch.setattr(profiling, "categorize", stop_while_compiling)
    lab.profile_button.click()  # as a learner presses it: in a thread, so the kernel hears stop
    lab.wait()
    status, stop_off, profile_off, label, latent_off = seen[0]
    assert "compiling the decode loop (stage 2 of 5)" in status and "stop</b> ends it" in status  # said, live
    assert LIVE in lab.status_html._dom_classes and not stop_off and profile_off and latent_off
    assert label.startswith("working")
    assert (f"Stopped the profile before {PROFILE_STAGES[2]} (done: building the model, compiling the decode "
            "loop)") in lab.status_html.value and lab.error == ""
    assert "press" in lab.profile_html.value and lab.profile is None  # nothing half-made is shown or kept
    assert lab.stop_button.disabled and not lab.profile_button.disabled and not lab.latent.disabled
    monkeypatch.undo()
    profile = lab.profile_step()  # the whole profile, of the MLA step: its latent attention sorted by scope
    assert lab.error == "" and profile.batch == 2 and profile.context == 16 and profile.cfg == cfg
    assert profile.seconds[profiling.ATTENTION] > 0 and profile.seconds[profiling.WEIGHTS] > 0
    assert profile.read_bytes[profiling.ATTENTION] == dantinox.kv_cache_bytes(cfg, 2, 16)
    assert "weight matmuls" in lab.profile_html.value and "attention over the cache" in lab.profile_html.value
    assert "measured" in lab.profile_html.value and "GB/s" in lab.profile_html.value
    lab.batch.value = 4  # another setting: the profile of B=2 is not shown as if it were this one's
    assert "press" in lab.profile_html.value
    lab.attention.value = "gqa"  # back to K: the latent control gives way
    assert lab.kv_heads.layout.display is None and lab.latent.layout.display == "none"
