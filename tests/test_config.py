"""ModelConfig and the argument checks every entry point shares (numpy integers accepted, bools refused)."""

import json

import numpy as np
import pytest
from flax import nnx

import dantinox
from dantinox.architectures.config import heads_fields
from dantinox.generation import diffusion
from dantinox.rundir import load_run, save_run


def test_kv_heads_is_the_one_stored_fact_and_the_variant_a_label():
    ref = dantinox.ModelConfig.preset("reference")
    four = ref.replace(n_heads=4)
    assert four.kv_heads is None and four.n_kv_heads == 4 and four.groups == 1 and four.variant == "mha"
    assert ref.kv_heads is None and ref.n_kv_heads == 8
    mqa = ref.replace(kv_heads=1)
    assert mqa.n_kv_heads == 1 and mqa.groups == 8 and mqa.variant == "mqa"
    gqa = ref.replace(kv_heads=2)
    assert gqa.n_kv_heads == 2 and gqa.groups == 4 and gqa.variant == "gqa"
    assert gqa.replace(cache_dtype="int8").kv_heads == 2  # replace keeps every field it is not given
    assert ref.replace(kv_heads=8) == ref and ref.replace(kv_heads=8).kv_heads is None  # K = N is MHA, one way
    mla = ref.replace(attention="latent", kv_latent_dim=16, rope_head_dim=8)
    assert mla.variant == "mla" and mla.kv_heads is None
    assert [dantinox.ModelConfig.preset("test", **heads_fields(v, 4, k)).variant
            for v, k in (("mha", None), ("gqa", 2), ("mqa", None))] == ["mha", "gqa", "mqa"]
    assert ref.mlp_width == 768 and ref.replace(mlp_width=100).mlp_width == 100


def test_numpy_integers_are_accepted_everywhere_and_bools_nowhere():
    cfg = dantinox.ModelConfig.preset("test", n_layers=np.int64(2), max_context=np.int32(64))
    assert json.loads(json.dumps(cfg.to_dict()))["n_layers"] == 2
    model = dantinox.Transformer(cfg, rngs=nnx.Rngs(0))
    prompt = np.zeros((1, 3), np.int32)
    assert dantinox.tree_nbytes(dantinox.init_cache(cfg, np.int64(2), np.int32(5))) == dantinox.kv_cache_bytes(
        cfg, 2, 5)
    assert dantinox.generate(model, prompt, np.int64(2), top_k=np.int32(3), temperature=1.0).shape == (1, 5)
    assert len(list(dantinox.stream(model, prompt, np.int64(4), chunk_tokens=np.int16(2)))) == 2
    dlm = dantinox.Transformer(cfg.replace(paradigm="diffusion"), rngs=nnx.Rngs(0))
    assert diffusion.diffusion_generate(dlm, prompt, np.int64(4), block_size=np.int32(2)).tokens.shape == (1, 7)
    for call, name in [
        (lambda: dantinox.ModelConfig.preset("test", n_layers=True), "n_layers"),
        (lambda: dantinox.init_cache(cfg, True), "batch_size"),
        (lambda: dantinox.generate(model, prompt, True), "max_new_tokens"),
        (lambda: dantinox.generate(model, prompt, 2, temperature=1.0, top_k=True), "top_k"),
        (lambda: next(dantinox.stream(model, prompt, 2, chunk_tokens=True)), "chunk_tokens"),
        (lambda: diffusion.diffusion_generate(dlm, prompt, 4, block_size=True), "block_size"),
    ]:
        with pytest.raises(ValueError, match=f"{name}: expected a positive integer|{name}: expected an integer"):
            call()


def test_run_directories_written_before_this_config_still_load(tmp_path):
    cfg = dantinox.ModelConfig.preset("test")
    save_run(tmp_path, dantinox.Transformer(cfg, rngs=nnx.Rngs(0)))
    new = json.loads((tmp_path / "config.json").read_text())
    old = {**{k: v for k, v in new.items() if k != "cache"}, **new["cache"]}  # the cache's fields flat, as before
    old.update(attention="mha", kv_heads=4, mlp_width=None, d_model=32)  # how earlier versions wrote K and width
    (tmp_path / "config.json").write_text(json.dumps(old))
    with pytest.raises(ValueError, match="has shape"):  # width 3 * d_model = 96, the weights hold 64
        load_run(tmp_path)
    old["mlp_width"] = 64
    (tmp_path / "config.json").write_text(json.dumps(old))
    loaded, _ = load_run(tmp_path)
    assert (loaded.attention, loaded.kv_heads, loaded.n_kv_heads) == ("heads", None, 4)
    for variant, k, want in (("gqa", 2, 2), ("mqa", None, 1), ("mqa", 1, 1)):
        assert dantinox.ModelConfig.from_dict(dict(old, attention=variant, kv_heads=k)).n_kv_heads == want
    with pytest.raises(ValueError, match=r"kv_heads: attention='mha' has 4 KV heads \(n_heads\), got 2"):
        dantinox.ModelConfig.from_dict(dict(old, kv_heads=2))
    paged = {k: v for k, v in old.items() if k != "page_size"}
    assert dantinox.ModelConfig.from_dict(dict(paged, block_size=8)).page_size == 8  # the paged cache's old name
    with pytest.raises(ValueError, match="config: block_size is the old name of page_size; give one of them"):
        dantinox.ModelConfig.from_dict(dict(old, block_size=8))


@pytest.mark.parametrize("kw, match", [
    (dict(attention="gqa"), r"attention: expected one of heads, latent, got 'gqa' \(gqa is attention='heads' with "
                            r"kv_heads=K\)"),
    (dict(kv_heads=3), r"kv_heads: must divide n_heads \(4\), got 3"),
    (dict(attention="latent", kv_heads=2, kv_latent_dim=8, rope_head_dim=4), "kv_heads: attention='latent' caches"),
    (dict(attention="xla"), "attention: expected one of heads, latent, got 'xla'$"),
    (dict(dtype="int8"), "dtype: expected one of"),
    (dict(param_dtype="int8"), r"param_dtype: expected one of float32, bfloat16, float16 \(or None"),
    (dict(head_size=7), "head_size"),
    (dict(n_layers=0), "n_layers: expected a positive integer"),
    (dict(mlp_width=0), "mlp_width: expected a positive integer"),
    (dict(kv_latent_dim=8), "only used with attention='latent'"),
])
def test_config_errors_name_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        dantinox.ModelConfig.preset("test", **kw)


def test_ids_are_copied_so_later_changes_by_the_caller_cannot_reach_a_dispatched_computation():
    from dantinox.checks import check_ids

    ids = np.arange(12, dtype=np.int32).reshape(2, 6)
    checked = check_ids(259, ids)
    ids[:] = 0  # the caller reuses its buffer, as a decoding loop does
    np.testing.assert_array_equal(np.asarray(checked), np.arange(12).reshape(2, 6))


def test_the_cache_config_is_apart_from_the_architecture():
    """Each fact stored once: the cache's fields live in cfg.cache, read flat through the config, given flat or not."""
    flat = dantinox.ModelConfig.preset("test", cache_dtype="int8", cache_layout="paged", page_size=8)
    nested = dantinox.ModelConfig.preset("test", cache=dantinox.CacheConfig(cache_dtype="int8", cache_layout="paged",
                                                                            page_size=8))
    assert flat == nested and flat.cache.page_size == flat.page_size == 8 and flat.quantized_cache
    assert flat.replace(cache_dtype="float32").cache == dantinox.CacheConfig(cache_layout="paged", page_size=8)
    plain = dantinox.ModelConfig.preset("test")
    assert plain.with_cache(cache_layout="paged", page_size=8).cache == dantinox.CacheConfig(cache_layout="paged",
                                                                                            page_size=8)
    assert plain.with_cache(plain.cache) is plain
    written = flat.to_dict()
    assert written["cache"]["cache_dtype"] == "int8" and "cache_dtype" not in written and "page_size" not in written
    assert dantinox.ModelConfig.from_dict(json.loads(json.dumps(written))) == flat
    with pytest.raises(ValueError, match="config: page_size is given both flat and under cache; give it once"):
        dantinox.ModelConfig.from_dict(dict(written, page_size=4))
    with pytest.raises(ValueError, match="config: unknown field.s. cache.pages"):
        dantinox.ModelConfig.from_dict(dict(written, cache={"pages": 4}))
    # checked against the architecture whichever way it is given: KIVI needs a head size its groups divide
    with pytest.raises(ValueError, match=r"kivi_group: values are quantized in groups"):
        plain.with_cache(cache_dtype="kivi4", kivi_group=3, kivi_residual=8)


def test_every_shipped_run_directory_upgrades_on_load():
    """runs/*/config.json were written flat, before CacheConfig: they load, and write back in the new form."""
    from dantinox_labs import shipped

    configs = sorted(shipped.RUNS.glob("*/config.json"))
    assert configs
    for path in configs:
        old = json.loads(path.read_text())
        cfg = dantinox.ModelConfig.from_dict(old)
        assert cfg.cache_dtype == old.get("cache_dtype", "float32") and cfg.n_layers == old["n_layers"]
        assert dantinox.ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
