"""dantinox: a small, real JAX/Flax language model whose KV cache you can measure.

    import dantinox
    cfg = dantinox.ModelConfig.preset("reference", attention="gqa", kv_heads=2)
    model = dantinox.Transformer(cfg, rngs=flax.nnx.Rngs(0))
    dantinox.kv_cache_bytes(cfg, batch_size=4, tokens=512) == dantinox.tree_nbytes(
        dantinox.init_cache(cfg, batch_size=4, length=512))
"""

from dantinox._jax_setup import enable_compilation_cache

enable_compilation_cache()

from dantinox.cache import (  # noqa: E402
    LatentCache,
    LayerCache,
    cache_shapes,
    init_cache,
    tree_nbytes,
)
from dantinox.config import PRESETS, ModelConfig  # noqa: E402
from dantinox.diffusion import DiffusionResult, DualCache, diffusion_generate  # noqa: E402
from dantinox.generate import DecodeState, StreamEvent, generate, stream  # noqa: E402
from dantinox.memory import (  # noqa: E402
    DEVICE_PRESETS,
    DevicePreset,
    format_bytes,
    kv_cache_bytes,
    max_batch_size,
    param_bytes,
    reference_tables,
)
from dantinox.model import Transformer  # noqa: E402
from dantinox.rundir import Generator, load_run, save_run  # noqa: E402

__all__ = [
    "DEVICE_PRESETS", "PRESETS", "DecodeState", "DevicePreset", "LatentCache", "LayerCache", "ModelConfig",
    "StreamEvent", "Transformer", "cache_shapes", "format_bytes", "generate", "init_cache", "kv_cache_bytes",
    "max_batch_size", "param_bytes", "reference_tables", "stream", "tree_nbytes",
    "DiffusionResult", "DualCache", "diffusion_generate", "Generator", "load_run", "save_run",
]
