"""The exercises that need no model: references in NumPy, random cases, known wrong solutions.

Each reference is written here independently of dantinox (so the browser site runs it without JAX);
tests/test_exercises.py proves each equal to dantinox's own implementation on random cases: the ledger's
per-layer bytes, `Ring`, `PageManager`, `quant.quantize`, `page_digest` and the page pool's prefix look-up,
H2O's `keep`, KIVI's key scales and the engine's scheduler.
"""

from __future__ import annotations

import collections
import hashlib
import random

import numpy as np

from widgets.exercises.framework import (
    Case,
    Exercise,
    Mistake,
    Refused,
    compare_array,
    compare_fields,
    compare_value,
    shown,
)


def _ints(got, want, name):
    return compare_array(got, np.asarray(want, np.int64), name)


# (a) The cache bytes of a hybrid config, layer by layer -------------------------------------------------

def hybrid_bytes(layers: list[dict], tokens: int, batch: int, itemsize: int) -> list[int]:
    """Bytes of each layer's cache after `tokens` tokens of `batch` sequences: slots x 2·K·H x itemsize."""
    out = []
    for layer in layers:
        slots = tokens if layer["kind"] == "full" else min(tokens, layer["window"])
        out.append(batch * slots * 2 * layer["kv_heads"] * layer["head_size"] * itemsize)
    return out


def _every_layer_full(layers, tokens, batch, itemsize):
    return [batch * tokens * 2 * x["kv_heads"] * x["head_size"] * itemsize for x in layers]


def _keys_only(layers, tokens, batch, itemsize):
    return [b // 2 for b in hybrid_bytes(layers, tokens, batch, itemsize)]


def _hybrid_cases(rng: random.Random) -> list[Case]:
    cases = []
    for _ in range(6):
        n = rng.randint(2, 6)
        layers = []
        for i in range(n):
            kind = "full" if i == n - 1 or rng.random() < 0.3 else rng.choice(["sliding", "chunked"])
            layers.append({"kind": kind, "window": None if kind == "full" else rng.choice([64, 128, 512, 1024]),
                           "kv_heads": rng.choice([1, 2, 4, 8]), "head_size": rng.choice([32, 64, 128, 256])})
        tokens, batch, itemsize = rng.randint(1, 4096), rng.randint(1, 4), rng.choice([1, 2, 4])
        kinds = "/".join(x["kind"][0] + (str(x["window"]) if x["window"] else "") for x in layers)
        cases.append(Case((layers, tokens, batch, itemsize),
                          f"{n} layers {kinds}, tokens={tokens}, batch={batch}, itemsize={itemsize}"))
    return cases


HYBRID = Exercise(
    id="a-hybrid-bytes", title="(a) The cache bytes of a hybrid config, layer by layer", tier="core",
    entry="kv-cache-of-real-models", lab="real-models", name="hybrid_bytes",
    skeleton='''def hybrid_bytes(layers, tokens, batch, itemsize):
    """Bytes of each layer's KV cache after `tokens` tokens of `batch` sequences.

    layers: a list of dicts {"kind": "full" | "sliding" | "chunked", "window": W or None,
    "kv_heads": K, "head_size": H}; itemsize: bytes per stored element. Returns one int per layer.
    """
    raise NotImplementedError
''',
    hints=("A layer stores, per slot, a key and a value for each of its KV heads.",
           "How many slots does a layer hold? A full layer one per token; a sliding or chunked one never more "
           "than its window.",
           "Multiply slots by the elements one slot stores and by itemsize, then by the batch."),
    reference=hybrid_bytes, cases=_hybrid_cases, compare=lambda g, w: _ints(g, w, "bytes"),
    mistakes=(Mistake("every-layer-full", _every_layer_full, "kv-cache-of-real-models", 0),
              Mistake("keys-only", _keys_only, "kv-cache", 3)))


# (d) A sliding-window ring buffer ----------------------------------------------------------------------

def ring_view(window: int, slots: int, length: int) -> tuple[int, np.ndarray, np.ndarray]:
    """After `length` tokens in a ring of `slots` slots: the newest token's slot, each slot's position (-1:
    empty) and which slots the newest query sees (window W: itself and the W - 1 before it)."""
    p = length - 1
    s = np.arange(slots)
    held = s + slots * ((length - 1 - s) // slots)
    held = np.where(held >= 0, held, -1)
    return p % slots, held, (held >= 0) & (p - held < window)


def _window_plus_one(window, slots, length):
    slot, held, _ = ring_view(window, slots, length)
    return slot, held, (held >= 0) & (length - 1 - held <= window)


def _slot_after_newest(window, slots, length):
    _, held, visible = ring_view(window, slots, length)
    return length % slots, held, visible


def _ring_cases(rng: random.Random) -> list[Case]:
    cases = []
    for i in range(8):
        window = rng.randint(2, 8)
        slots = window if i % 2 == 0 else window + rng.randint(1, 6)
        length = rng.randint(1, 3 * slots)
        cases.append(Case((window, slots, length), f"window={window}, slots={slots}, length={length}"))
    return cases


RING = Exercise(
    id="d-ring-buffer", title="(d) A sliding-window ring buffer: the slot and the mask", tier="core",
    entry="sliding-window-attention", lab="memory-savers", name="ring_view",
    skeleton='''import numpy as np

def ring_view(window, slots, length):
    """A ring buffer of `slots` slots (at least `window`) after `length` tokens, positions 0 .. length-1.

    Returns (slot, held, visible): the slot the newest token (position length-1) was written to; held[s],
    the position slot s holds (-1 when empty); visible[s], whether the newest query may attend to slot s
    under a sliding window of `window` tokens.
    """
    raise NotImplementedError
''',
    hints=("Position p lives in slot p mod slots; the newest position is length - 1.",
           "A slot holds the latest position p < length with p mod slots equal to the slot.",
           "A window of W tokens is the current token and the W - 1 before it: how far back may a key be?"),
    reference=ring_view, cases=_ring_cases,
    compare=compare_fields(("slot", "held", "visible"), (compare_value, _ints,
                                                           lambda g, w, n: compare_array(g, np.asarray(w), n))),
    mistakes=(Mistake("window-plus-one", _window_plus_one, "sliding-window-attention", 2),
              Mistake("slot-after-newest", _slot_after_newest,
                      note="you wrote the newest token at slot length mod slots, one past its own: the newest token "
                           "is position length - 1, and position p goes to slot p mod slots")))


# (e) A page table: allocate, locate, fork with copy-on-write --------------------------------------------

class PageTable:
    """Pages of `page_size` token slots for sequences, from a free list; shared pages copied on first write.

    A page is taken from the front of the free list and a page nobody holds goes to its back. `add` gives a new
    sequence pages for its tokens; `append` makes room for more and returns the copies (src, dst) to make
    first; `fork` shares every page of a sequence with a new one; `locate` gives (page, offset) of a position;
    `release` drops a sequence and returns how many pages became free. Too few free pages, an unknown sequence
    or a position not yet written raise ValueError and change nothing.
    """

    def __init__(self, num_pages: int, page_size: int):
        self.page_size = page_size
        self.free = collections.deque(range(num_pages))
        self.refs = [0] * num_pages
        self.tables: dict[str, list[int]] = {}
        self.lengths: dict[str, int] = {}

    def _take(self, n: int) -> list[int]:
        if n > len(self.free):
            raise ValueError(f"needs {n} page(s), {len(self.free)} free")
        pages = [self.free.popleft() for _ in range(n)]
        for p in pages:
            self.refs[p] = 1
        return pages

    def _drop(self, page: int) -> bool:
        self.refs[page] -= 1
        if self.refs[page] == 0:
            self.free.append(page)
            return True
        return False

    def _known(self, seq: str) -> None:
        if seq not in self.tables:
            raise ValueError(f"no sequence {seq!r}")

    def add(self, seq: str, n_tokens: int) -> list[int]:
        if seq in self.tables:
            raise ValueError(f"sequence {seq!r} exists")
        self.tables[seq] = self._take(-(-n_tokens // self.page_size))
        self.lengths[seq] = n_tokens
        return list(self.tables[seq])

    def append(self, seq: str, n_tokens: int) -> list[tuple[int, int]]:
        self._known(seq)
        table, length, ps = self.tables[seq], self.lengths[seq], self.page_size
        shared_tail = bool(length % ps) and self.refs[table[-1]] > 1
        more = -(-(length + n_tokens) // ps) - len(table)
        if more + shared_tail > len(self.free):
            raise ValueError(f"needs {more + shared_tail} page(s), {len(self.free)} free")
        copies = []
        if shared_tail:  # the others keep the old page; this sequence writes into a copy
            (fresh,) = self._take(1)
            self._drop(table[-1])
            copies.append((table[-1], fresh))
            table[-1] = fresh
        table += self._take(more)
        self.lengths[seq] = length + n_tokens
        return copies

    def fork(self, parent: str, child: str) -> list[int]:
        self._known(parent)
        if child in self.tables:
            raise ValueError(f"sequence {child!r} exists")
        self.tables[child], self.lengths[child] = list(self.tables[parent]), self.lengths[parent]
        for p in self.tables[child]:
            self.refs[p] += 1
        return list(self.tables[child])

    def locate(self, seq: str, position: int) -> tuple[int, int]:
        self._known(seq)
        if not 0 <= position < self.lengths[seq]:
            raise ValueError(f"position {position} not written")
        return self.tables[seq][position // self.page_size], position % self.page_size

    def release(self, seq: str) -> int:
        self._known(seq)
        freed = sum(self._drop(p) for p in self.tables.pop(seq))
        del self.lengths[seq]
        return freed


class _ForkCopies(PageTable):
    def fork(self, parent, child):
        self._known(parent)
        self.tables[child], self.lengths[child] = self._take(len(self.tables[parent])), self.lengths[parent]
        return list(self.tables[child])


class _NoCopyOnWrite(PageTable):
    def append(self, seq, n_tokens):
        self._known(seq)
        table, length, ps = self.tables[seq], self.lengths[seq], self.page_size
        table += self._take(-(-(length + n_tokens) // ps) - len(table))
        self.lengths[seq] = length + n_tokens
        return []


def drive(cls, args: tuple) -> list:
    """Build `cls(num_pages, page_size)` and apply each operation; per operation its result or Refused."""
    num_pages, page_size, ops = args
    table, out = cls(num_pages, page_size), []
    for name, *op_args in ops:
        try:
            out.append(getattr(table, name)(*op_args))
        except ValueError as err:
            out.append(Refused(str(err)))
    return out


def _page_ops(rng: random.Random, num_pages: int, page_size: int) -> list[tuple]:
    names, live, ops = iter("abcdefghij"), {}, []
    for _ in range(rng.randint(8, 14)):
        r = rng.random()
        if not live or r < 0.2:
            seq = next(names, None)
            if seq is None:
                continue
            n = rng.randint(1, 3 * page_size)
            ops.append(("add", seq, n))
            live[seq] = n
        elif r < 0.4:
            parent, child = rng.choice(sorted(live)), next(names, None)
            if child is None:
                continue
            ops.append(("fork", parent, child))
            live[child] = live[parent]
        elif r < 0.7:
            seq = rng.choice(sorted(live))
            n = rng.randint(1, page_size + 1)
            ops.append(("append", seq, n))
            live[seq] += n
        elif r < 0.9:
            seq = rng.choice(sorted(live))
            ops.append(("locate", seq, rng.randint(0, live[seq])))  # live[seq] itself: not yet written
        else:
            seq = rng.choice(sorted(live))
            ops.append(("release", seq))
            del live[seq]
    return ops


def _page_cases(rng: random.Random) -> list[Case]:
    cases = []
    for _ in range(6):
        num_pages, page_size = rng.randint(6, 14), rng.choice([2, 3, 4])
        ops = _page_ops(rng, num_pages, page_size)
        cases.append(Case((num_pages, page_size, ops),
                          f"{num_pages} pages of {page_size} slots, {len(ops)} operations"))
    return cases


def compare_page_results(got, want) -> str | None:
    if isinstance(got, Refused):
        return f"expected a result per operation, got {shown(got)}"
    if not isinstance(got, list) or len(got) != len(want):
        return f"expected {len(want)} results (one per operation), got {shown(got)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if isinstance(w, Refused) or isinstance(g, Refused):
            same = isinstance(w, Refused) and isinstance(g, Refused)
        else:
            try:
                same = [tuple(x) if isinstance(x, list | tuple) else x for x in g] == \
                    [tuple(x) if isinstance(x, list | tuple) else x for x in w] if isinstance(w, list) else \
                    (tuple(g) == tuple(w) if isinstance(w, tuple) else g == w)
            except TypeError:
                same = False
        if not same:
            return f"operation {i + 1}: expected {shown(w)}, got {shown(g)}"
    return None


PAGES = Exercise(
    id="e-page-table", title="(e) A page table: allocate, locate, fork with copy-on-write", tier="core",
    entry="paged-attention", lab="serving", name="PageTable",
    skeleton='''from collections import deque

class PageTable:
    """Pages of `page_size` token slots for sequences, taken from one free list.

    Take pages from the front of the free list; a page nobody holds any more goes to its back. Sequences
    that fork share pages (count the holders of each page); the first write into a shared, partly filled
    last page moves the writer onto a fresh copy. Raise ValueError, changing nothing, for too few free
    pages, an unknown or existing sequence, or a position not written yet.
    """

    def __init__(self, num_pages, page_size):
        raise NotImplementedError

    def add(self, seq, n_tokens):          # -> the new sequence's page table (a list of page numbers)
        raise NotImplementedError

    def append(self, seq, n_tokens):       # -> the copies to make first, a list of (src, dst) pages
        raise NotImplementedError

    def fork(self, parent, child):         # -> the child's page table
        raise NotImplementedError

    def locate(self, seq, position):       # -> (page, offset) where that position's keys and values are
        raise NotImplementedError

    def release(self, seq):                # -> how many pages became free
        raise NotImplementedError
''',
    hints=("Keep, per page, how many sequences hold it; per sequence, its list of pages and its length.",
           "A fork copies the list of pages, not the pages: each page gets one more holder.",
           "Before appending, is the last page partly filled and held by someone else too? Then the writer needs a "
           "fresh page with a copy of it, and the old page loses one holder."),
    reference=PageTable, cases=_page_cases, compare=compare_page_results, run=drive,
    mistakes=(Mistake("fork-copies", _ForkCopies,
                      note="your fork gave the child fresh pages: a fork shares every page (one more holder each) "
                           "and copies nothing until a write into a shared, partly filled page"),
              Mistake("no-copy-on-write", _NoCopyOnWrite,
                      note="you appended into a page another sequence still holds: its tokens would change under "
                           "it; copy a shared, partly filled last page first (copy-on-write)")))


# (f) int8 per-token quantization with scales, and the bytes ----------------------------------------------

def quantize_int8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Codes [T, K, H] int8 and float32 scales [T, K] (x ≈ codes · scale per token and head), and their bytes."""
    x = np.asarray(x, np.float32)
    scale = np.max(np.abs(x), axis=-1) / np.float32(127.0)
    safe = np.where(scale > 0, scale, np.float32(1.0))[..., None]
    codes = np.round(np.clip(x / safe, -127.0, 127.0)).astype(np.int8)
    return codes, scale.astype(np.float32), codes.nbytes + scale.astype(np.float32).nbytes


def _no_scale_bytes(x):
    codes, scale, _ = quantize_int8(x)
    return codes, scale, codes.nbytes


def _per_tensor(x):
    x = np.asarray(x, np.float32)
    scale = np.full(x.shape[:-1], np.max(np.abs(x)) / 127.0, np.float32)
    codes = np.round(x / np.where(scale > 0, scale, 1.0)[..., None]).astype(np.int8)
    return codes, scale, codes.nbytes + scale.nbytes


def _truncates(x):
    codes, scale, nbytes = quantize_int8(x)
    x = np.asarray(x, np.float32)
    safe = np.where(scale > 0, scale, 1.0)[..., None]
    return np.trunc(np.clip(x / safe, -127, 127)).astype(np.int8), scale, nbytes


def _quant_cases(rng: random.Random) -> list[Case]:
    cases = []
    for i in range(5):
        T, K, H = rng.randint(1, 5), rng.randint(1, 3), rng.choice([4, 8, 16])
        g = np.random.default_rng(rng.randrange(2**32))
        x = (g.standard_normal((T, K, H)) * g.uniform(0.1, 8.0, (T, K, 1))).astype(np.float32)
        if i == 4:
            x[0, 0] = 0.0  # an all-zero vector keeps scale 0 and codes 0
        cases.append(Case((x,), f"x of shape {x.shape}"))
    return cases


QUANT = Exercise(
    id="f-int8-scales", title="(f) int8 per-token quantization with scales, and the bytes", tier="core",
    entry="kv-cache-quantization", lab="memory-savers", name="quantize_int8",
    skeleton='''import numpy as np

def quantize_int8(x):
    """x: float32 [T, K, H] (tokens, KV heads, head size), one tensor of keys or values.

    Returns (codes, scales, nbytes): int8 codes [T, K, H] and float32 scales [T, K] with x ≈ codes * scale,
    one scale per token and head so that its largest magnitude becomes 127 (a zero vector keeps scale 0);
    nbytes, the bytes the cache stores for this tensor.
    """
    raise NotImplementedError
''',
    hints=("The scale of a (token, head) row is its largest magnitude divided by 127.",
           "Divide, clip to [-127, 127] and round to the nearest integer (NumPy rounds halves to even) before "
           "the cast to int8.",
           "What does the cache store besides the codes, and how many bytes is each of those?"),
    reference=quantize_int8, cases=_quant_cases,
    compare=compare_fields(("codes", "scales", "nbytes"),
                           (_ints, lambda g, w, n: compare_array(g, w, n, rtol=1e-6), compare_value)),
    mistakes=(Mistake("no-scale-bytes", _no_scale_bytes, "kv-cache-quantization", 2),
              Mistake("per-tensor-scale", _per_tensor,
                      note="you used one scale for the whole tensor: each token and head gets its own, so a loud "
                           "head does not spend the code range of a quiet one"),
              Mistake("truncates", _truncates,
                      note="you cut the fractions off (a cast truncates towards zero): round to the nearest code")))


# (g) Prefix caching: chained page names and the longest cached prefix -------------------------------------

def page_name(parent: bytes, tokens) -> bytes:
    """The name of a full page: SHA-256 over its parent page's name (b'' for the first) and its token ids."""
    return hashlib.sha256(parent + np.asarray(tokens, np.int64).tobytes()).digest()


def _names(tokens, page_size, chained=True):
    out = []
    for m in range(len(tokens) // page_size):
        parent = out[-1] if out and chained else b""
        out.append(page_name(parent, tokens[m * page_size:(m + 1) * page_size]))
    return out


def prefix_hits(earlier: list[list[int]], prompt: list[int], page_size: int) -> tuple[list[bytes], int]:
    """The names of the prompt's full pages, and how many of its tokens the cache of `earlier` prompts holds."""
    cached = {name for tokens in earlier for name in _names(tokens, page_size)}
    names = _names(prompt, page_size)
    hits = 0
    while hits < len(names) and names[hits] in cached:
        hits += 1
    return names, hits * page_size


def _unchained(earlier, prompt, page_size):
    cached = {name for tokens in earlier for name in _names(tokens, page_size, chained=False)}
    names = _names(prompt, page_size, chained=False)
    hits = 0
    while hits < len(names) and names[hits] in cached:
        hits += 1
    return names, hits * page_size


def _unchained_every_hit(earlier, prompt, page_size):
    cached = {name for tokens in earlier for name in _names(tokens, page_size, chained=False)}
    names = _names(prompt, page_size, chained=False)
    return names, sum(n in cached for n in names) * page_size


def _prefix_cases(rng: random.Random) -> list[Case]:
    cases = []
    for i in range(6):
        ps = rng.choice([2, 3, 4])
        pages = [[rng.randint(1, 50) for _ in range(ps)] for _ in range(5)]
        a = pages[0] + pages[1] + pages[2]
        b = pages[3] + pages[1] + pages[4]
        earlier = [a, b]
        if i % 3 == 0:  # the same page after another first page: a different prefix
            prompt = pages[0] + pages[3] + pages[4]
        elif i % 3 == 1:
            prompt = pages[0] + pages[1] + pages[4] + pages[2][: rng.randint(0, ps - 1)]
        else:
            prompt = [rng.randint(51, 60)] * ps + pages[1] + pages[2]
        cases.append(Case((earlier, prompt, ps), f"page_size={ps}, earlier prompts of {len(a)} and {len(b)} tokens, "
                                                 f"a prompt of {len(prompt)}"))
    return cases


def _names_compare(got, want, name):
    if not isinstance(got, list | tuple) or len(got) != len(want):
        return f"{name}: expected {len(want)} page names, got {shown(got)}"
    for m, (g, w) in enumerate(zip(got, want, strict=True)):
        if g != w:
            return f"{name}[{m}]: expected {shown(w)}, got {shown(g)}"
    return None


PREFIX = Exercise(
    id="g-prefix-hashes", title="(g) Prefix caching: chained page names and the longest cached prefix", tier="core",
    entry="prefix-caching", lab="serving", name="prefix_hits",
    skeleton='''from widgets.exercises import page_name   # page_name(parent_name, tokens) -> bytes (SHA-256)

def prefix_hits(earlier, prompt, page_size):
    """earlier: token lists whose full pages are in the cache; prompt: a new token list.

    Returns (names, hit_tokens): the names of the prompt's full pages, named as the cache names them, and
    how many of the prompt's tokens the cache already holds (from its start).
    """
    raise NotImplementedError
''',
    hints=("Only full pages are named: a prompt of n tokens has n // page_size of them.",
           "A page's keys and values depend on every token before it, not only on its own tokens: what must its "
           "name include besides them?",
           "The cached prefix ends at the first page whose name the cache does not hold."),
    reference=prefix_hits, cases=_prefix_cases,
    compare=compare_fields(("names", "hit_tokens"), (_names_compare, compare_value)),
    mistakes=(Mistake("unchained", _unchained, "prefix-caching", 1),
              Mistake("unchained-every-hit", _unchained_every_hit, "prefix-caching", 1)))


# (h) H2O eviction under a budget -----------------------------------------------------------------------

def h2o_step(pos: np.ndarray, score: np.ndarray, weights: np.ndarray, new_pos: int,
             budget: int) -> tuple[np.ndarray, np.ndarray]:
    """One decode step of H2O: the kept positions and their accumulated scores after token `new_pos` arrives.

    Candidates are the `budget` kept slots and the new token; each adds this step's attention weight to its
    score; the latest budget // 2 positions always stay, the rest go by score (ties: the older token stays),
    and the kept slots stay in the order they were written."""
    cand_pos = np.append(np.asarray(pos, np.int64), new_pos)
    cand_score = np.append(np.asarray(score, np.float32), np.float32(0)) + np.asarray(weights, np.float32)
    recent = cand_pos >= new_pos + 1 - budget // 2
    priority = np.where(recent, np.inf, cand_score)
    picked = np.sort(np.argsort(-priority, kind="stable")[:budget])
    return cand_pos[picked], cand_score[picked]


def _score_only(pos, score, weights, new_pos, budget):
    cand_pos = np.append(np.asarray(pos, np.int64), new_pos)
    cand_score = np.append(np.asarray(score, np.float32), np.float32(0)) + np.asarray(weights, np.float32)
    picked = np.sort(np.argsort(-cand_score, kind="stable")[:budget])
    return cand_pos[picked], cand_score[picked]


def _no_accumulate(pos, score, weights, new_pos, budget):
    return h2o_step(pos, np.zeros_like(np.asarray(score, np.float32)), weights, new_pos, budget)


def _oldest_out(pos, score, weights, new_pos, budget):
    cand_pos = np.append(np.asarray(pos, np.int64), new_pos)
    cand_score = np.append(np.asarray(score, np.float32), np.float32(0)) + np.asarray(weights, np.float32)
    return cand_pos[1:], cand_score[1:]


def _h2o_cases(rng: random.Random) -> list[Case]:
    cases = []
    for _ in range(6):
        budget = rng.randint(4, 10)
        recent = budget // 2
        new_pos = rng.randint(budget + 2, 40)
        older = sorted(rng.sample(range(new_pos - recent), budget - recent))
        pos = np.array(older + list(range(new_pos - recent, new_pos)), np.int64)
        g = np.random.default_rng(rng.randrange(2**32))
        score = g.uniform(0.0, 3.0, budget).astype(np.float32)
        score[-recent:] *= 0.05  # recent tokens have had little time to gather attention
        w = g.dirichlet(np.ones(budget + 1)).astype(np.float32)
        cases.append(Case((pos, score, w, new_pos, budget), f"budget={budget}, new token at {new_pos}, kept "
                                                             f"{pos.tolist()}"))
    return cases


H2O = Exercise(
    id="h-h2o-eviction", title="(h) H2O eviction under a budget", tier="core",
    entry="kv-cache-eviction", lab="memory-savers", name="h2o_step",
    skeleton='''import numpy as np

def h2o_step(pos, score, weights, new_pos, budget):
    """One decode step of H2O with a full cache of `budget` slots.

    pos, score: the position each slot holds (in the order written) and its accumulated attention;
    weights: this step's attention to those slots and, last, to the new token at `new_pos`.
    Returns (pos, score) of the `budget` slots kept: the latest budget // 2 positions always stay, the
    others go by accumulated score (on a tie the older token stays); keep the written order.
    """
    raise NotImplementedError
''',
    hints=("The candidates are the kept slots plus the new token, whose score starts at zero.",
           "Add this step's weights to the candidates' scores before choosing.",
           "Which candidates may never leave, whatever their score? Choose among the rest by score."),
    reference=h2o_step, cases=_h2o_cases,
    compare=compare_fields(("pos", "score"), (_ints, lambda g, w, n: compare_array(g, w, n, rtol=1e-5, atol=1e-7))),
    mistakes=(Mistake("evicts-recent", _score_only, "kv-cache-eviction", 1),
              Mistake("no-accumulation", _no_accumulate,
                      note="you ranked by this step's attention alone: H2O ranks by the attention a token has "
                           "gathered over all steps so far (the accumulated score)"),
              Mistake("oldest-out", _oldest_out,
                      note="you evicted the oldest token, a sliding window: H2O keeps the heavy hitters, the older "
                           "tokens with the most accumulated attention")))


# Challenge: KIVI's per-channel key quantization ---------------------------------------------------------

def kivi_key_group(k: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One group of G keys [G, H]: b-bit codes [G, H] and float16 (scale, zero) per channel [H], x ≈ c·s + z."""
    k = np.asarray(k, np.float32)
    lo, hi = k.min(axis=0), k.max(axis=0)
    scale = ((hi - lo) / np.float32(2**bits - 1)).astype(np.float16)
    zero = lo.astype(np.float16)
    s, z = scale.astype(np.float32), zero.astype(np.float32)
    codes = np.clip(np.round((k - z) / np.where(s > 0, s, np.float32(1.0))), 0, 2**bits - 1)
    return codes.astype(np.int64), scale, zero


def _per_token_keys(k, bits):
    codes, scale, zero = kivi_key_group(np.asarray(k).T, bits)
    return codes.T, scale, zero


def _kivi_cases(rng: random.Random) -> list[Case]:
    cases = []
    for _ in range(5):
        G, H, bits = rng.choice([4, 8]), rng.choice([4, 8]), rng.choice([2, 4])
        g = np.random.default_rng(rng.randrange(2**32))
        k = g.standard_normal((G, H)).astype(np.float32)
        k[:, g.integers(H)] *= 20.0  # an outlier channel, as KIVI found in keys
        cases.append(Case((k, bits), f"k of shape {k.shape}, bits={bits}"))
    return cases


KIVI = Exercise(
    id="challenge-kivi-keys", title="Challenge: KIVI's per-channel key quantization", tier="challenge",
    entry="kv-cache-quantization", lab="memory-savers", name="kivi_key_group",
    skeleton='''import numpy as np

def kivi_key_group(k, bits):
    """k: float32 [G, H], one group of G consecutive tokens' keys of one head.

    Returns (codes, scale, zero): integer codes [G, H] in [0, 2**bits - 1] and float16 scale and zero of
    shape [H] such that k ≈ codes * scale + zero. Compute the codes with the float16 scale and zero you
    return, so dequantizing reverses exactly that rounding.
    """
    raise NotImplementedError
''',
    hints=("Asymmetric: zero is the smallest value, scale spreads [min, max] over 2**bits - 1 steps.",
           "Keys have outlier channels: one (scale, zero) per channel, over the group's tokens.",
           "A channel whose values are all equal has scale 0: divide by 1 there."),
    reference=kivi_key_group, cases=_kivi_cases,
    compare=compare_fields(("codes", "scale", "zero"),
                           (_ints, lambda g, w, n: compare_array(g, w.astype(np.float32), n, rtol=1e-3),
                            lambda g, w, n: compare_array(g, w.astype(np.float32), n, rtol=1e-3))),
    mistakes=(Mistake("per-token-keys", _per_token_keys,
                      note="you gave each token its own scale: KIVI quantizes keys per channel (a few channels "
                           "carry the outliers) and values per token"),))


# Challenge: one iteration of a chunked-prefill scheduler -------------------------------------------------

def plan_iteration(running: list[tuple[int, int]], waiting: list[tuple[int, int]], budget: int,
                   max_seqs: int) -> list[tuple[int, int]]:
    """What each request feeds in one iteration: running ones first (oldest first), each its pending tokens cut
    to what is left of the budget; then waiting ones in arrival order while seats and budget last."""
    plan, left = [], budget
    for rid, pending in running:
        if left <= 0:
            break
        n = min(pending, left)
        plan.append((rid, n))
        left -= n
    seats = max_seqs - len(running)
    for rid, prompt in waiting:
        if left <= 0 or seats <= 0:
            break
        n = min(prompt, left)
        plan.append((rid, n))
        left, seats = left - n, seats - 1
    return plan


def _prompts_first(running, waiting, budget, max_seqs):
    order = plan_iteration([], waiting, budget, max_seqs - len(running))
    left = budget - sum(n for _, n in order)
    for rid, pending in running:
        if left <= 0:
            break
        order.append((rid, min(pending, left)))
        left -= min(pending, left)
    return order


def _whole_prompts(running, waiting, budget, max_seqs):
    plan = plan_iteration(running, [], budget, max_seqs)
    left, seats = budget - sum(n for _, n in plan), max_seqs - len(running)
    for rid, prompt in waiting:
        if prompt > left or seats <= 0:
            break
        plan.append((rid, prompt))
        left, seats = left - prompt, seats - 1
    return plan


def _plan_cases(rng: random.Random) -> list[Case]:
    cases = []
    for _ in range(6):
        rid = iter(range(100))
        running = [(next(rid), 1 if rng.random() < 0.7 else rng.randint(2, 40)) for _ in range(rng.randint(0, 4))]
        waiting = [(next(rid), rng.randint(5, 60)) for _ in range(rng.randint(1, 4))]
        budget, max_seqs = rng.randint(8, 64), rng.randint(len(running) + 1, len(running) + 4)
        cases.append(Case((running, waiting, budget, max_seqs),
                          f"running={running}, waiting={waiting}, budget={budget}, max_seqs={max_seqs}"))
    return cases


def _plan_compare(got, want):
    try:
        got = [tuple(int(x) for x in item) for item in got]
    except (TypeError, ValueError):
        return f"expected a list of (request, tokens), got {shown(got)}"
    for i, w in enumerate(want):
        if i >= len(got):
            return f"feed {i + 1}: expected {w}, got nothing"
        if got[i] != w:
            return f"feed {i + 1}: expected {w}, got {got[i]}"
    if len(got) > len(want):
        return f"feed {len(want) + 1}: expected nothing, got {got[len(want)]}"
    return None


SCHEDULER = Exercise(
    id="challenge-chunked-prefill", title="Challenge: a chunked-prefill scheduler under a token budget",
    tier="challenge", entry="chunked-prefill", lab="serving", name="plan_iteration",
    skeleton='''def plan_iteration(running, waiting, budget, max_seqs):
    """One iteration's plan under a budget of `budget` tokens.

    running: [(request id, tokens it has not fed yet)] in admission order (a decode has 1);
    waiting: [(request id, prompt tokens)] in arrival order; at most `max_seqs` requests run at once.
    Returns [(request id, tokens it feeds now)], in the order they are scheduled.
    """
    raise NotImplementedError
''',
    hints=("Running requests come first, in admission order: decodes never wait behind a long prompt.",
           "A prompt longer than what is left of the budget feeds a chunk now and the rest in later iterations.",
           "Waiting requests join in arrival order while a seat and budget are left; none overtakes another."),
    reference=plan_iteration, cases=_plan_cases, compare=_plan_compare,
    mistakes=(Mistake("prompts-first", _prompts_first,
                      note="you fed the waiting prompts before the running requests: the decodes then wait behind "
                           "a prefill, the stall chunked prefill removes (Sarathi-Serve)"),
              Mistake("whole-prompts", _whole_prompts,
                      note="you admitted a prompt only when all of it fits: chunked prefill feeds what the budget "
                           "allows now and the rest later")))

MODEL_FREE = (HYBRID, RING, PAGES, QUANT, PREFIX, H2O, KIVI, SCHEDULER)
