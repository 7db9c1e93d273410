"""Pure readings for the roofline lab: timed sweeps of this machine, and the roofline set beside them.

    machine = read_machine()                                   # measured, this machine (cached)
    decode = read_decode(cfg, context=128, batches=(1, 16, 64))  # measured step times (cached per setting)
    reading = roofline_reading(entry, cfg, batch=8, context=128, machine=machine, decode=decode)
    reading.decode_points[0].percent_of_roofline
    split = read_step_profile(cfg, batch=8, context=128)          # measured: where one step's time goes (cached)

Timings are cached per (config, context, batches): moving a slider that only changes the derived
curves recomputes arithmetic, never a timing.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from flax import nnx

import content
import dantinox
from dantinox.accounting import roofline
from dantinox.accounting.profile import StepProfile, profile_decode_step

BUILDING = "building the model"  # the stage before the profile's own (dantinox.accounting.profile.STAGES)
CRITICAL_TITLE = "Critical batch size"
FLOOR_TITLE = "Decode step time lower bound"


@dataclasses.dataclass(frozen=True)
class MeasuredPoint:
    """One timed step of the reference model on this machine, beside its roofline."""

    x: int  # batch (decode) or prompt length (prefill)
    seconds: float  # measured: compiled calls, best of n
    roofline_seconds: float  # derived: max(bytes / measured BW, FLOPs / measured peak)
    label: str  # says what was measured and how

    @property
    def percent_of_roofline(self) -> float:
        return 100 * self.roofline_seconds / self.seconds


@dataclasses.dataclass(frozen=True)
class Sweep:
    """Measured step times of one model over batch sizes (decode) or prompt lengths (prefill)."""

    phase: str  # "decode" | "prefill"
    cfg: dantinox.ModelConfig
    fixed: int  # decode: cache slots read (context); prefill: batch
    xs: tuple[int, ...]
    seconds: tuple[float, ...]
    repeats: int


@dataclasses.dataclass(frozen=True)
class DeviceRow:
    """The learner's model and batch on one machine, from the roofline (derived)."""

    machine: roofline.Machine
    cfg: dantinox.ModelConfig  # the model as this device would run it (bf16 weights on a datasheet device)
    cost: roofline.StepCost
    floor_seconds: float
    bound: str
    critical_batch: float  # derived from the content formula F / BW, scaled to the weights' bytes
    max_batch: int  # sequences of `context` tokens that fit next to the weights


@dataclasses.dataclass(frozen=True)
class RooflineReading:
    cfg: dantinox.ModelConfig
    batch: int
    context: int
    machine: roofline.Machine
    decode_cost: roofline.StepCost
    decode_points: tuple[MeasuredPoint, ...]  # empty when no sweep of this model and context exists
    prefill_points: tuple[MeasuredPoint, ...]
    measured_knee: float | None  # batch where the batch-1 time meets the largest batch's per-token line
    crossover_batch: int | None  # smallest batch whose roofline step is compute-bound, this model
    floor_formula_seconds: float  # the content's memory floor for the current setting on this machine
    devices: tuple[DeviceRow, ...]  # this machine first, then the datasheet devices


@functools.lru_cache(maxsize=4)
def read_machine(repeats: int = 5) -> roofline.Machine:
    """This machine's streaming-read bandwidth and f32 matmul peak (measured once per session)."""
    return roofline.measure_machine(repeats)


@functools.lru_cache(maxsize=8)
def read_devices() -> tuple[roofline.Machine, ...]:
    return tuple(roofline.datasheet_machines(content.load_entry("prefill-and-decode").specs))


@functools.lru_cache(maxsize=8)
def _model(cfg: dantinox.ModelConfig) -> dantinox.Transformer:
    return dantinox.Transformer(cfg, rngs=nnx.Rngs(0))  # random weights: the timing does not depend on them


@functools.lru_cache(maxsize=64)
def read_decode(cfg: dantinox.ModelConfig, context: int, batches: tuple[int, ...], repeats: int = 3) -> Sweep:
    """Measured seconds per decode step at each batch, with a cache of `context` slots."""
    model = _model(cfg)
    times = tuple(roofline.decode_step_seconds(model, b, context, repeats=repeats) for b in batches)
    return Sweep("decode", cfg, context, tuple(batches), times, repeats)


@functools.lru_cache(maxsize=64)
def read_prefill(cfg: dantinox.ModelConfig, prompts: tuple[int, ...], batch: int = 1, repeats: int = 3) -> Sweep:
    """Measured seconds of one prefill at each prompt length."""
    model = _model(cfg)
    times = tuple(roofline.prefill_seconds(model, batch, p, repeats=repeats) for p in prompts)
    return Sweep("prefill", cfg, batch, tuple(prompts), times, repeats)


def joined(sweeps: list[Sweep]) -> Sweep:
    """One sweep of several timed one point at a time (same phase, model, fixed size and repeats)."""
    first = sweeps[0]
    if any((s.phase, s.cfg, s.fixed, s.repeats) != (first.phase, first.cfg, first.fixed, first.repeats)
           for s in sweeps):
        raise ValueError("sweeps: expected the same phase, model, fixed size and repeats in each")
    return Sweep(first.phase, first.cfg, first.fixed, tuple(x for s in sweeps for x in s.xs),
                 tuple(t for s in sweeps for t in s.seconds), first.repeats)


_PROFILES: dict[tuple[dantinox.ModelConfig, int, int], StepProfile] = {}  # the latest 16 settings profiled


def read_step_profile(cfg: dantinox.ModelConfig, batch: int, context: int,
                      before: Callable[[str], object] | None = None) -> StepProfile:
    """One decode step's time by category (weight matmuls, attention, cache write, the rest), XLA's profiler;
    cached per setting. `before(stage)` is called before building the model and before each of the profile's
    stages (dantinox.accounting.profile.STAGES): it may raise to stop there, and nothing is cached then."""
    key = (cfg, batch, context)
    if key not in _PROFILES:
        if before is not None:
            before(BUILDING)
        model = _model(cfg)
        profile = profile_decode_step(model, batch, context, before=before)
        while len(_PROFILES) >= 16:
            _PROFILES.pop(next(iter(_PROFILES)))
        _PROFILES[key] = profile
    return _PROFILES[key]


@dataclasses.dataclass(frozen=True)
class PublishedRow:
    """One stored benchmark measurement of a published model: a weight mode at one batch."""

    mode: str  # how the weights are stored and computed
    cfg: dantinox.ModelConfig
    batch: int
    tok_s: float  # measured: end-to-end generate(), benchmarks/decode.py
    roofline_tok_s: float  # derived: the same call at the run's measured bandwidth and peak
    bound: str  # derived: what bounds its decode steps ("memory" | "compute")

    @property
    def weight_bytes(self) -> int:
        return roofline.decode_cost(self.cfg, 1, 1).weight_bytes


@dataclasses.dataclass(frozen=True)
class PublishedDecode:
    model: str
    date: str  # when benchmarks/decode.py measured it
    machine: roofline.Machine  # that run's best streaming read and matmul peak
    load: tuple[float, ...]  # 1-minute load averages during that run
    rows: tuple[PublishedRow, ...]


@functools.lru_cache(maxsize=2)
def read_published_decode(name: str = "smollm2-135m") -> PublishedDecode:
    """The stored `benchmarks/decode.py --model NAME` run (measured on the project's machine, dated)."""
    import json

    from dantinox_labs import shipped

    path = shipped.data(f"decode-{name}.json")
    r = json.loads(path.read_text())
    m = r["machine"]
    machine = roofline.Machine(name="the benchmark's machine", bandwidth=m["bandwidth_B_s"],
                               peak_flops=m["matmul_flop_s"], compute_dtype="float32", kind="measured",
                               source=f"benchmarks/decode.py, {r['date']}", memory_bytes=0)
    base = dantinox.ModelConfig.preset(name, kv_heads=3)  # SmolLM2's published K
    rows = []
    for key, tok_s in r["decode_tok_s"].items():
        mode, batch = key.rsplit("/", 1)
        dtype, param_dtype = r["modes"][mode]
        cfg, b = base.replace(dtype=dtype, param_dtype=param_dtype), int(batch)
        rows.append(PublishedRow(mode, cfg, b, tok_s, b * r["new"] / r["roofline_s"][key],
                                 roofline.decode_cost(cfg, b, r["prompt"] + r["new"]).bound(machine)))
    return PublishedDecode(name, r["date"], machine, tuple(m["load_avg_1min"]), tuple(rows))


def points(sweep: Sweep, machine: roofline.Machine) -> tuple[MeasuredPoint, ...]:
    """The sweep's timings beside the roofline of each step on `machine`."""
    out = []
    for x, seconds in zip(sweep.xs, sweep.seconds, strict=True):
        if sweep.phase == "decode":
            cost = roofline.decode_cost(sweep.cfg, x, sweep.fixed)
            label = f"measured, this machine: decode step, B={x}, {sweep.fixed} cache slots, best of {sweep.repeats}"
        else:
            cost = roofline.prefill_cost(sweep.cfg, sweep.fixed, x)
            label = f"measured, this machine: prefill, B={sweep.fixed}, {x} prompt tokens, best of {sweep.repeats}"
        out.append(MeasuredPoint(x, seconds, cost.time(machine), label))
    return tuple(out)


def measured_knee(decode_points: tuple[MeasuredPoint, ...]) -> float | None:
    """t(1) · B_max / t(B_max): where the flat batch-1 time meets the line through the largest batch's time."""
    if len(decode_points) < 2 or decode_points[0].x != 1:
        return None
    last = decode_points[-1]
    return decode_points[0].seconds * last.x / last.seconds


def critical_batch(entry: Any, machine: roofline.Machine, bytes_per_weight: int) -> float:
    """The content's F / BW (stated for 2-byte weights), scaled by bytes per weight / 2."""
    ratio = content.evaluate(entry, CRITICAL_TITLE, F=machine.peak_flops, BW=machine.bandwidth)
    return ratio * bytes_per_weight / 2


def device_row(entry: Any, cfg: dantinox.ModelConfig, machine: roofline.Machine, batch: int,
               context: int) -> DeviceRow:
    """The model on `machine`: datasheet peaks are for bf16, so there the weights are taken in bf16."""
    if machine.kind == "derived":
        cfg = cfg.replace(dtype=machine.compute_dtype)
    cost = roofline.decode_cost(cfg, batch, context)
    weights = cost.weight_bytes
    return DeviceRow(machine=machine, cfg=cfg, cost=cost, floor_seconds=cost.time(machine),
                     bound=cost.bound(machine),
                     critical_batch=critical_batch(entry, machine, jnp.dtype(cfg.param_jnp_dtype).itemsize),
                     max_batch=dantinox.max_batch_size(cfg, machine.memory_bytes, context, weight_bytes=weights))


def roofline_reading(entry: Any, cfg: dantinox.ModelConfig, batch: int, context: int, machine: roofline.Machine,
                     decode: Sweep | None = None, prefill: Sweep | None = None,
                     devices: tuple[roofline.Machine, ...] = ()) -> RooflineReading:
    """Everything the lab shows for one setting; measured points only from sweeps of this very model."""
    cost = roofline.decode_cost(cfg, batch, context)
    decode_pts = points(decode, machine) if decode is not None and (decode.cfg, decode.fixed) == (cfg, context) \
        else ()
    prefill_pts = points(prefill, machine) if prefill is not None and prefill.cfg == cfg else ()
    floor = content.evaluate(entry, FLOOR_TITLE, B=batch, T=context, W=cost.weight_bytes, n=1,
                             BW=machine.bandwidth, m=cost.cache_read_bytes / (batch * context))
    rows = tuple(device_row(entry, cfg, m, batch, context) for m in (machine, *devices))
    return RooflineReading(cfg=cfg, batch=batch, context=context, machine=machine, decode_cost=cost,
                           decode_points=decode_pts, prefill_points=prefill_pts,
                           measured_knee=measured_knee(decode_pts),
                           crossover_batch=roofline.crossover_batch(cfg, context, machine),
                           floor_formula_seconds=floor, devices=rows)
