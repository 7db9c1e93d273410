"""dantinox/backend/pool_kernel.py: one token per sequence over a shared pool, against a float64 reference."""

import importlib
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dantinox.backend import pool_kernel


def reference(q, k, v, mask, scale, ks=None, vs=None):
    """Softmax attention in float64, each sequence over the slots its mask marks; zeros where it marks none.
    Keys [R, K, H, S] and values [R, K, S, H]: one pool (R = 1) or a row per sequence."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    if ks is not None:
        k, v = k * np.asarray(ks)[:, :, None, :], v * np.asarray(vs)[..., None]
    out = np.zeros(q.shape)
    for b in range(q.shape[0]):
        seen, r = np.asarray(mask[b]), 0 if k.shape[0] == 1 else b
        if not seen.any():
            continue
        scores = np.einsum("kgh,khs->kgs", q[b], k[r][:, :, seen]) * scale
        w = np.exp(scores - scores.max(-1, keepdims=True))
        out[b] = np.einsum("kgs,ksh->kgh", w / w.sum(-1, keepdims=True), v[r][:, seen])
    return out


def problem(B=4, K=2, G=3, H=8, S=37, R=1, seed=0):
    rng = np.random.default_rng(seed)
    mask = rng.random((B, S)) < 0.4
    mask[1] = False  # a sequence that sees nothing
    mask[2] = False
    mask[2, S - 1] = True  # one slot, in the last, partial block of 16
    mask[3, :16] = False  # a whole block skipped
    return (rng.standard_normal((B, K, G, H)).astype(np.float32),
            rng.standard_normal((R, K, H, S)).astype(np.float32),
            rng.standard_normal((R, K, S, H)).astype(np.float32), mask, H ** -0.5)


@pytest.fixture(autouse=True)
def built(request):
    """Every test here needs the kernel, except those that turn it off themselves (marked `unbuilt`)."""
    if "unbuilt" not in request.keywords:
        request.getfixturevalue("pool_kernel_built")


@pytest.mark.parametrize("H", [8, 6], ids=["channels-by-four", "channels-left-over"])
@pytest.mark.parametrize("rows", [1, 4], ids=["shared-pool", "row-per-sequence"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_float_caches_match_the_reference(dtype, rows, H):
    """Key rows are read four channels at a time and value rows four slots at a time: a head size that is not
    a multiple of four, and masks that leave gaps inside runs of four slots, take the other paths."""
    q, k, v, mask, scale = problem(R=rows, H=H)
    k, v = jnp.asarray(k, dtype), jnp.asarray(v, dtype)
    out = jax.jit(lambda *a: pool_kernel.attend(*a, scale))(q, k, v, mask)
    np.testing.assert_allclose(out, reference(q, k.astype(np.float32), v.astype(np.float32), mask, scale),
                               rtol=1e-5, atol=1e-6)
    assert not np.asarray(out[1]).any()  # no visible slot: zeros, not NaN


@pytest.mark.parametrize("G", [1, 2, 4, 5, 8])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_every_grouping_of_query_heads_matches_the_reference(G, dtype):
    """Query heads go through in groups of up to four, slots and channels in register blocks sized for the
    group and then in smaller ones: 5 and 8 heads take two groups, 150 slots and a head size of 40 leave
    blocks of every size over, and the gaps of the mask fall inside them."""
    q, k, v, mask, scale = problem(B=4, K=2, G=G, H=40, S=150, R=4, seed=G)
    ks = vs = None
    if dtype == "int8":
        rng = np.random.default_rng(G)
        k, v = (rng.integers(-127, 128, a.shape).astype(np.int8) for a in (k, v))
        ks, vs = (rng.random((4, 2, 150)).astype(np.float32) / 64 for _ in range(2))
    else:
        k, v = jnp.asarray(k, dtype), jnp.asarray(v, dtype)
    out = pool_kernel.attend(q, k, v, mask, scale, ks, vs)
    np.testing.assert_allclose(out, reference(q, np.asarray(k, np.float32), np.asarray(v, np.float32), mask, scale,
                                              ks, vs), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("B,K", [(1, 3), (2, 1)])
def test_few_pairs_split_their_slots_and_combine_the_parts(dtype, B, K):
    """Fewer (sequence, KV head) pairs than twice the threads (SmolLM2 at batch 1: three KV heads) cut each
    pair's slots into parts whose softmaxes are combined at the end. Long caches (1,100 and 3,000 slots, not a
    multiple of the 16-slot blocks); a part that sees nothing, a part with one slot, and one part's scores far
    above the others' (their weights must be rescaled, not added as they are), against the float64 reference."""
    for S in (1100, 3000):
        rng = np.random.default_rng(S + K)
        q, k, v = (rng.standard_normal(shape).astype(np.float32)
                   for shape in ((B, K, 3, 40), (B, K, 40, S), (B, K, S, 40)))
        scale, mask = 40 ** -0.5, rng.random((B, S)) < 0.5
        mask[0, : S // 2] = False  # the first half hidden: whole parts see nothing
        mask[0, S // 2 + 1: S // 2 + 700] = False  # one slot alone in its part
        k[0, :, :, S - 1] *= 8.0  # one late key whose scores dwarf the rest
        if B > 1:
            mask[1] = False  # a sequence that sees nothing at all: zeros
        if dtype == "int8":
            rng = np.random.default_rng(S)
            k, v = (rng.integers(-127, 128, a.shape).astype(np.int8) for a in (k, v))
            ks, vs = (rng.random((B, K, S)).astype(np.float32) / 16 for _ in range(2))
            ks[0, :, S - 1] *= 8.0
            out = pool_kernel.attend(q, k, v, mask, scale, ks, vs)
            want = reference(q, k, v, mask, scale, ks, vs)
        else:
            k, v = jnp.asarray(k, dtype), jnp.asarray(v, dtype)
            out = pool_kernel.attend(q, k, v, mask, scale)
            want = reference(q, np.asarray(k, np.float32), np.asarray(v, np.float32), mask, scale)
        # float32 sums over thousands of slots: 1e-4 (the int8 codes' larger values round at about 2e-5)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5, err_msg=f"{S} slots")
        if B > 1:
            assert not np.asarray(out[1]).any()


@pytest.mark.parametrize("rows", [1, 4], ids=["shared-pool", "row-per-sequence"])
def test_int8_codes_fold_their_scales(rows):
    q, _, _, mask, scale = problem(S=70, seed=1)
    rng = np.random.default_rng(2)
    k, v = (rng.integers(-127, 128, shape).astype(np.int8) for shape in ((rows, 2, 8, 70), (rows, 2, 70, 8)))
    ks, vs = (rng.random((rows, 2, 70)).astype(np.float32) / 64 for _ in range(2))
    out = jax.jit(lambda *a: pool_kernel.attend(*a[:4], scale, *a[4:]))(q, k, v, mask, ks, vs)
    np.testing.assert_allclose(out, reference(q, k, v, mask, scale, ks, vs), rtol=1e-5, atol=1e-6)


def test_only_the_masked_slots_count():
    """Changing a slot no sequence sees changes nothing; changing a seen one does."""
    q, k, v, mask, scale = problem()
    hidden = np.flatnonzero(~mask.any(0))[0]
    other = v.copy()
    other[:, :, hidden] = 1e6
    same = pool_kernel.attend(q, k, other, mask, scale)
    np.testing.assert_array_equal(same, pool_kernel.attend(q, k, v, mask, scale))
    other[:, :, np.flatnonzero(mask[0])[0]] += 1.0
    assert not np.allclose(pool_kernel.attend(q, k, other, mask, scale)[0], same[0])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
@pytest.mark.parametrize("B,K,S", [(4, 2, 150), (1, 3, 1100)], ids=["pairs", "parts"])
def test_hidden_slots_holding_nan_or_inf_change_nothing(dtype, B, K, S):
    """A hidden slot's key and value (or an int8 slot's scales) may hold anything, NaN and infinities included: a
    pool's free pages are never cleared. Its weight is exactly 0, so the output is bit for bit the one with finite
    numbers there, and the float64 reference's. 150 slots end inside a vector; 1,100 at batch 1 are cut into
    parts."""
    rng = np.random.default_rng(S)
    q = rng.standard_normal((B, K, 3, 40)).astype(np.float32)
    k, v = rng.standard_normal((B, K, 40, S)), rng.standard_normal((B, K, S, 40))
    mask = rng.random((B, S)) < 0.5
    mask[:, S - 1] = False  # a hidden slot past the last whole vector
    ks = vs = None
    if dtype == "int8":
        k, v = (rng.integers(-127, 128, a.shape) for a in (k, v))
        ks, vs = (rng.random((B, K, S)).astype(np.float32) / 64 for _ in range(2))
    k, v = (np.asarray(jnp.asarray(a, dtype)) for a in (k, v))
    clean = pool_kernel.attend(q, k, v, mask, 40 ** -0.5, ks, vs)
    poison = np.resize(np.array([np.nan, np.inf, -np.inf], np.float32), (B, 1, S))  # [B, K = 1, S]
    hidden = ~mask[:, None]
    if dtype == "int8":
        ks, vs = (np.where(hidden, poison, a) for a in (ks, vs))
    else:
        k = np.where(hidden[:, :, None], poison[:, :, None], k).astype(dtype)
        v = np.where(hidden[..., None], poison[..., None], v).astype(dtype)
    out = pool_kernel.attend(q, k, v, mask, 40 ** -0.5, ks, vs)
    np.testing.assert_array_equal(out, clean)
    assert np.isfinite(np.asarray(out)).all()
    with np.errstate(invalid="ignore"):  # the reference scales every slot first: infinity times a code of 0
        want = reference(q, k.astype(np.float32), v.astype(np.float32), mask, 40 ** -0.5, ks, vs)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


def test_rows_other_than_one_or_the_batch_are_refused():
    q, k, v, mask, scale = problem(R=2)
    with pytest.raises(ValueError, match="k_RKHS: expected 1 or 4 rows"):
        pool_kernel.attend(q, k, v, mask, scale)


def test_which_caches_it_takes():
    assert pool_kernel.handles(jnp.float32, None) and pool_kernel.handles(jnp.bfloat16, None)
    assert pool_kernel.handles(jnp.int8, "per_token") and not pool_kernel.handles(jnp.int8, None)
    assert not pool_kernel.handles(jnp.float8_e4m3fn, "per_token") and not pool_kernel.handles(jnp.float16, None)
    assert not pool_kernel.handles(jnp.int8, "per_channel") and not pool_kernel.handles(jnp.float32, "per_token")


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
def test_an_int8_cache_declaring_another_scale_layout_never_reaches_the_kernel(monkeypatch, fresh_forward, layout):
    """Dispatch reads the storage's declared scale layout, not its dtype alone: the kernel reads int8 scales as
    [R, K, S], one per token, and a cache whose scales are laid out otherwise (per channel, say) would be read
    out of bounds. Declared per channel, the same int8 cache takes XLA's path in every decode step: attention
    never calls the kernel, and a paged pool is not read in place."""
    from flax import nnx

    import dantinox
    from dantinox.architectures import attention
    from dantinox.backend import cpu
    from dantinox.cache import layout as payloads
    from dantinox.cache import paged

    cfg = dantinox.ModelConfig.preset("test", kv_heads=2, cache_dtype="int8", cache_layout=layout, page_size=4)
    model = dantinox.Transformer(cfg, rngs=nnx.Rngs(0))
    state = dantinox.init_cache(cfg, 2, 16)
    assert state.layers[0].scale_layout == "per_token" and cpu.uses_kernel(2, 1, cfg.groups, 2, jnp.int8, "per_token")

    def lowered_step():
        return importlib.import_module("dantinox.architectures.model")._compiled_forward.lower(
            *nnx.split(model), jnp.asarray([[3], [4]]), state).as_text()

    assert lowered_step().count("dantinox_pool_attend_int8") == cfg.n_layers
    monkeypatch.setattr(payloads.Payload, "SCALE_LAYOUT", "per_channel")
    monkeypatch.setattr(pool_kernel, "attend", lambda *a, **kw: pytest.fail("the kernel was called"))
    importlib.import_module("dantinox.architectures.model")._compiled_forward.clear_cache()
    assert state.layers[0].scale_layout == "per_channel" and not pool_kernel.handles(jnp.int8, "per_channel")
    assert "dantinox_pool_attend" not in lowered_step()
    assert not paged.reads_in_place(1, payloads.LayerCache, jnp.int8, "per_channel")
    q, k, v, mask, scale = problem(R=4)
    codes, vcodes = jnp.asarray(k * 20, jnp.int8), jnp.asarray(v * 20, jnp.int8)
    scales = jnp.full((4, 2, k.shape[-1]), 0.05, jnp.float32)
    out = attention.attend(q[:, None], codes, vcodes, mask[:, None], scale, scales, scales, scale_layout="per_channel")
    seen = mask.any(-1)  # XLA's softmax over no visible slot is not the kernel's zeros
    np.testing.assert_allclose(out[seen, 0], reference(q, codes, vcodes, mask, scale, scales, scales)[seen],
                               rtol=1e-5, atol=1e-5)


def _attend_operands(int8=False):
    q, k, v, mask, scale = problem()  # q [4, 2, 3, 8], keys [1, 2, 8, 37], values [1, 2, 37, 8], mask [4, 37]
    if int8:
        k, v = np.asarray(k * 20, np.int8), np.asarray(v * 20, np.int8)
        return dict(q=q, k=k, v=v, ks=np.ones((1, 2, 37), np.float32), vs=np.ones((1, 2, 37), np.float32), mask=mask)
    return dict(q=q, k=k, v=v, mask=mask)


@pytest.mark.parametrize("target,wrong,got", [
    ("dantinox_pool_attend_float", dict(k=lambda a: a[..., :-1]), "keys [1, 2, 8, 36]"),
    ("dantinox_pool_attend_float", dict(q=lambda a: a[:, :, :, :6]), "q [4, 2, 3, 6]"),
    ("dantinox_pool_attend_bf16", dict(v=lambda a: a[:, :, :, :4]), "values [1, 2, 37, 4]"),
    ("dantinox_pool_attend_bf16", dict(mask=lambda a: a[:3]), "mask [3, 37]"),
    ("dantinox_pool_attend_float", dict(k=lambda a: np.concatenate([a, a]), v=lambda a: np.concatenate([a, a])),
     "keys [2, 2, 8, 37]"),  # R neither 1 nor B
    ("dantinox_pool_attend_int8", dict(ks=lambda a: np.ones((1, 2, 8), np.float32)), "key scales [1, 2, 8]"),
    ("dantinox_pool_attend_float", dict(out=(4, 2, 3, 9)), "out [4, 2, 3, 9]"),
])
def test_every_attention_operand_is_checked_with_a_one_line_error(ffi_error, target, wrong, got):
    """The attention handlers check every operand, the result included, against q's [B, K, G, H] and the keys'
    rows and slots before reading any: a wrong shape (here: a key row short, per-channel int8 scales) is one line
    naming the shapes expected and given, never a read out of bounds."""
    ops = _attend_operands(int8="int8" in target)
    if "bf16" in target:
        ops["k"], ops["v"] = jnp.asarray(ops["k"], jnp.bfloat16), jnp.asarray(ops["v"], jnp.bfloat16)
    out = wrong.pop("out", ops["q"].shape)
    for name, change in wrong.items():
        ops[name] = change(ops[name])
    args = [ops[n] for n in ("q", "k", "v", "ks", "vs", "mask") if n in ops]
    line = ffi_error(target, jax.ShapeDtypeStruct(out, jnp.float32), *args, scale=np.float32(0.3))
    assert line.startswith("INVALID_ARGUMENT: dantinox pool attend: expected q [B, K, G, H], keys [R, K, H, S]")
    assert got in line.split("; got ")[1]


def test_a_store_into_a_wrong_shape_is_a_one_line_error(ffi_error):
    a = jnp.zeros((3, 2, 10, 4), jnp.bfloat16)
    rows, slots = jnp.zeros((2,), jnp.int32), jnp.zeros((2,), jnp.int32)
    line = ffi_error("dantinox_cache_store", jax.ShapeDtypeStruct(a.shape, a.dtype), a,
                     jnp.zeros((2, 2, 5), jnp.bfloat16), rows, slots, axis=np.int64(2))  # tokens a channel too wide
    assert line.startswith("INVALID_ARGUMENT: dantinox store: expected cache [R, ..., S at axis, ...]")
    assert line.endswith("; got cache [3, 2, 10, 4], tokens [2, 2, 5], rows [2], slots [2], out [3, 2, 10, 4]")


@pytest.mark.unbuilt
def test_without_a_compiler_or_when_turned_off_it_says_why_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv(pool_kernel.CACHE_ENV, str(tmp_path))  # no built library here
    monkeypatch.setattr(pool_kernel.KERNEL, "state", {})
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    assert not pool_kernel.available() and not pool_kernel.handles(jnp.float32, None)
    why = pool_kernel.why_not()
    assert "no C++ compiler found" in why and "no-such-compiler" in why and "\n" not in why
    monkeypatch.setattr(pool_kernel.KERNEL, "state", {})
    monkeypatch.setenv(pool_kernel.ENV, "0")
    assert not pool_kernel.available() and "DANTINOX_POOL_KERNEL=0" in pool_kernel.why_not()


@pytest.mark.unbuilt
def test_a_failed_build_names_the_compilers_message(monkeypatch, tmp_path):
    broken = tmp_path / "cxx"
    broken.write_text("#!/bin/sh\necho 'pool_attend.cc:1: error: this compiler refuses' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv(pool_kernel.CACHE_ENV, str(tmp_path / "kernels"))
    monkeypatch.setenv("CXX", str(broken))
    with pytest.raises(RuntimeError, match="could not build pool_attend.cc: pool_attend.cc:1: error: this compiler"):
        pool_kernel.build()
    assert not list((tmp_path / "kernels").iterdir())  # nothing half-written is left to load


FAKE_COMPILER = "#!/bin/sh\nwhile [ $# -gt 0 ]; do [ \"$1\" = -o ] && echo built > \"$2\"; shift; done\n"


@pytest.mark.unbuilt
def test_kernels_are_built_where_every_account_reads_them(monkeypatch, tmp_path):
    """The set-up builds into the environment's folder, files 0644 and folders 0755 whatever the umask, so a class
    server's accounts load them; an account that cannot write there loads what is there, and builds only what is
    missing into its own cache folder."""
    from dantinox.backend import native

    cxx = tmp_path / "cxx"
    cxx.write_text(FAKE_COMPILER)
    cxx.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx))
    shared, own = tmp_path / "venv" / "share" / "kernels", tmp_path / "home" / "kernels"
    monkeypatch.setattr(native, "cache_dirs", lambda: [shared, own])
    old = os.umask(0o077)
    try:
        built = native.build("dense.cc")
    finally:
        os.umask(old)
    assert built.parent == shared and built.read_text() == "built\n"
    assert built.stat().st_mode & 0o777 == 0o644
    assert [p.stat().st_mode & 0o777 for p in (shared, shared.parent)] == [0o755, 0o755]
    writable = native._writable
    monkeypatch.setattr(native, "_writable", lambda folder: folder == own and writable(folder))  # a learner's
    cxx.write_text("#!/bin/sh\nexit 1\n")
    assert native.build("dense.cc") == built  # found: loaded as it is, nothing compiled
    cxx.write_text(FAKE_COMPILER)
    assert native.build("pool_attend.cc").parent == own  # not in the shared folder: built in its own


def test_importing_dantinox_builds_and_loads_the_kernels_outside_any_trace():
    """The kernels are loaded when dantinox is imported (built there if the set-up has not), so no trace waits for
    a compiler; JAX's backend is not started by it (asked only when a kernel is first considered)."""
    import subprocess
    import sys

    code = ("import dantinox\nfrom dantinox.backend import dense_kernel, pool_kernel\n"
            "from jax._src import xla_bridge\n"
            "print(pool_kernel.KERNEL.state, dense_kernel.KERNEL.state, bool(xla_bridge._backends))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split("\n")[0] == "{'ok': True, 'why': ''} {'ok': True, 'why': ''} False"


@pytest.mark.parametrize("batch", [1, 3])
def test_an_int8_cache_decodes_through_the_kernel_as_through_xla(monkeypatch, fresh_forward, batch):
    """A contiguous int8 cache (a row per sequence): the kernel's decode logits equal XLA's folded-scale path."""
    import importlib

    from flax import nnx
    from invariants import token_ids

    import dantinox
    from dantinox.backend import cpu

    cfg = dantinox.ModelConfig.preset("test", kv_heads=2, cache_dtype="int8")
    model = dantinox.Transformer(cfg, rngs=nnx.Rngs(0))
    forward = importlib.import_module("dantinox.architectures.model")._compiled_forward
    assert cpu.uses_kernel(batch, 1, cfg.groups, batch, jnp.int8, "per_token")
    runs = []
    for kernel in (True, False):
        with monkeypatch.context() as m:
            if not kernel:
                m.setattr(pool_kernel, "handles", lambda k_dtype, scale_layout: False)
            forward.clear_cache()
            cache, ids, steps = dantinox.init_cache(cfg, batch, 16), token_ids(batch, 5, seed=7), []
            for _ in range(4):  # the prompt, then three one-token steps
                logits, cache, _ = model(ids, use_cache=True, kv_caches=cache)
                steps.append(np.asarray(logits))
                ids = np.asarray(logits[:, -1].argmax(-1))[:, None]
            runs.append(steps)
    for got, want in zip(*runs, strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float8_e4m3fn"])
@pytest.mark.parametrize("axis", [2, 3])  # values [R, K, S, H], keys [R, K, H, S]
def test_store_writes_what_xlas_scatter_writes(dtype, axis, monkeypatch):
    """Tokens into a narrow-float cache in place: the bytes the cache's XLA write leaves (its slice update for one
    token of one row, a batch-1 decode step; its scatter for a ragged batch of three), masked slots (-1) and
    rows past the cache dropped."""
    from dantinox.cache import layout

    def xla_scatter(*args):
        with monkeypatch.context() as m:
            m.setattr(pool_kernel, "stores", lambda dtype: False)
            return layout._scatter(*args)

    rng = np.random.default_rng(5)
    a = jnp.asarray(rng.standard_normal((3, 2, 4, 10) if axis == 3 else (3, 2, 10, 4)), dtype)
    for rows, slots in ((np.array([[1]]), np.array([[7]])),
                        (np.array([[0, 0, 0], [2, 2, 2], [5, 5, 5]]), np.array([[3, 4, -1], [9, 0, 1], [2, 3, 4]]))):
        new = jnp.asarray(rng.standard_normal((*rows.shape, 2, 4)), dtype)
        rows, slots = jnp.asarray(rows, jnp.int32), jnp.asarray(slots, jnp.int32)
        got = jax.jit(pool_kernel.store, static_argnums=1)(a, axis, rows, slots, new)
        want = xla_scatter(a, axis, rows, slots, new)
        assert got.dtype == a.dtype and got.shape == a.shape
        np.testing.assert_array_equal(np.asarray(got.view(jnp.uint8 if a.dtype.itemsize == 1 else jnp.uint16)),
                                      np.asarray(want.view(jnp.uint8 if a.dtype.itemsize == 1 else jnp.uint16)))
    assert pool_kernel.stores(dtype) and not pool_kernel.stores("float32") and not pool_kernel.stores("int8")


def test_a_bfloat16_cache_is_written_in_place_in_the_decode_loop():
    """XLA:CPU updates bfloat16 by widening the whole array and narrowing it back: every decode step rewrote each
    layer's cache (3 MB of SmolLM2's keys at 8,192 slots: 1.26 ms against 1.3 µs in float32). The compiled loop
    writes through `store` and makes no array of a cache layer's shape (no convert, copy or update of it)."""
    from flax import nnx

    import dantinox
    from dantinox.accounting.roofline import timing_state
    from dantinox.generation.generate import decode_program

    cfg = dantinox.ModelConfig.preset("test", kv_heads=2, cache_dtype="bfloat16")
    graphdef, params = nnx.split(dantinox.Transformer(cfg, rngs=nnx.Rngs(0)))
    state = timing_state(cfg, 1, 16, 8)
    text = decode_program(1, donate=True, cfg=cfg, slots=16).lower(
        graphdef, params, state, None, 16, top_k=None, use_cache=True, bucket=16).compile().as_text()
    assert text.count('custom_call_target="dantinox_cache_store"') == 2 * cfg.n_layers
    shapes = {"[" + ",".join(map(str, a.shape)) + "]" for a in jax.tree.leaves(state.caches.layers)}
    made = re.compile(r"= [a-z0-9]+(\[[0-9,]*\])\{[0-9,]*\} (convert|copy|fusion|dynamic-update-slice|scatter)\(")
    assert [line for line in text.splitlines() if (m := made.search(line)) and m.group(1) in shapes] == []
