"""Train the runs behind the memory-savers lab whose architecture differs from runs/tiny and runs/tiny-gqa|mqa|mla.

    .venv/bin/python runs/train_memory_savers.py                  # every run below, one after another
    .venv/bin/python runs/train_memory_savers.py tiny-swa16-local # one of them

Same recipe as runs/tiny (MHA): the tiny preset, 1,500 steps, batch 16, 128-token windows, seed 0, on the text
of content/entries. `--corpus FILE` pins the training text so every run of one batch sees the same bytes.
Sliding-window placements: "local" puts every layer in a window, "1to1" alternates local and global layers with
layer 0 local, as Gemma 2 does (dantinox.windows.local_layers).
"""

import argparse
from pathlib import Path

import content
from dantinox.config import PRESETS
from dantinox.windows import local_layers
from dantinox.train import train

HERE = Path(__file__).resolve().parent
TINY_LAYERS = PRESETS["tiny"]["n_layers"]
RUNS = {
    "tiny-swa16-local": dict(sliding_windows=local_layers(TINY_LAYERS, 16)),
    "tiny-swa16-1to1": dict(sliding_windows=local_layers(TINY_LAYERS, 16, local_per_global=1)),
    "tiny-swa64-local": dict(sliding_windows=local_layers(TINY_LAYERS, 64)),
    "tiny-swa64-1to1": dict(sliding_windows=local_layers(TINY_LAYERS, 64, local_per_global=1)),
    "tiny-mla-c32": dict(attention="latent", kv_latent_dim=32, rope_head_dim=16),  # half the MLA lab's latent
}

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"default: all of {', '.join(RUNS)}")
    parser.add_argument("--corpus", default=None, help="a UTF-8 text file (default: the text of content/entries)")
    args = parser.parse_args()
    unknown = [n for n in args.names if n not in RUNS]
    if unknown:
        parser.exit(2, f"run name: expected one of {', '.join(RUNS)}, got {', '.join(unknown)}\n")
    text = Path(args.corpus).read_text(encoding="utf-8") if args.corpus else content.corpus_text()
    for name in args.names or list(RUNS):
        path = train(HERE / name, corpus=text, preset="tiny", steps=1500, batch_size=16, seq_len=128, seed=0,
                     progress=False, **RUNS[name])
        print(f"wrote {path}", flush=True)
