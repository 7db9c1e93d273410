"""Byte-level tokenizer: ids 0-255 are bytes, then three special tokens. No files needed."""

from __future__ import annotations

from collections.abc import Sequence

BOS, EOS, MASK = 256, 257, 258
SPECIAL = {BOS: "<bos>", EOS: "<eos>", MASK: "<mask>"}
VOCAB_SIZE = 259


def encode(text: str) -> list[int]:
    """UTF-8 bytes of `text` as token ids."""
    if not isinstance(text, str):
        raise ValueError(f"text: expected a string, got {type(text).__name__}")
    return list(text.encode("utf-8"))


def decode(ids: Sequence[int], show_special: bool = False, errors: str = "replace") -> str:
    """Token ids back to text; special tokens are dropped or shown. Bytes that are not valid UTF-8 (a
    byte-level model can emit any byte) become U+FFFD, or, with errors="backslashreplace",
    readable escapes such as \\xe2."""
    out, pending = [], bytearray()
    for i in (int(t) for t in ids):
        if i < 256:
            pending.append(i)
            continue
        out.append(pending.decode("utf-8", errors=errors))
        pending = bytearray()
        if show_special:
            out.append(SPECIAL.get(i, f"<{i}>"))
    out.append(pending.decode("utf-8", errors=errors))
    return "".join(out)
