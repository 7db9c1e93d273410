"""Prompt-lookup speculation for the serving engine: propose drafts from a request's own tokens, keep what the
model agrees with.

A draft is the `k` tokens that followed the latest earlier occurrence of the request's last n tokens
(n = ngram down to 1). One forward verifies a request's drafts: the longest prefix of drafts equal to the
model's own choice at each position is kept, then the model's next token after them; a sampled request
compares against its drawn tokens, so it gets exactly the tokens it would get without drafts.
"""

from __future__ import annotations

from collections.abc import Callable, Collection


def lookup_drafts(tokens: list[int], k: int, ngram: int = 3) -> list[int]:
    """Prompt lookup: up to k tokens that followed the latest earlier match of the last n tokens
    (n = ngram..1)."""
    if k <= 0:
        return []
    for n in range(min(ngram, len(tokens) - 1), 0, -1):
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):  # latest match first
            if tokens[start:start + n] == tail:
                return tokens[start + n:start + n + k]
    return []


def accept_drafts(drafts: list[int], chosen: Callable[[int], int], real: int, room: int,
                  stop: Collection[int]) -> tuple[int, list[int]]:
    """(drafts accepted, tokens emitted) after a verify: `chosen(j)` is the model's token after feed position
    j, `real` the feed's tokens before the drafts, `room` the tokens the request may still emit. Emission
    stops at a stop id, even inside the accepted drafts."""
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == chosen(accepted):
        accepted += 1
    new = (drafts[:accepted] + [chosen(real - 1 + accepted)])[:room]
    for i, tok in enumerate(new):
        if tok in stop:
            return accepted, new[:i + 1]
    return accepted, new
