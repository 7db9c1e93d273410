"""Train the runs behind the labs' default models: the tiny preset in GQA (K=2), MQA and MLA (C=64, R=16), and
the diffusion lab's small masked-diffusion model.

    .venv/bin/python runs/train_lab_runs.py            # all four, ~4 min each on two CPU cores (diffusion: ~20 s)
    .venv/bin/python runs/train_lab_runs.py tiny-mqa   # one of them

GQA, MQA and MLA: the recipe of runs/tiny (MHA), 1,500 steps on the text of content/, batch 16, 128-token
windows, seed 0. tiny-diffusion: the test preset widened to 64, LLaDA's objective, 300 steps of 64-token windows.
`dantinox train` has no flag for the attention variant, so this calls `dantinox.train.train` with overrides
on the corpus the CLI builds (`content.corpus_text()`).
"""

import sys
from pathlib import Path

import content
from dantinox.train import train

HERE = Path(__file__).resolve().parent
RUNS = {
    "tiny-gqa": dict(kv_heads=2),
    "tiny-mqa": dict(kv_heads=1),
    "tiny-mla": dict(attention="latent", kv_latent_dim=64, rope_head_dim=16),  # the MLA lab's default C and R
    "tiny-diffusion": dict(preset="test", paradigm="diffusion", steps=300, seq_len=64, d_model=64, n_layers=2,
                           n_heads=4, head_size=16, mlp_width=192, max_context=192),
}
RECIPE = dict(preset="tiny", steps=1500, batch_size=16, seq_len=128, seed=0)

if __name__ == "__main__":
    names = sys.argv[1:] or list(RUNS)
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        sys.exit(f"run name: expected one of {', '.join(RUNS)}, got {', '.join(unknown)}")
    corpus = content.corpus_text()
    for name in names:
        path = train(HERE / name, corpus=corpus, progress=False, **{**RECIPE, **RUNS[name]})
        print(f"wrote {path}", flush=True)
