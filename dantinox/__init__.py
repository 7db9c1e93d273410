"""dantinox: a small, real JAX/Flax language model whose KV cache you can measure.

    import dantinox
    cfg = dantinox.ModelConfig.preset("reference", kv_heads=2)
    model = dantinox.Transformer(cfg, rngs=flax.nnx.Rngs(0))
    cache = dantinox.init_cache(cfg, batch_size=4, length=512)
    dantinox.kv_cache_bytes(cfg, batch_size=4, tokens=512) == cache.nbytes
    cfg, model, tokenizer = dantinox.load_pretrained("smollm2-135m")  # SmolLM2-135M-Instruct (pretrained.py)
    mha = dantinox.convert_attention(model, to="mha")  # every KV head repeated (convert.py)
    engine = dantinox.Engine(model, num_pages=256)  # a serving engine over one paged pool (dantinox/engine/)
    dantinox.kv_ledger("gemma-3-27b", tokens=32_768, batch=4, device="H100 80GB")  # a published model's cache

Importing dantinox changes no global JAX setting; the CLI, dev.py and the labs call
`dantinox.enable_compilation_cache()` themselves. It installs the speed layer once (dantinox/backend; pure JAX
with DANTINOX_BACKEND=reference).
"""

import dantinox.backend  # noqa: F401  (installs the speed layer into dantinox.ops)
from dantinox._jax_setup import enable_compilation_cache
from dantinox.accounting.kv_ledger import Ledger, kv_ledger
from dantinox.accounting.memory import (
    DEVICE_PRESETS,
    DevicePreset,
    format_bytes,
    kv_cache_bytes,
    max_batch_size,
    param_bytes,
    reference_tables,
)
from dantinox.architectures.config import PRESETS, CacheConfig, LayerSpec, ModelConfig
from dantinox.architectures.convert import convert_attention
from dantinox.architectures.model import Transformer
from dantinox.architectures.pretrained import load_pretrained
from dantinox.cache import (
    KVCache,
    LatentCache,
    LayerCache,
    cache_shapes,
    filled_slots,
    init_cache,
    tree_nbytes,
)
from dantinox.engine import Engine, StepReport
from dantinox.generation.diffusion import DiffusionResult, DualCache, diffusion_generate
from dantinox.generation.generate import DecodeState, StreamEvent, generate, stream
from dantinox.rundir import Generator, load_run, save_run

__all__ = [
    "DEVICE_PRESETS", "PRESETS", "CacheConfig", "DecodeState", "DevicePreset", "KVCache", "LatentCache",
    "LayerCache", "LayerSpec", "ModelConfig",
    "StreamEvent", "Transformer", "cache_shapes", "enable_compilation_cache", "filled_slots", "format_bytes",
    "generate", "init_cache", "kv_cache_bytes", "max_batch_size", "param_bytes", "reference_tables", "stream",
    "tree_nbytes", "DiffusionResult", "DualCache", "diffusion_generate", "Generator", "load_run", "save_run",
    "load_pretrained", "convert_attention", "Engine", "StepReport", "Ledger", "kv_ledger",
]
