"""Train the runs behind the labs' default models: the tiny preset in GQA (K=2), MQA and MLA (C=64, R=16).

    .venv/bin/python runs/train_lab_runs.py            # all three, ~4 min each on two CPU cores
    .venv/bin/python runs/train_lab_runs.py tiny-mqa   # one of them

Same recipe as runs/tiny (MHA): 1,500 steps on the text of content/, batch 16, 128-token windows, seed 0.
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
}

if __name__ == "__main__":
    names = sys.argv[1:] or list(RUNS)
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        sys.exit(f"run name: expected one of {', '.join(RUNS)}, got {', '.join(unknown)}")
    corpus = content.corpus_text()
    for name in names:
        path = train(HERE / name, corpus=corpus, preset="tiny", steps=1500, batch_size=16, seq_len=128, seed=0,
                     progress=False, **RUNS[name])
        print(f"wrote {path}", flush=True)
