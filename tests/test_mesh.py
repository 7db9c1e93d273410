"""generate(mesh=...) on 8 simulated CPU devices: the same tokens as one device, the cache split as documented.

JAX fixes its device count when it starts, so the mesh runs happen in a subprocess started with
XLA_FLAGS=--xla_force_host_platform_device_count=8; it prints one JSON line that the tests read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from fast_compile import FAST_COMPILE

SCRIPT = r"""
import json
import jax, numpy as np, dantinox
from flax import nnx
from dantinox.generation import sharding

out = {"devices": jax.device_count(), "runs": [], "errors": {}}
# each mesh compiles the model anew: four meshes that between them cut by batch and by heads, evenly (K on the
# model axis), copied (MHA's 4 heads on 8 devices) and with fewer heads than devices on the axis (GQA on 2 x 4)
for attention, kv, shapes in (("mha", None, ((2, 4), (1, 8))), ("gqa", 2, ((2, 4), (4, 2)))):
    # max_context 256: the 12 new tokens cross the 128-slot key bucket, so the grown cache is checked too
    cfg = dantinox.ModelConfig.preset("test", kv_heads=kv, max_context=256)
    model = dantinox.Transformer(cfg, rngs=nnx.Rngs(0))
    prompt = np.random.RandomState(0).randint(0, 256, (4, 122)).astype(np.int32)
    single = np.asarray(dantinox.generate(model, prompt, 12))
    for shape in shapes:
        mesh = jax.make_mesh(shape, ("data", "model"), devices=jax.devices()[: shape[0] * shape[1]])
        tokens = np.asarray(dantinox.generate(model, prompt, 12, mesh=mesh))
        caches = list(dantinox.stream(model, prompt, 12, mesh=mesh, chunk_tokens=12))[-1].caches
        layout = sharding.plan(cfg, mesh, 4)
        out["runs"].append(dict(
            attention=attention, K=cfg.n_kv_heads, shape=list(shape), same_tokens=bool((tokens == single).all()),
            slots=caches.layers[0].slots, per_device=sorted(set(sharding.device_bytes(caches).values())),
            devices_holding=len(sharding.device_bytes(caches)), total=dantinox.tree_nbytes(caches),
            replicated=layout.replicated,
            heads=[list(r["heads"]) for r in sharding.holdings(cfg, layout, 4)],
            sequences=[list(r["sequences"]) for r in sharding.holdings(cfg, layout, 4)]))

# bfloat16 weights and cache: the dense kernel's products and embedding rows and the in-place cache store are
# custom calls, which the partitioner must run on sharded operands
cfg = dantinox.ModelConfig.preset("test", kv_heads=2, param_dtype="bfloat16", cache_dtype="bfloat16")
model = dantinox.Transformer(cfg, rngs=nnx.Rngs(0))
prompt = np.random.RandomState(1).randint(0, 256, (4, 6)).astype(np.int32)
mesh = jax.make_mesh((2, 2), ("data", "model"), devices=jax.devices()[:4])
out["bf16_same_tokens"] = bool((np.asarray(dantinox.generate(model, prompt, 8))
                                == np.asarray(dantinox.generate(model, prompt, 8, mesh=mesh))).all())

cfg = dantinox.ModelConfig.preset("test", kv_heads=2)
model = dantinox.Transformer(cfg, rngs=nnx.Rngs(0))
prompt = np.zeros((4, 3), np.int32)
bad = {"names": jax.make_mesh((2, 4), ("x", "y")), "batch": jax.make_mesh((8, 1), ("data", "model")),
       "heads": jax.make_mesh((1, 3), ("data", "model"), devices=jax.devices()[:3]), "type": "2x4"}
for name, mesh in bad.items():
    try:
        dantinox.generate(model, prompt, 2, mesh=mesh)
        out["errors"][name] = None
    except ValueError as err:
        out["errors"][name] = str(err)
try:
    dantinox.generate(model, prompt, 2, mesh=jax.make_mesh((2, 2), ("data", "model"), devices=jax.devices()[:4]),
                      cache_layout="paged")
    out["errors"]["paged"] = None
except ValueError as err:
    out["errors"]["paged"] = str(err)
from widgets.mesh_lab import MeshLab, read_mesh

cfg = dantinox.ModelConfig.preset("test", kv_heads=2)
arrays, shapes = read_mesh(cfg, (2, 4), 4, 32), read_mesh(cfg, (2, 4), 4, 32, budget=0)
out["mesh_lab"] = dict(arrays=sorted(set(arrays.device_bytes.values())), formula=arrays.formula_bytes,
                       shapes=sorted(set(shapes.device_bytes.values())), sources=[arrays.source, shapes.source])
lab = MeshLab(preset="test", mesh_shape="2×4", kv_heads=2, batch=4, context=32)
out["mesh_lab"]["replicated_note"] = "replicated" in lab.status_html.value
lab.update(kv_heads=4)
out["mesh_lab"]["after"] = [lab.error, "replicated" in lab.status_html.value, lab.reading.formula_bytes]
try:
    lab.update(batch=3)
    out["mesh_lab"]["bad_batch"] = None
except ValueError as err:
    out["mesh_lab"]["bad_batch"] = str(err)
lab.mesh_shape.value = "8×1"  # as a learner picks it: the batch (4) moves to the nearest multiple of 8
out["mesh_lab"]["snapped"] = [lab.batch.value, lab.batch.step, lab.error,
                              "batch moved from 4 to 8" in lab.status_html.value]
lab.batch.value = 16
out["mesh_lab"]["snapped"].append("batch moved" in lab.status_html.value)  # said once, not at every move
lab.update(mesh_shape="2×4", batch=8)
lab.mesh_shape.value = "1×8"  # a data axis of 1 takes every batch: B = 8 stays (it became 9, unannounced)
out["mesh_lab"]["kept"] = [lab.batch.value, lab.reading.batch, "batch moved" in lab.status_html.value,
                           lab.batch.type("9"), lab.reading.batch]
lab.mesh_shape.value = "2×4"  # 9 is not a multiple of 2: moved, and said so
out["mesh_lab"]["kept"] += [lab.batch.value, "batch moved from 9 to" in lab.status_html.value]
import widgets.mesh_lab as mesh_lab_module


def broken(*_args):
    raise ValueError("mesh: broken on purpose")


mesh_lab_module.read_mesh = broken  # a failing setting: the error shows and no table of the last one stays
lab.update(mesh_shape="2×4", batch=4)
out["mesh_lab"]["table_after_error"] = [lab.error, lab.table_html.value + lab.grid_html.value]
mesh_lab_module.read_mesh = read_mesh
from widgets.mesh_lab import device_grid_html

out["mesh_lab"]["placement"] = [[[d, list(s), list(h)] for d, (s, h) in sorted(r.placement.items())]
                                for r in (arrays, shapes)]
out["mesh_lab"]["holdings"] = sorted([h["device"], list(h["sequences"]), list(h["heads"])] for h in arrays.holdings)
out["mesh_lab"]["grid"] = [list(row) for row in arrays.grid]
out["mesh_lab"]["boxes"] = [device_grid_html(r).count("class='mesh-device'") for r in (arrays, shapes)]
import content

gqa = content.load_entry("grouped-query-attention")
item = gqa.science_item("KV cache per device on a mesh")
lab.update(kv_heads=2, batch=4)  # 2×4 mesh, K = 2: heads replicated twice
params = lab.formula_params()
out["mesh_lab"]["content_share"] = [content.evaluate(gqa, item.title, **{k: params[k] for k in item.variables}),
                                    lab.reading.formula_bytes, sorted(set(lab.reading.device_bytes.values()))]
out["mesh_lab"]["badges"] = ["measured: shard indices" in device_grid_html(arrays),
                             "derived: the sharding" in device_grid_html(shapes)]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def mesh_runs():
    # compiled as the other tests compile (tests/conftest.py): the programs are checked, not timed
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count=8 {FAST_COMPILE}"}
    res = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_eight_simulated_devices(mesh_runs):
    assert mesh_runs["devices"] == 8
    assert len(mesh_runs["runs"]) == 4


def test_tokens_identical_to_one_device(mesh_runs):
    for run in mesh_runs["runs"]:
        assert run["same_tokens"], run
    assert mesh_runs["bf16_same_tokens"]  # bfloat16 weights and cache, through the kernels' custom calls


def test_per_device_cache_bytes_follow_the_formula(mesh_runs):
    L, H, B, itemsize = 2, 8, 4, 4  # the test preset, float32 cache
    for run in mesh_runs["runs"]:
        data, model = run["shape"]
        K, S = run["K"], run["slots"]
        assert S == 192  # grown past the first key bucket (128) while decoding
        total = B * S * K * H * 2 * L * itemsize
        assert run["total"] == total
        assert run["per_device"] == [total // (data * min(model, K))], run  # every device holds the same share
        assert run["devices_holding"] == data * model


def test_heads_replicated_when_the_model_axis_exceeds_k(mesh_runs):
    by_key = {(r["attention"], tuple(r["shape"])): r for r in mesh_runs["runs"]}
    gqa = by_key[("gqa", (2, 4))]  # K = 2 on a model axis of 4: each head on two devices
    assert gqa["replicated"] and sorted(map(tuple, gqa["heads"])).count((0,)) == 4
    mha = by_key[("mha", (2, 4))]  # K = 4 on 4: one head per device, nothing replicated
    assert not mha["replicated"] and sorted(h for hs in mha["heads"] for h in hs) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert mha["sequences"][0] == [0, 1] and mha["sequences"][-1] == [2, 3]


def test_bad_meshes_are_one_line_errors(mesh_runs):
    errors = mesh_runs["errors"]
    assert errors["names"] == "mesh: expected axis names ('data', 'model'), got ('x', 'y')"
    assert errors["batch"] == "mesh: the data axis (8) must divide the batch (4)"
    assert errors["heads"] == "mesh: the model axis (3) must divide K=2 or be a multiple of it"
    assert errors["type"].startswith("mesh: expected a jax.sharding.Mesh")
    assert errors["paged"].startswith("mesh: the paged cache runs on one device")


def test_mesh_lab_measures_each_device(mesh_runs):
    lab = mesh_runs["mesh_lab"]
    share = 4 * 32 * 2 * 8 * 2 * 2 * 4 // (2 * 2)  # B · T · K · H · 2 · L · bytes / (data · min(model, K))
    assert lab["arrays"] == lab["shapes"] == [lab["formula"]] == [share]
    assert lab["sources"] == ["arrays", "shapes"]
    # K = 4 on 4: twice the heads cut twice as many ways (the same share in f32), no replicas; the lab's cache is bf16
    assert lab["replicated_note"] and lab["after"] == ["", False, share // 2]
    assert lab["bad_batch"] == "batch: expected an integer in [2, 64] in steps of 2, got 3"  # the slider's grid
    assert lab["snapped"] == [8, 8, "", True, False]
    assert lab["kept"][:5] == [8, 8, False, True, 9] and lab["kept"][6] is True
    error, stale = lab["table_after_error"]
    assert error == "mesh: broken on purpose" and stale == ""  # no table of the last setting under the error


def test_mesh_lab_grid_shows_what_each_device_holds(mesh_runs):
    lab = mesh_runs["mesh_lab"]
    # read from the arrays' shards (and from the sharding's map, unallocated): equal to the layout's holdings
    assert lab["placement"][0] == lab["placement"][1] == lab["holdings"]
    by_device = {d: (seqs, heads) for d, seqs, heads in lab["holdings"]}
    assert lab["grid"] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # data rows × model columns, as jax.make_mesh placed them
    assert [by_device[d] for d in lab["grid"][1]] == [([2, 3], [0]), ([2, 3], [0]), ([2, 3], [1]), ([2, 3], [1])]
    assert lab["boxes"] == [8, 8] and lab["badges"] == [True, True]


def test_the_content_formula_gives_each_devices_measured_share(mesh_runs):
    formula, share, measured = mesh_runs["mesh_lab"]["content_share"]  # the quiz's formula at the lab's settings
    assert formula == share and measured == [share]
