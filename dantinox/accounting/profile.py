"""Where one decode step's time goes: XLA's own per-op timings, sorted by what each op does.

    p = profile_decode_step(model, batch=8, context=384)
    p.seconds["attention over the cache"]      # measured: that category's ops, per step, all layers
    p.read_bytes["weight matmuls"]             # what the category must read per step (every weight)

generate's compiled decode loop (the one dantinox.accounting.roofline times) runs under
`jax.profiler.trace`; the per-op events come back from the Perfetto trace and each op is sorted through
the model's named scopes (`jax.named_scope` in dantinox/architectures/model.py) found in the compiled HLO's
metadata. XLA drops that metadata from some ops it rewrites; those are sorted by shape (see `categorize`). The
profiler adds a little to every op, so the categories may sum to more than an unprofiled step.

A profile runs in STAGES (compile, a warm-up run, the profiled run, reading the trace); `before`, if given,
is called with each stage's name before it starts, so a caller can say which one runs, or raise to end the
profile there (a stage already started runs to its end: XLA's compile and a compiled call cannot be cut).
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import jax
from flax import nnx

from dantinox.accounting.roofline import check_fits, check_variant, decode_cost, timing_state
from dantinox.architectures.config import ModelConfig
from dantinox.checks import positive_int
from dantinox.generation.generate import decode_program

WEIGHTS, ATTENTION, CACHE_WRITE, OTHER = ("weight matmuls", "attention over the cache", "cache write",
                                          "norms, RoPE, SwiGLU, residual, sampling")
CATEGORIES = (WEIGHTS, ATTENTION, CACHE_WRITE, OTHER)
SCOPES = ("norm", "qkv", "cache_write", "attend", "out_proj", "mlp", "embed", "logits", "sample")
_NOT_WORK = ("while", "conditional", "call", "parameter", "get-tuple-element", "tuple", "constant")
STAGES = ("compiling the decode loop", "a warm-up run", "the profiled run", "reading the profiler's trace")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (\S+) ([\w\-]+)\((.*)$", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class StepProfile:
    """Measured seconds per decode step for each category, and the bytes the roofline says it must read."""

    cfg: ModelConfig
    batch: int
    context: int
    seconds: dict[str, float]  # category -> seconds per step (all layers), measured under the profiler
    read_bytes: dict[str, int]  # WEIGHTS -> every weight, ATTENTION -> the whole cache

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def bandwidth(self, category: str) -> float | None:
        """Bytes the category must read over its measured time (B/s), or None if it reads none."""
        if category not in self.read_bytes or not self.seconds.get(category):
            return None
        return self.read_bytes[category] / self.seconds[category]


def _scope(op_name: str) -> str | None:
    return next((part for part in reversed(op_name.split("/")) if part in SCOPES), None)


def _loop_bodies(hlo_text: str) -> str:
    """The text of the computations that while loops run as their bodies: the per-step work.

    What runs once per call (copying an input the loop may not overwrite, for one) stays outside.
    """
    bodies = set(re.findall(r"body=%([\w.\-]+)", hlo_text))
    blocks = re.split(r"\n(?=\S)", hlo_text)  # a computation starts at a line with no indent
    return "\n".join(b for b in blocks if (m := re.match(r"(?:ENTRY )?%([\w.\-]+) ", b))
                     and m.group(1) in bodies)


def categorize(hlo_text: str, slots: int) -> dict[str, str]:
    """HLO instruction name -> one of CATEGORIES, for the ops a compiled decode loop runs at every step.

    An op goes by its model scope (attend, cache_write; the matmuls of qkv, out_proj, mlp and logits) when
    XLA kept it. Without one, an op whose output or an operand has a dimension of `slots` works on the
    cache; any other dot multiplies weights. Loop control (tuples, parameters) and everything outside the
    loop body are left out.
    """
    shapes = {name: shape for name, shape, _, _ in _INSTRUCTION.findall(hlo_text)}
    instructions = _INSTRUCTION.findall(_loop_bodies(hlo_text))
    on_cache = re.compile(rf"[\[,]{slots}[,\]]")
    out = {}
    for name, shape, kind, rest in instructions:
        if kind in _NOT_WORK:
            continue
        op_name = re.search(r'op_name="([^"]+)"', rest)
        scope = _scope(op_name.group(1)) if op_name else None
        operands = re.findall(r"%([\w.\-]+)", rest.split(")", 1)[0])
        reads_cache = any(on_cache.search(s) for s in (shape, *(shapes.get(o, "") for o in operands)))
        is_dot = (kind == "dot" or 'custom_call_target="dantinox_dense_bf16' in rest
                  or (name.startswith("ynn_fusion") and op_name is not None
                      and op_name.group(1).endswith("dot_general")))
        if scope == "attend" or (scope is None and reads_cache):
            out[name] = ATTENTION
        elif scope == "cache_write":
            out[name] = CACHE_WRITE
        elif is_dot:
            out[name] = WEIGHTS
        else:
            out[name] = OTHER
    return out


def profile_decode_step(model: nnx.Module, batch: int, context: int, steps: int | None = None,
                        before: Callable[[str], object] | None = None) -> StepProfile:
    """Profile `steps` decode steps (default: 20, or `context` if fewer) of `model` over a cache of `context`
    slots; seconds per step by category. `before(stage)` is called before each of STAGES starts."""
    cfg = model.cfg
    check_variant(cfg)
    batch, context = positive_int("batch", batch), check_fits(cfg, "context", context)
    steps = min(20, context) if steps is None else positive_int("steps", steps)
    if steps > context:
        raise ValueError(f"steps: each step writes one of the {context} slots; expected at most {context}, "
                         f"got {steps}")
    stage = before or (lambda _: None)
    compiling, warming, profiling, reading = STAGES
    stage(compiling)
    graphdef, params = nnx.split(model)
    # the last `steps` slots; each reads all of them
    state = timing_state(cfg, batch, context, context - steps)
    loop = decode_program(batch, donate=False, cfg=cfg, slots=context)
    compiled = loop.lower(graphdef, params, state, None, context, top_k=None, use_cache=True,
                          bucket=context).compile()
    category = categorize(compiled.as_text(), context)
    stage(warming)
    jax.block_until_ready(compiled(params, state, None, context))  # warm before the profiled call
    stage(profiling)
    with tempfile.TemporaryDirectory() as out:
        with jax.profiler.trace(out, create_perfetto_trace=True):
            jax.block_until_ready(compiled(params, state, None, context))
        stage(reading)
        trace = json.load(gzip.open(next(Path(out).rglob("*perfetto_trace.json.gz"))))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    micros: collections.Counter = collections.Counter()
    for event in events:
        info = event.get("args", {})
        decode_op = info.get("hlo_op") in category and "jit__decode" in info.get("hlo_module", "")
        if event.get("ph") == "X" and decode_op:
            micros[category[info["hlo_op"]]] += event["dur"]
    cost = decode_cost(cfg, batch, context)
    return StepProfile(cfg, batch, context, {c: micros[c] * 1e-6 / steps for c in CATEGORIES},
                       {WEIGHTS: cost.weight_bytes, ATTENTION: cost.cache_read_bytes})
