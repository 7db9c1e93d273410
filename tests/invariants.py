"""Invariants shared by the tests of every attention variant."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np

import dantinox


def token_ids(batch, length, seed=0):
    return np.random.RandomState(seed).randint(0, 256, (batch, length)).astype(np.int32)


def assert_cached_steps_match_full_forward(cfg, model, x, prefill=5, atol=2e-5):
    """Prefill `prefill` tokens, then decode the rest one by one: the logits equal one full forward."""
    full, _, _ = model(x)
    logits, cache, aux = model(x[:, :prefill], use_cache=True, kv_caches=dantinox.init_cache(cfg, x.shape[0]))
    steps = [logits]
    for t in range(prefill, x.shape[1]):
        assert aux["cache_index"] == t
        assert dantinox.filled_slots(cache).tolist() == [t] * x.shape[0]
        logits, cache, aux = model(x[:, t:t + 1], use_cache=True, kv_caches=cache, cache_index=t)
        steps.append(logits)
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=atol, rtol=atol)


COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@contextlib.contextmanager
def count_compiles():
    """Collect the name of every program XLA compiles inside the block (jax.monitoring compile events)."""
    names = []

    def listener(event, duration, **kwargs):
        if event == COMPILE_EVENT:
            names.append(kwargs.get("fun_name", "?"))

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield names
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
