"""Which layers are local, and how wide: the per-layer tuples `ModelConfig.sliding_windows` and
`attention_chunks` hold, for the placements published models use."""

from __future__ import annotations

from dantinox.checks import positive_int


def local_layers(n_layers: int, size: int, local_per_global: int | None = None) -> tuple[int | None, ...]:
    """Per layer, `size` (a local layer) or None (a global one): every layer local, or `local_per_global`
    local layers before each global one.

    Layer i is global when (i + 1) % (local_per_global + 1) == 0. Gemma 2 alternates (local_per_global=1:
    layers 0, 2, ... local; 1, 3, ... global) and Gemma 3 places one global layer after five local ones
    (local_per_global=5), as in Hugging Face transformers' Gemma 2 and Gemma 3 configs, e.g.
    https://github.com/huggingface/transformers/blob/main/src/transformers/models/gemma3/configuration_gemma3.py
    """
    positive_int("n_layers", n_layers)
    positive_int("size", size)
    if local_per_global is None:
        return (size,) * n_layers
    positive_int("local_per_global", local_per_global)
    return tuple(None if (i + 1) % (local_per_global + 1) == 0 else size for i in range(n_layers))


def gemma2_windows(n_layers: int, window: int) -> tuple[int | None, ...]:
    """Gemma 2's placement: local and global layers alternate, local first."""
    return local_layers(n_layers, window, local_per_global=1)


def gemma3_windows(n_layers: int, window: int) -> tuple[int | None, ...]:
    """Gemma 3's placement: five local layers, then one global, repeated."""
    return local_layers(n_layers, window, local_per_global=5)
