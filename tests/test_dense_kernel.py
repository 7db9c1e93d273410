"""dantinox/backend/dense_kernel.py: a few rows times bfloat16 weights, against float64, and inside the model."""

import importlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import dantinox
from dantinox.accounting.roofline import timing_state
from dantinox.backend import dense_kernel
from dantinox.generation.generate import decode_program


@pytest.fixture(autouse=True)
def built(request):
    """Every test here needs the kernel, except those that turn it off themselves (marked `unbuilt`)."""
    if "unbuilt" not in request.keywords:
        request.getfixturevalue("dense_kernel_built")


def operands(M, D, N, transposed=False, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((M, D)).astype(np.float32)
    w = jnp.asarray(rng.standard_normal((N, D) if transposed else (D, N)) * 0.1, jnp.bfloat16)
    return x, w


def exact(x, w, transposed=False):
    """The product in float64 of the float32 rows and the bfloat16 weights (widened exactly)."""
    w64 = np.asarray(w.astype(jnp.float32), np.float64)
    return np.asarray(x, np.float64) @ (w64.T if transposed else w64)


# D = 37 leaves rows of W over after the groups of four; N = 1,100 is not a whole number of 16- or 32-wide
# groups, and at M = 8 it is four chunks of 256 columns and a part one; D = 202 is cut into one block of rows
# per thread, each with a row over; N = 4,100 at M = 1 a chunk of 4,096 columns and 4 over
@pytest.mark.parametrize("M", [1, 3, 8, 19])  # 19: tiles of 8, 8 and 3 rows
@pytest.mark.parametrize("D,N", [(37, 1100), (64, 48), (202, 4100)])
def test_layer_products_match_float64(M, D, N):
    x, w = operands(M, D, N)
    out = jax.jit(dense_kernel.matmul)(x, w)
    assert out.dtype == jnp.float32 and out.shape == (M, N)
    np.testing.assert_allclose(out, exact(x, w), rtol=2e-5, atol=2e-5)


# D = 40 leaves part of a group of each row of the tied head; D = 600 is 8 groups at a time (M = 1), then
# single groups, then part of one; N = 300 rows of W are tiles of 64 and a part one
@pytest.mark.parametrize("M", [1, 2, 5, 8, 19])
@pytest.mark.parametrize("D,N", [(40, 300), (64, 67), (600, 130)])
def test_head_products_match_float64(M, D, N):
    x, w = operands(M, D, N, transposed=True)
    out = jax.jit(lambda x, w: dense_kernel.matmul(x, w, transposed=True))(x, w)
    assert out.shape == (M, N)
    np.testing.assert_allclose(out, exact(x, w, transposed=True), rtol=2e-5, atol=2e-5)


def test_bfloat16_rows_are_widened_and_leading_axes_kept():
    x, w = operands(6, 32, 40)
    x16 = jnp.asarray(x, jnp.bfloat16).reshape(2, 3, 32)
    out = dense_kernel.matmul(x16, w)
    assert out.shape == (2, 3, 40)
    np.testing.assert_allclose(out.reshape(6, 40), exact(x16.astype(jnp.float32).reshape(6, 32), w),
                               rtol=2e-5, atol=2e-5)


def test_what_it_takes_and_a_bad_call_in_one_line():
    x, w = operands(8, 16, 24)
    rows = dense_kernel.MAX_ROWS
    assert dense_kernel.takes(x, w) and dense_kernel.takes(x[:1], w)
    assert dense_kernel.takes(np.zeros((rows, 16), np.float32), w)  # a short prompt
    assert not dense_kernel.takes(np.zeros((rows + 1, 16), np.float32), w)  # a longer one: XLA's dot
    assert not dense_kernel.takes(x, w.astype(jnp.float32))  # float32 weights: XLA's dot
    with pytest.raises(ValueError, match=rf"expected x \[\.\.\., 16\] of at most {rows} rows") as e:
        dense_kernel.matmul(np.zeros((rows + 1, 16), np.float32), w)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"got x \(8, 15\) float32"):
        dense_kernel.matmul(x[:, :15], w)


def test_gradients_go_through_xla():
    x, w = operands(4, 24, 40)

    def loss(x, w, product):
        return jnp.sum(jnp.sin(product(x, w)))

    xla = lambda x, w: x @ w.astype(jnp.float32)  # noqa: E731
    for argnum in (0, 1):
        got = jax.grad(loss, argnum)(x, w, dense_kernel.matmul)
        want = jax.grad(loss, argnum)(x, w, xla)
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=1e-2, atol=1e-3)


def test_vmap_maps_calls():
    x, w = operands(8, 16, 24)
    out = jax.vmap(lambda r: dense_kernel.matmul(r, w))(x.reshape(4, 2, 16))
    np.testing.assert_allclose(out.reshape(8, 24), exact(x, w), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("target,x,w,out,got", [
    ("dantinox_dense_bf16", (3, 16), (15, 24), (3, 24), "x [3, 16], W [15, 24], y [3, 24]"),
    ("dantinox_dense_bf16", (3, 16), (16, 24), (3, 25), "x [3, 16], W [16, 24], y [3, 25]"),
    ("dantinox_dense_bf16_t", (3, 16), (24, 16), (2, 24), "x [3, 16], W [24, 16], y [2, 24]"),
    ("dantinox_dense_bf16_t", (2, 3, 16), (24, 16), (3, 24), "x [2, 3, 16], W [24, 16], y [3, 24]"),
])
def test_a_product_of_wrong_shapes_is_a_one_line_error(ffi_error, target, x, w, out, got):
    """The handlers check x, W and the result against each other before reading any of them."""
    line = ffi_error(target, jax.ShapeDtypeStruct(out, jnp.float32), np.zeros(x, np.float32),
                     jnp.zeros(w, jnp.bfloat16))
    assert line.startswith("INVALID_ARGUMENT: dantinox dense: expected x [M >= 1, D], ")
    assert line.endswith(f"; got {got}")


def test_a_lookup_of_wrong_shapes_is_a_one_line_error(ffi_error):
    line = ffi_error("dantinox_rows_bf16", jax.ShapeDtypeStruct((3, 8), jnp.float32), np.zeros((4,), np.int32),
                     jnp.zeros((10, 8), jnp.bfloat16))
    assert line == ("INVALID_ARGUMENT: dantinox rows: expected ids [n] (any shape of n), table [V, D], out [n, D]; "
                    "got ids [4], table [10, 8], out [3, 8]")


@pytest.mark.unbuilt
def test_without_a_compiler_or_when_turned_off_it_says_why_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("DANTINOX_KERNEL_CACHE", str(tmp_path))  # no built library here
    monkeypatch.setattr(dense_kernel.KERNEL, "state", {})
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    x, w = operands(1, 16, 16)
    assert not dense_kernel.available() and not dense_kernel.takes(x, w)
    why = dense_kernel.why_not()
    assert "no C++ compiler found" in why and "weight products go through XLA" in why and "\n" not in why
    monkeypatch.setattr(dense_kernel.KERNEL, "state", {})
    monkeypatch.setenv(dense_kernel.ENV, "0")
    assert not dense_kernel.available() and "DANTINOX_DENSE_KERNEL=0" in dense_kernel.why_not()


def test_rows_are_jnp_takes_values_widened():
    """The embedding lookup: jnp.take's rows bit for bit, ids from the end included, NaN rows outside the table."""
    rng = np.random.default_rng(3)
    table = jnp.asarray(rng.standard_normal((50, 37)), jnp.bfloat16)
    ids = jnp.asarray([[0, 49, -1, -50], [50, -51, 7, 7]], jnp.int32)
    got = dense_kernel.rows(table, ids)
    assert got.shape == (2, 4, 37) and got.dtype == jnp.float32
    want = jnp.take(table, ids, axis=0).astype(jnp.float32)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert np.isnan(np.asarray(got)[1, :2]).all() and not np.isnan(np.asarray(got)[0]).any()
    jitted = jax.jit(dense_kernel.rows)(table, ids)
    np.testing.assert_array_equal(np.asarray(jitted), np.asarray(want))


def test_rows_gradient_and_a_bad_call_in_one_line():
    table = jnp.asarray(np.random.default_rng(4).standard_normal((20, 8)), jnp.bfloat16)
    ids = jnp.asarray([3, 3, 19], jnp.int32)

    def loss(t, lookup):
        return jnp.sum(jnp.sin(lookup(t, ids)))

    got = jax.grad(loss)(table, dense_kernel.rows)
    want = jax.grad(loss)(table, lambda t, i: jnp.take(t, i, axis=0).astype(jnp.float32))
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    with pytest.raises(ValueError, match=r"expected a bfloat16 table \[V, D\].*got table \(20, 8\) float32") as e:
        dense_kernel.rows(table.astype(jnp.float32), ids)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_decode_loop_never_widens_the_whole_table(dtype):
    """XLA:CPU gathers bfloat16 by widening the whole table first and lifted that out of the decode loop: every
    call of the loop wrote a float32 table before its first step. The compiled loop holds no array of the
    table's shape but the parameter itself."""
    cfg = dantinox.ModelConfig.preset("test", kv_heads=2, param_dtype="bfloat16", dtype=dtype)
    model = dantinox.Transformer(cfg, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)
    state = timing_state(cfg, 1, 16, 8)
    program = decode_program(1, donate=False, cfg=cfg, slots=16)
    text = program.lower(graphdef, params, state, None, 16, top_k=None, use_cache=True, bucket=16).compile().as_text()
    entry = text[text.index("\nENTRY") + 1:]
    made = re.compile(rf"= [a-z0-9]+\[{cfg.vocab_size},{cfg.d_model}\]")  # an instruction whose result is a table
    assert [line for line in entry.splitlines() if made.search(line) and "parameter(" not in line] == []
    assert "dantinox_rows_bf16" in text


def _bf16_model():
    cfg = dantinox.ModelConfig.preset("test", kv_heads=2, param_dtype="bfloat16")
    return cfg, dantinox.Transformer(cfg, rngs=nnx.Rngs(0))


def test_a_bfloat16_model_decodes_through_it_as_through_xla(monkeypatch, fresh_forward):
    """Weights stored in bf16 with float32 compute: the prompt's and the decode step's logits through the kernel
    equal those of XLA widening each weight first, and a prompt of more than MAX_ROWS rows keeps XLA's dots."""
    cfg, model = _bf16_model()
    forward = importlib.import_module("dantinox.architectures.model")._compiled_forward
    prompt = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 6)))
    runs = []
    for kernel in (True, False):
        with monkeypatch.context() as m:
            if not kernel:
                m.setattr(dense_kernel, "takes", lambda x, w: False)
            forward.clear_cache()
            prompt_logits, cache, _ = model(prompt, use_cache=True)  # 12 rows
            step = jnp.asarray([[5], [7]])
            graphdef, state = nnx.split(model)
            text = forward.lower(graphdef, state, step, cache).as_text()
            # the four products of each layer and the tied head, at 2 rows
            assert text.count("dantinox_dense_bf16") == (4 * cfg.n_layers + 1 if kernel else 0)
            logits, _, _ = model(step, use_cache=True, kv_caches=cache)
            runs.append((np.asarray(prompt_logits), np.asarray(logits)))
    for through_kernel, through_xla in zip(*runs, strict=True):
        np.testing.assert_allclose(through_kernel, through_xla, rtol=1e-5, atol=1e-5)
    assert "dantinox_dense_bf16" in forward.lower(*nnx.split(model), prompt, None).as_text()
    monkeypatch.setattr(dense_kernel, "MAX_ROWS", 11)
    forward.clear_cache()
    assert "dantinox_dense_bf16" not in forward.lower(*nnx.split(model), prompt, None).as_text()


def test_float32_weights_keep_xla(fresh_forward):
    cfg = dantinox.ModelConfig.preset("test")
    model = dantinox.Transformer(cfg, rngs=nnx.Rngs(0))
    text = importlib.import_module("dantinox.architectures.model")._compiled_forward.lower(
        *nnx.split(model), jnp.asarray([[3]]), None).as_text()
    assert "dantinox_dense_bf16" not in text
