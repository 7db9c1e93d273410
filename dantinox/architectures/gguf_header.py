"""A GGUF file's metadata read as a config.json-like dict, without reading its tensor data.

`dantinox.architectures.catalogue.load_architecture` uses it for `dantinox kv model.gguf`; the weights
themselves are loaded (and dequantized) by `dantinox.architectures.pretrained` through the `gguf` package.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_GGUF_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2",
               "gemma3": "gemma3_text"}


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
            12: "<d"}


def gguf_header(path: Path) -> tuple[dict[str, Any], int]:
    """The metadata of a GGUF file (arrays longer than 1,024 kept as their length) and its tensors' bytes.

    Reads only the header, which is what llama.cpp's gguf format puts before the tensor data: key/value pairs,
    then one (name, shape, type, offset) record per tensor. The `gguf` package supplies the block sizes.
    """
    import struct

    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    with open(path, "rb") as f:
        def read(fmt: str) -> Any:
            size = struct.calcsize(fmt)
            data = f.read(size)
            if len(data) != size:
                raise ValueError(f"{path}: the GGUF header ends early")
            return struct.unpack(fmt, data)[0]

        def string() -> str:
            return f.read(read("<Q")).decode("utf-8", errors="replace")

        def value(kind: int) -> Any:
            if kind in _SCALARS:
                return read(_SCALARS[kind])
            if kind == 8:
                return string()
            if kind == 9:
                item, count = read("<I"), read("<Q")
                if item == 8 and count > 1024:  # the vocabulary and merges: skip, keep how many there are
                    for _ in range(count):
                        f.seek(read("<Q"), 1)
                    return count
                if item in _SCALARS and count > 1024:  # token scores and types
                    f.seek(count * struct.calcsize(_SCALARS[item]), 1)
                    return count
                return [value(item) for _ in range(count)]
            raise ValueError(f"{path}: unknown GGUF value type {kind}")

        if f.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file (no GGUF magic)")
        version = read("<I")
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version} is not supported (2 or 3)")
        n_tensors, n_fields = read("<Q"), read("<Q")
        fields = {}
        for _ in range(n_fields):
            key = string()
            fields[key] = value(read("<I"))
        weights = 0
        for _ in range(n_tensors):
            string()
            dims = [read("<Q") for _ in range(read("<I"))]
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(read("<I"))]
            read("<Q")  # offset
            elements = 1
            for d in dims:
                elements *= d
            weights += elements // block * type_size
    return fields, weights


def gguf_config(path: Path) -> tuple[dict[str, Any], int]:
    """A config.json-like dict from a GGUF file's metadata (no tensor data is read),
    and the weights' bytes."""
    fields, weights = gguf_header(path)

    def field(key: str, default: Any = ...) -> Any:
        if key not in fields:
            if default is ...:
                raise ValueError(f"{path}: GGUF metadata {key}: required, missing")
            return default
        return fields[key]

    arch = field("general.architecture")
    if arch not in _GGUF_TYPES:
        raise ValueError(f"{path}: general.architecture: expected one of {', '.join(_GGUF_TYPES)}, got "
                         f"{arch!r}")
    a = arch + "."
    kv = field(a + "attention.head_count_kv", None)
    if isinstance(kv, list):
        raise ValueError(f"{path}: {a}attention.head_count_kv: a per-layer list is not modelled, got {kv}")
    heads, d = field(a + "attention.head_count"), field(a + "embedding_length")
    key_len, value_len = field(a + "attention.key_length", None), field(a + "attention.value_length", None)
    if key_len is not None and value_len is not None and key_len != value_len:
        raise ValueError(f"{path}: {a}attention.value_length: expected the key length {key_len}, got "
                         f"{value_len}")
    config = {"model_type": _GGUF_TYPES[arch], "hidden_size": d,
              "num_hidden_layers": field(a + "block_count"), "num_attention_heads": heads,
              "num_key_value_heads": heads if kv is None else kv,
              "max_position_embeddings": field(a + "context_length")}
    if key_len is not None:
        config["head_dim"] = key_len
    window = field(a + "attention.sliding_window", None)
    if window is not None:
        if arch not in ("gemma2", "gemma3"):
            raise ValueError(f"{path}: {a}attention.sliding_window: not modelled for architecture {arch!r}")
        config["sliding_window"] = window
    return config, weights
