"""What an engine printed, beside what the project predicts for the same settings.

    prediction = dantinox.accounting.engine_logs.predict(row)
    prediction.value, prediction.low, prediction.high, prediction.relation

A row is one published log line (benchmarks/data/engine-logs.json): the engine, the model (a catalogue name,
or a config.json's cache fields with its URL), the settings it ran with and the number it printed. The
prediction comes from the engines' rules in peer_allocation.py. vLLM sizes its pool from the memory it
prints rounded to 0.01 GiB, so its numbers are predicted for the printed value and for both ends of its
rounding interval: "equal" when the printed memory gives the engine's number, "within the rounding of the
printed memory" when only a memory inside that interval does. llama.cpp's sizes, and the attention block vLLM
sets beside state layers, follow from the settings alone and must be equal.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dantinox.accounting.peer_allocation import (
    llama_cpp_size_lines,
    vllm_concurrency,
    vllm_hybrid_block,
    vllm_pool,
)
from dantinox.architectures.catalogue import Architecture, load_architecture, parse_config

GIB = 2**30
VLLM_QUANTITIES = ("vllm_tokens", "vllm_blocks", "vllm_concurrency")
# from the config alone: the attention block vLLM sets beside state layers ("Setting attention block size to")
VLLM_CONFIG_QUANTITIES = ("vllm_block_tokens",)
LLAMA_QUANTITIES = ("llama_kv_mib", "llama_swa_mib", "llama_recurrent_mib")
EQUAL, ROUNDING, DIFFERS = "equal", "within the rounding of the printed memory", "differs"


@dataclasses.dataclass(frozen=True)
class Prediction:
    value: float  # for the settings as printed
    low: float  # vLLM: at the low end of the printed memory's rounding interval (else = value)
    high: float
    relation: str  # EQUAL, ROUNDING or DIFFERS
    shown: str  # the value as the engine prints it


def architecture(row: dict[str, Any], where: str) -> Architecture:
    if "architecture" in row:
        return load_architecture(row["architecture"])
    if "config" not in row or "config_url" not in row:
        raise ValueError(f"{where}: expected 'architecture' (a catalogue name) or 'config' with 'config_url'")
    return parse_config(row["config"], f"{where}: config", name=row["model"])


def _setting(row: dict[str, Any], key: str, where: str, kind: type) -> Any:
    value = row.get("settings", {}).get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{where}: settings.{key}: expected a {kind.__name__}, got {value!r}")
    return value


def _shown(quantity: str, value: float) -> str:
    if quantity == "vllm_concurrency":
        return f"{value:.2f}"
    if quantity in LLAMA_QUANTITIES:
        return f"{value:.2f}"
    return f"{int(value):,}"


def predict(row: dict[str, Any], where: str = "row") -> Prediction:
    """The project's number for one published log line (see the module docstring)."""
    quantity = row.get("quantity")
    arch = architecture(row, where)
    if quantity in VLLM_QUANTITIES:
        gib = _setting(row, "available_gib", where, float)
        dtype = row["settings"].get("cache_dtype", "bfloat16")

        def at(g: float) -> float:
            if quantity == "vllm_concurrency":
                return vllm_concurrency(arch, int(g * GIB), _setting(row, "max_model_len", where, int), dtype)
            pool = vllm_pool(arch, int(g * GIB), dtype)
            return pool.tokens if quantity == "vllm_tokens" else pool.num_blocks

        value, low, high = at(gib), at(gib - 0.005), at(gib + 0.005)
    elif quantity in VLLM_CONFIG_QUANTITIES:
        block = vllm_hybrid_block(arch, row["settings"].get("cache_dtype", "bfloat16"))
        value = low = high = block.block_tokens
    elif quantity in LLAMA_QUANTITIES:
        lines = llama_cpp_size_lines(arch, _setting(row, "n_ctx", where, int),
                                     row["settings"].get("cache_dtype", "float16"),
                                     row["settings"].get("swa_full", True), row["settings"].get("n_seq", 1),
                                     row["settings"].get("pad", 256))
        cache = quantity.split("_")[1]
        if cache not in lines:
            raise ValueError(f"{where}: {row['model']} has no {cache} cache in llama.cpp")
        value = low = high = lines[cache]["mib"]
    else:
        known = ", ".join(VLLM_QUANTITIES + VLLM_CONFIG_QUANTITIES + LLAMA_QUANTITIES)
        raise ValueError(f"{where}: quantity: expected one of {known}, got {quantity!r}")
    shown = _shown(quantity, value)
    published = row.get("published")
    if not isinstance(published, (int, float)) or isinstance(published, bool):
        raise ValueError(f"{where}: published: expected the engine's number, got {published!r}")
    if shown == _shown(quantity, published):
        relation = EQUAL
    elif min(low, high) <= published <= max(low, high):
        relation = ROUNDING
    else:
        relation = DIFFERS
    return Prediction(value, low, high, relation, shown)
