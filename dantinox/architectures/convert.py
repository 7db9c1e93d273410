"""A trained K/V-heads model as another attention variant, without retraining: MHA, GQA, MQA or MLA.

    mha = dantinox.convert_attention(model, to="mha")                  # exact: every KV head repeated
    mqa = dantinox.convert_attention(model, to="mqa")                  # KV heads mean-pooled (approximate)
    mla = dantinox.convert_attention(model, to="mla", latent_dim=96, calibration_ids=ids)

Which choice follows which paper:
  MHA, GQA with more heads  each KV head's key and value columns repeated for the query heads of its group:
                            the same function, G times the cache (exact; no paper needed)
  GQA with fewer heads, MQA each new KV head is the mean of the key and value projections of the heads it
                            replaces (Ainslie et al., GQA, arXiv:2305.13245 §2.1, "mean-pooling"); their
                            paper then up-trains on 5 % of the pre-training data, which this does not
  MLA                       MHA2MLA (Ji et al., arXiv:2502.14837): partial RoPE keeps r frequency pairs per KV
                            head, chosen per layer by the 2-norm of their query and key parts on
                            calibration text (`keep="2-norm"`, the paper's best; "high", "low" and
                            "uniform" need no data); the kept channels become that KV head's RoPE key
                            (R = K·2r cached numbers, one share per group, as MHA2MLA keeps GQA's RoPE keys
                            per KV head); the other key channels lose RoPE, and they and the values are
                            compressed jointly: one truncated SVD of [W_K,nope | W_V] (SVD_joint),
                            down-projection = the top C left singular vectors, up-projections = Σ·Vᵀ split
                            into keys and values. No norm on the latent.
                            MHA2MLA then fine-tunes on 0.6-1 % of the pre-training data; this does not.
                            TransMLA (Meng et al., arXiv:2502.07864) converts GQA to MLA another way (RoPE
                            folded into one head) and is not what this implements.
Removing RoPE from most channels changes the function by itself: `latent_dim` equal to the full rank
K·(H - 2r + H) keeps every singular value, so that model measures the partial-RoPE cost alone.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dantinox.architectures.config import ModelConfig
from dantinox.architectures.model import Transformer
from dantinox.checks import check_ids, positive_int

TARGETS = ("mha", "gqa", "mqa", "mla")
KEEP = ("2-norm", "high", "low", "uniform")  # MHA2MLA's four partial-RoPE choices (its S_2-norm, S_high, ...)


def convert_attention(model: Transformer, to: str, *, kv_heads: int | None = None,
                      latent_dim: int | None = None, rope_pairs: int = 4, keep: str = "2-norm",
                      calibration_ids: Any = None) -> Transformer:
    """A new model with `model`'s weights rearranged into another attention variant (no training).

    `to`: "mha" (K = N), "mqa" (K = 1), "gqa" (K = `kv_heads`) or "mla" (a latent of `latent_dim` C, with
    `rope_pairs` r frequency pairs per KV head kept under RoPE, chosen by `keep`; "2-norm" reads
    `calibration_ids` [B, T], text the model runs on once). The source must cache K/V heads of one K and H in
    every layer (a loaded checkpoint does). See the module docstring for which choice follows which paper.
    """
    cfg = model.cfg
    if to not in TARGETS:
        raise ValueError(f"to: expected one of {', '.join(TARGETS)}, got {to!r}")
    if cfg.attention != "heads" or not cfg.uniform_heads:
        raise ValueError(f"model: converts a K/V-heads model with one K and H in every layer, got "
                         f"attention={cfg.attention!r}"
                         f"{'' if cfg.uniform_heads else ' with per-layer K or H'}")
    if to != "gqa" and kv_heads is not None:
        raise ValueError(f"kv_heads: only for to='gqa' (mha is {cfg.n_heads}, mqa is 1), got {kv_heads}")
    if to != "mla" and latent_dim is not None:
        raise ValueError(f"latent_dim: only for to='mla', got {latent_dim}")
    if to == "mla":
        return _to_latent(model, latent_dim, rope_pairs, keep, calibration_ids)
    if to == "gqa":
        if kv_heads is None or positive_int("kv_heads", kv_heads) > cfg.n_heads or cfg.n_heads % kv_heads:
            raise ValueError(f"kv_heads: to='gqa' needs a divisor of n_heads ({cfg.n_heads}), got "
                             f"{kv_heads!r}")
    return _regroup(model, {"mha": cfg.n_heads, "mqa": 1}.get(to, kv_heads))


def _weights(model: Transformer) -> dict[str, np.ndarray]:
    """Every parameter as a float32 numpy array, by its path ("blocks/0/attn/wqkv/kernel")."""
    return {"/".join(str(p) for p in path): np.asarray(var.get_value(), np.float32)
            for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def _model(cfg: ModelConfig, tensors: dict[str, np.ndarray]) -> Transformer:
    """A Transformer of `cfg` holding `tensors` (every parameter by path),
    built without random weights first."""
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    flat = []
    for path, var in nnx.to_flat_state(abstract):
        name, want = "/".join(str(p) for p in path), var.get_value()
        if tensors[name].shape != want.shape:  # a conversion bug, not a user's input
            raise AssertionError(f"{name}: converted shape {tensors[name].shape}, the config implies "
                                 f"{want.shape}")
        flat.append((path, var.replace(jnp.asarray(tensors[name], want.dtype))))
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def _split_qkv(cfg: ModelConfig, kernel: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A fused [D, (N + 2K)·H] kernel as q [D, N, H] (query head n = k·G + g), k and v [D, K, H]."""
    D, N, K, H = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_size
    q, k, v = np.split(kernel, [N * H, (N + K) * H], axis=1)
    return q.reshape(D, N, H), k.reshape(D, K, H), v.reshape(D, K, H)


def _regroup(model: Transformer, K_new: int) -> Transformer:
    """K KV heads as K_new: each repeated (K_new a multiple of K) or groups of K / K_new mean-pooled
    (GQA §2.1)."""
    cfg = model.cfg
    K, D = cfg.n_kv_heads, cfg.d_model
    if K_new % K and K % K_new:
        raise ValueError(f"kv_heads: {K_new} KV heads neither repeat nor pool the model's {K}")

    def regroup(w_DKH: np.ndarray) -> np.ndarray:
        if K_new >= K:
            return np.repeat(w_DKH, K_new // K, axis=1)  # head k serves query heads k·G .. k·G + G - 1
        return w_DKH.reshape(D, K_new, K // K_new, -1).mean(axis=2)

    tensors = _weights(model)
    for i in range(cfg.n_layers):
        name = f"blocks/{i}/attn/wqkv/kernel"
        q, k, v = _split_qkv(cfg, tensors[name])
        tensors[name] = np.concatenate([w.reshape(D, -1) for w in (q, regroup(k), regroup(v))], axis=1)
    changes: dict[str, Any] = dict(kv_heads=K_new)
    if cfg.layer_specs is not None:
        changes["layer_specs"] = tuple(dataclasses.replace(s, kv_heads=None) for s in cfg.layer_specs)
    return _model(cfg.replace(**changes), tensors)


def _pair_scores(model: Transformer, calibration_ids: Any) -> np.ndarray:
    """[L, K, H/2] MHA2MLA's 2-norm score of each frequency pair: the mean norm of its two query channels
    times that of its two key channels, summed over the query heads of the KV head's group (before RoPE, which
    does not change a pair's norm)."""
    cfg = model.cfg
    ids = jnp.asarray(check_ids(cfg.vocab_size, calibration_ids, "calibration_ids"))
    if ids.shape[1] > cfg.max_context:
        raise ValueError(f"calibration_ids: {ids.shape[1]} tokens exceed max_context={cfg.max_context}")
    graphdef, state = nnx.split(model)
    return np.asarray(_scores(graphdef, state, ids))


@functools.partial(jax.jit, static_argnums=0)
def _scores(graphdef: nnx.GraphDef, state: nnx.State, ids_BT: jax.Array) -> jax.Array:
    model = nnx.merge(graphdef, state)
    cfg = model.cfg
    B, T = ids_BT.shape
    K, G, H = cfg.n_kv_heads, cfg.groups, cfg.head_size
    pos_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    x = model.embed.embedding[...][ids_BT].astype(cfg.jnp_dtype)

    def pair_norms(w: jax.Array) -> jax.Array:  # [..., H] -> [..., H/2]: channels i and i + H/2 form pair i
        w = w.astype(jnp.float32)
        return jnp.sqrt(w[..., : H // 2] ** 2 + w[..., H // 2:] ** 2)

    scores = []
    for block in model.blocks:
        q, k, _ = jnp.split(block.attn.wqkv(block.norm1(x)), [K * G * H, (K * G + K) * H], axis=-1)
        q_KGP = pair_norms(q.reshape(B, T, K, G, H)).mean(axis=(0, 1))
        k_KP = pair_norms(k.reshape(B, T, K, H)).mean(axis=(0, 1))
        scores.append((q_KGP * k_KP[:, None]).sum(axis=1))
        x, _, _ = block(x, pos_BT)
    return jnp.stack(scores)


def kept_pairs(model: Transformer, rope_pairs: int, keep: str = "2-norm",
               calibration_ids: Any = None) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Per layer, per KV head, the r frequency pairs whose channels keep RoPE (MHA2MLA's partial-RoPE
    choices): "high" the r fastest-turning (pairs 0 .. r - 1), "low" the r slowest, "uniform" every (H/2 /
    r)-th, "2-norm" the r with the largest query-norm × key-norm on `calibration_ids`
    (each KV head its own)."""
    cfg = model.cfg
    half = cfg.head_size // 2
    r = positive_int("rope_pairs", rope_pairs)
    if r >= half:
        raise ValueError(f"rope_pairs: fewer than the head's {half} pairs (the rest lose RoPE), got {r}")
    if keep not in KEEP:
        raise ValueError(f"keep: expected one of {', '.join(KEEP)}, got {keep!r}")
    if keep == "2-norm":
        if calibration_ids is None:
            raise ValueError("calibration_ids: keep='2-norm' ranks the pairs on text the model reads; pass "
                             "token ids [batch, tokens] (or keep='high', which needs none)")
        top = np.argsort(-_pair_scores(model, calibration_ids), axis=-1, kind="stable")[..., :r]
        return tuple(tuple(tuple(sorted(int(i) for i in head)) for head in layer) for layer in top)
    one = {"high": range(r), "low": range(half - r, half), "uniform": range(0, half, half // r)}[keep]
    return ((tuple(one)[:r],) * cfg.n_kv_heads,) * cfg.n_layers


def _to_latent(model: Transformer, latent_dim: Any, rope_pairs: int, keep: str,
               calibration_ids: Any) -> Transformer:
    cfg = model.cfg
    if cfg.qk_norm:
        raise ValueError("model: qk_norm normalizes each key head before RoPE, which a linear latent cannot "
                         "carry; convert a model without qk_norm to mla")
    if cfg.post_norms or cfg.scale_embeddings:  # the calibration forward (_pair_scores) reads neither
        raise ValueError("model: post_norms and scale_embeddings (Gemma's) are not converted to mla; "
                         "convert a model without them")
    D, N, K, G, H = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.groups, cfg.head_size
    pairs = kept_pairs(model, rope_pairs, keep, calibration_ids)
    r = len(pairs[0][0])
    Hn, half = H - 2 * r, H // 2
    full_rank = min(D, K * (Hn + H))
    if latent_dim is None or positive_int("latent_dim", latent_dim) > full_rank:
        raise ValueError(f"latent_dim: to='mla' needs C, at most the rank of [W_K,nope | W_V], "
                         f"min(D, K·(2H - 2r)) = {full_rank}, got {latent_dim!r}")
    C = int(latent_dim)
    tensors = _weights(model)
    for i in range(cfg.n_layers):
        q, k, v = _split_qkv(cfg, tensors.pop(f"blocks/{i}/attn/wqkv/kernel"))
        # per KV head: channel order [pairs, pairs + H/2], as rotate_pairs pairs them
        rope_ch, nope_ch = [], []
        for kept in pairs[i]:
            rest = [j for j in range(half) if j not in kept]
            rope_ch.append([*kept, *(j + half for j in kept)])
            nope_ch.append([*rest, *(j + half for j in rest)])
        head_k = [n // G for n in range(N)]  # the KV head each query head reads
        q_up = np.stack([np.concatenate([q[:, n, nope_ch[head_k[n]]], q[:, n, rope_ch[head_k[n]]]], axis=1)
                         for n in range(N)], axis=1)  # [D, N, Hn + 2r]
        k_rope = np.stack([k[:, kk, rope_ch[kk]] for kk in range(K)], axis=1)  # [D, K, 2r]
        k_nope = np.stack([k[:, kk, nope_ch[kk]] for kk in range(K)], axis=1)  # [D, K, Hn]
        joint = np.concatenate([k_nope.reshape(D, K * Hn), v.reshape(D, K * H)], axis=1).astype(np.float64)
        U, S, Vt = np.linalg.svd(joint, full_matrices=False)  # SVD_joint: keys and values share the latent
        up_k, up_v = np.split(S[:C, None] * Vt[:C], [K * Hn], axis=1)
        up_k, up_v = up_k.reshape(C, K, Hn), up_v.reshape(C, K, H)
        prefix = f"blocks/{i}/attn/"
        tensors.update({
            prefix + "q_up/kernel": q_up.reshape(D, -1), prefix + "k_rope/kernel": k_rope.reshape(D, -1),
            prefix + "kv_down/kernel": U[:, :C],
            prefix + "w_uk": up_k[:, head_k], prefix + "w_uv": up_v[:, head_k],
        })
    # every layer's kind and window as they were; K and H are the latent's, the kept pairs its own
    specs = tuple(dataclasses.replace(s, kv_heads=None, head_size=None, rope_pairs=p)
                  for s, p in zip(cfg.layers, pairs, strict=True))
    latent = cfg.replace(attention="latent", kv_heads=None, kv_latent_dim=C, rope_head_dim=K * 2 * r,
                         mla_rope_heads=K, mla_nope_dim=Hn, mla_latent_norm=False, layer_specs=specs,
                         sliding_windows=None, attention_chunks=None)
    return _model(latent, {name: w.astype(np.float32) for name, w in tensors.items()})


_CACHE_FORMAT = 1  # bump when the cached tensors' names or the conversion's arithmetic change


def load_converted(source: str, to: str, *, calibration_ids: Any = None, **options: Any
                   ) -> tuple[ModelConfig, Transformer, Any]:
    """(config, model, tokenizer) of a published model (`load_pretrained`'s source) converted by
    `convert_attention(model, to, calibration_ids=..., **options)`, computed on first use and kept in the user
    cache directory (beside `load_pretrained`'s) for MLA, whose SVDs and calibration take a minute: only the
    weights the conversion makes (its latent projections), the rest being the published model's."""
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    from dantinox.architectures import pretrained

    cfg, model, tok = pretrained.load_pretrained(source)
    if to != "mla":  # repeating or pooling heads takes a second or two: not worth a file
        converted = convert_attention(model, to, calibration_ids=calibration_ids, **options)
        return converted.cfg, converted, tok
    ids = None if calibration_ids is None else np.asarray(check_ids(cfg.vocab_size, calibration_ids,
                                                                    "calibration_ids"), np.int32)
    key = hashlib.sha256(json.dumps(dict(source=str(source), to=to, options=options, format=_CACHE_FORMAT,
                                         weights=_digest(model)), sort_keys=True).encode())
    key.update(b"" if ids is None else ids.tobytes() + str(ids.shape).encode())
    name = f"{Path(str(source)).stem}-{to}-{key.hexdigest()[:20]}.safetensors"
    path = pretrained.cache_dir() / "converted" / name
    if path.is_file():
        try:
            with safe_open(str(path), framework="numpy") as f:
                converted_cfg = ModelConfig.from_dict(json.loads(f.metadata()["config"]))
            return converted_cfg, _model(converted_cfg, {**_weights(model), **load_file(str(path))}), tok
        except Exception:  # a torn or foreign file: convert again and replace it
            pass
    converted = convert_attention(model, to, calibration_ids=ids, **options)
    source_weights = _weights(model)
    attention = {name: w for name, w in _weights(converted).items()
                 if name not in source_weights}  # the new ones
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    save_file(attention, str(partial), metadata={"config": json.dumps(converted.cfg.to_dict())})
    partial.replace(path)  # atomic: a reader never sees half a file
    return converted.cfg, converted, tok


def _digest(model: Transformer) -> str:
    """A short fingerprint of the weights a conversion reads
    (layer 0's attention and the embedding's first row)."""
    w = _weights(model)
    h = hashlib.sha256(w["blocks/0/attn/wqkv/kernel"].tobytes())
    h.update(w["embed/embedding"][0].tobytes())
    return h.hexdigest()[:20]
