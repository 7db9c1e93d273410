"""dantinox/ops.py: the hook points through which a backend computes an operation its own way."""

import jax.numpy as jnp
import numpy as np

from dantinox import ops


def test_the_installed_backend_answers_first_and_none_leaves_the_plain_function():
    """A marked function's arguments reach the backend's method by name, defaults filled in; its answer is the
    result, and None from it runs the plain function (the reference path)."""
    seen = []

    @ops.takes_over("double")
    def double(x, times=2):
        return x * times

    class Backend(ops.Reference):
        def double(self, x, times):
            seen.append((x, times))
            return None if x < 0 else "taken"

    before = ops.current()
    ops.install(Backend())
    try:
        assert double(3) == "taken" and double(-3, times=4) == -12
    finally:
        ops.install(before)
    assert seen == [(3, 2), (-3, 4)] and double(3) == 6  # back to the backend before, which has no "double"


def test_the_reference_declines_every_operation():
    reference = ops.Reference()
    assert reference.name == "reference" and reference.attend(q=1) is None and reference.anything() is None
    before = ops.current()
    ops.install(reference)
    try:
        table = jnp.asarray(np.arange(12.0).reshape(4, 3), jnp.bfloat16)
        got = ops.take_rows(table, jnp.asarray([3, 0, -1, 4]))
        assert got.dtype == jnp.bfloat16  # jnp.take's own: nothing widened, NaN outside the table
        np.testing.assert_array_equal(np.asarray(got[:3], np.float32), [[9, 10, 11], [0, 1, 2], [9, 10, 11]])
        assert np.isnan(np.asarray(got[3], np.float32)).all()
    finally:
        ops.install(before)
