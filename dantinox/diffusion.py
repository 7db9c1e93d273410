"""Masked diffusion: the training objective, and block-wise generation with a prefix cache or a DualCache.

A diffusion model (ModelConfig(paradigm="diffusion")) is the same transformer with bidirectional
attention. It learns to fill in MASK tokens (LLaDA, arXiv:2502.09992).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from dantinox.model import Transformer
from dantinox.tokenizer import MASK


def masked_diffusion_loss(model: Transformer, tokens_BT: jax.Array, rng: jax.Array,
                          eps: float = 1e-3) -> jax.Array:
    """LLaDA's masked-token objective, normalised by the number of tokens.

    Each sequence draws a masking ratio t ~ U(eps, 1] and masks each token with probability t. The
    model predicts the masked tokens; each masked cross-entropy is weighted by 1/t, which makes the
    loss an upper bound on the sequence's negative log-likelihood.
    """
    if model.cfg.paradigm != "diffusion":
        raise ValueError(f"model: masked_diffusion_loss trains diffusion models; this one has paradigm="
                         f"{model.cfg.paradigm!r}")
    B, T = tokens_BT.shape
    ratio_rng, mask_rng = jax.random.split(rng)
    t_B = eps + (1.0 - eps) * (1.0 - jax.random.uniform(ratio_rng, (B,)))  # uniform is [0, 1): flip to (0, 1]
    masked_BT = jax.random.uniform(mask_rng, (B, T)) < t_B[:, None]
    logits_BTV, _ = model.forward(jnp.where(masked_BT, MASK, tokens_BT))
    nll_BT = optax.softmax_cross_entropy_with_integer_labels(logits_BTV, tokens_BT)
    return jnp.sum(jnp.where(masked_BT, nll_BT / t_B[:, None], 0.0)) / (B * T)
