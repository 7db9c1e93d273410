"""The serving engine: every request's greedy tokens equal dantinox.generate of that request alone, under
random arrivals, preemption (recompute and swap), prefix hits (partial and 100 %), chunk sizes 1, 7 and 64 and
speculation on or off; the allocator's invariants hold after every iteration and every page comes back."""

from pathlib import Path

import numpy as np
import pytest
from flax import nnx

import dantinox
from dantinox.cache.page_pool import PagePool, PoolError, page_digest
from dantinox.engine import Engine
from dantinox.engine.speculation import lookup_drafts
from widgets.engine_view import EngineRun, steps_html, tables_html

RUNS = Path(__file__).resolve().parent.parent / "runs"
PS = 4


@pytest.fixture(scope="module")
def model():
    return dantinox.Transformer(dantinox.ModelConfig.preset("test"), rngs=nnx.Rngs(0))


def shared_prompt_trace(seed: int, n: int = 8, vocab: int = 256):
    """Requests sharing a 12-token system prompt; the last two arrive with the first still running: a repeat
    of its prompt (a 100 % hit) and the system prompt's first two pages alone (a hit of all but the last token)."""
    rng = np.random.RandomState(seed)
    system = rng.randint(0, vocab, 12).tolist()
    prompts = [system + rng.randint(0, vocab, rng.randint(1, 10)).tolist() for _ in range(n - 2)]
    prompts += [list(prompts[0]), system[:PS * 2]]
    news = rng.randint(4, 16, n).tolist()
    news[0] = 15
    arrivals = [0] + np.sort(rng.randint(0, 10, n - 3)).tolist() + [1, 2]
    return prompts, news, arrivals


def alone(model, prompts, news):
    """The reference: each prompt decoded alone (a ragged generate, whose rows equal their prompts alone)."""
    out = dantinox.generate(model, [list(p) for p in prompts], max(news))
    return [list(np.asarray(row)[len(p):len(p) + n]) for row, p, n in zip(out, prompts, news, strict=True)]


def serve(model, prompts, news, arrivals, **kw):
    engine = Engine(model, num_pages=PAGES, page_size=PS, max_seqs=4, fixed_shapes=True, **kw)
    rids = [engine.add(p, n, arrival_step=a) for p, n, a in zip(prompts, news, arrivals, strict=True)]
    reports = []
    while not engine.finished:
        reports.append(engine.step())
    out = engine.outputs()
    assert engine.pool.num_free == engine.pool.num_pages and not any(engine.pool.refs)  # every page came back
    return [out[r] for r in rids], engine, reports


# One pool size for every case: the pool's shape is part of each compiled program's signature.
PAGES = 16
CASES = {
    "chunk64-prefix": dict(chunk_tokens=64),
    "chunk1-prefix": dict(chunk_tokens=1),
    "chunk7-recompute": dict(chunk_tokens=7),
    "chunk7-swap-speculate": dict(chunk_tokens=7, preempt="swap", speculate=3),
    "chunk64-speculate-no-prefix": dict(chunk_tokens=64, speculate=3, prefix_caching=False),
    "static-whole-prompts": dict(chunk_tokens=None, batching="static"),
}


@pytest.fixture(scope="module")
def trace(model):
    prompts, news, arrivals = shared_prompt_trace(seed=1)
    return prompts, news, arrivals, alone(model, prompts, news)


@pytest.mark.both_backends
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_every_request_equals_generate_alone(model, trace, case):
    prompts, news, arrivals, want = trace
    got, engine, reports = serve(model, prompts, news, arrivals, **CASES[case])
    assert got == want
    stats = engine.stats()
    kw = CASES[case]
    first_hit = {rep.hits[r] for rep in reports for r in rep.hits if engine.requests[r].preemptions == 0}
    if kw.get("prefix_caching", True):
        assert stats["pages_saved"] > 0 and first_hit
        repeat = len(prompts) - 2
        if engine.requests[repeat].preemptions == 0:  # all but the last token hit
            assert engine.requests[repeat].hit_tokens == (len(prompts[repeat]) - 1) // PS * PS
        if engine.requests[repeat + 1].preemptions == 0:  # 8 tokens: one page hits, the second one's last token
            assert engine.requests[repeat + 1].hit_tokens == PS  # is computed, so that page is computed again
    if kw["chunk_tokens"] in (7, 64):  # (one token per iteration runs one request; a static batch fits)
        assert stats["preemptions"] > 0
    assert (stats["swaps_out"] > 0) == (kw.get("preempt") == "swap")
    if kw.get("speculate"):
        assert stats["accepted"] > 0 and any(r.kind == "verify" for rep in reports for r in rep.rows)
    if kw.get("chunk_tokens"):
        assert all(rep.fed <= kw["chunk_tokens"] for rep in reports)
    if kw.get("batching") == "static":  # a batch forms only when the one before has finished, and holds many
        assert all(not rep.admitted or not before.tables for before, rep in zip(reports[:-1], reports[1:], strict=True))
        assert max(len(rep.admitted) for rep in reports) > 1
    assert stats["compiled_shapes"] <= 2


def test_chunks_share_iterations_with_decodes(model):
    prompts, news, arrivals = [list(range(1, 40)), list(range(50, 54))], [12, 12], [4, 0]
    _, _, reports = serve(model, prompts, news, arrivals, chunk_tokens=7)
    kinds = [{r.kind for r in rep.rows} for rep in reports]
    assert any({"prefill", "decode"} <= k for k in kinds)  # the long prompt's chunks run beside a decode
    assert max(r.tokens for rep in reports for r in rep.rows if r.kind == "prefill") <= 7


def test_report_shows_shared_prefix_pages_and_freed_ones_are_reused(model):
    system = list(range(10, 22))  # three full pages
    prompts = [system + [1, 2], system + [3], system + [4]]
    _, engine, reports = serve(model, prompts, [6, 6, 3], [0, 1, 20], chunk_tokens=64)
    second = reports[1]
    assert second.hits == {1: 12}
    assert set(second.tables[0][:3]) == set(second.tables[1][:3]) <= second.shared
    assert reports[19].free == PAGES and reports[19].cached_free >= 3  # all freed, the prefix still cached
    assert reports[20].hits == {2: 12}  # a request after both finished reuses the freed cached pages
    view = EngineRun(engine, tuple(reports), tuple(prompts), engine.outputs(), {}, engine.stats())
    assert "prefill 1 hit 12" in steps_html(view)  # 13 tokens: 12 found, the last one computed
    assert tables_html(view, 1).count("#ffe082") == 1 + 6  # the legend, and 3 shared pages in each of 2 tables


def test_sliding_window_run_with_prefix_hits_speculation_and_preemption():
    """Ring layers: a prefix hit past the window gets the rings as they were at its boundary, and a verify's
    rejected drafts overwrite slots still inside the window, which must be restored. One pool that holds the
    trace (hits of 100 %); one that preempts by swap, without prefix caching, whose rings hold W slots only
    (with prefix caching they hold chunk_tokens more, and a rejected draft overwrites none a later query sees)."""
    _, model = dantinox.load_run(RUNS / "tiny-swa16-1to1")  # window 16, every other layer
    system = b"the cat sat on the mat. "  # 24 tokens: six pages of 4, past the window
    text = [system + b"the cat sat on the ", system + b"one two one two ", system + b"the cat sat on the ",
            system[:18] + b"abc abd abc abd", b"hello hello hello "]
    prompts = [list(t) for t in text]
    news, arrivals = [20, 16, 12, 14, 10], [0, 0, 30, 32, 3]
    want = alone(model, prompts, news)
    for num_pages, preempt, prefix in ((24, "recompute", True), (20, "swap", False)):
        engine = Engine(model, num_pages=num_pages, page_size=PS, chunk_tokens=5, speculate=4, max_seqs=4,
                        preempt=preempt, prefix_caching=prefix, fixed_shapes=True)  # chunks <= a verify: 1 program
        rids = [engine.add(p, n, arrival_step=a) for p, n, a in zip(prompts, news, arrivals, strict=True)]
        hits = {}
        while not engine.finished:
            for rid, found in engine.step().hits.items():
                hits.setdefault(rid, found)  # at first admission (a recomputed request is looked up again)
        out = engine.outputs()
        assert [out[r] for r in rids] == want
        stats = engine.stats()
        assert 0 < stats["accepted"] < stats["drafts"] and stats["compiled_shapes"] == 1
        if prefix:
            assert (hits[0], hits[1], hits[3], hits[4]) == (0, 24, 16, 0)  # shared pages up to where prompts part
            assert hits[2] == (len(prompts[2]) - 1) // PS * PS and stats["preemptions"] == 0  # a repeated prompt
        else:
            assert stats["swaps_out"] > 0 and not any(hits.values())


def test_seeded_sampling_equals_seeded_generate_alone():
    """Temperature and top-k per request: the engine draws each token from the request's own generator, as
    `generate` does for it alone, through prefix hits, preemption and verified drafts (a draft is kept when
    it is the token drawn there)."""
    _, model = dantinox.load_run(RUNS / "tiny")
    prompts = [list(b"the cat sat on the mat. the cat ")] * 3 + [list(b"one two three one two three one ")]
    seeds, temps, new = [1, 2, 1, 3], [0.7, 0.7, 0.7, 0.4], 16  # prompts of one length: generate compiles once
    want = [list(np.asarray(dantinox.generate(model, [p], new, temperature=t, top_k=20, seed=s))[0, len(p):])
            for p, t, s in zip(prompts, temps, seeds, strict=True)]
    engine = Engine(model, num_pages=13, page_size=PS, chunk_tokens=4, speculate=3, max_seqs=4,
                    fixed_shapes=True)  # chunks no longer than a verify, every row sampling: one program
    rids = [engine.add(p, new, arrival_step=i, temperature=t, top_k=20, seed=s)
            for i, (p, t, s) in enumerate(zip(prompts, temps, seeds, strict=True))]
    out = engine.run()
    assert [out[r] for r in rids] == want
    assert want[0] == want[2] != want[1]  # the same seed draws the same text, another seed another
    stats = engine.stats()
    assert stats["pages_saved"] > 0 and stats["preemptions"] > 0 and stats["accepted"] > 0
    assert stats["compiled_shapes"] == 1


def test_pool_refuses_double_free_and_evicts_least_recently_freed():
    pool = PagePool(3)
    a, b = pool.take(), pool.take()
    pool.register(a, page_digest(b"", [1, 2]))
    pool.register(b, page_digest(b"", [3, 4]))
    pool.release(a)
    pool.release(b)
    with pytest.raises(PoolError, match="double free of page 0"):
        pool.release(a)
    assert pool.lookup(page_digest(b"", [1, 2])) == a
    assert pool.take() == 2  # never-used page first, then the least recently freed cached one
    assert pool.take() == a and pool.lookup(page_digest(b"", [1, 2])) is None and pool.evicted == 1
    pool.check([[2], [a]])
    with pytest.raises(PoolError, match="page 0 has 1 reference"):
        pool.check([[2]])  # a page nobody holds but still counted: lost


def test_prompt_lookup_drafts():
    assert lookup_drafts([5, 6, 7, 8, 5, 6], 3) == [7, 8, 5]
    assert lookup_drafts([1, 2, 3], 2) == []
    assert lookup_drafts([1, 2, 1], 0) == []


def test_bad_requests_get_one_line(model):
    engine = Engine(model, num_pages=2, page_size=PS)
    with pytest.raises(ValueError, match="num_pages: this request needs up to 3 pages of 4 tokens, the pool has 2"):
        engine.add(list(range(8)), 4)
    with pytest.raises(ValueError, match="max_len=64"):
        engine.add(list(range(60)), 10)
    with pytest.raises(ValueError, match=r"prompt_ids: token ids must lie in \[0, 259\)"):
        engine.add([300], 1)
    with pytest.raises(ValueError, match="temperature: expected a number >= 0, got -1"):
        engine.add([1], 1, temperature=-1)
    with pytest.raises(ValueError, match=r"top_k: expected None or an integer in \[1, 259\], got 300"):
        engine.add([1], 1, temperature=1.0, top_k=300)


def test_bucketed_shapes_give_the_same_tokens(model, trace):
    """The default path: calls rounded up to a few batch sizes, table widths and chunk lengths."""
    prompts, news, arrivals, want = trace
    engine = Engine(model, num_pages=PAGES, page_size=PS, max_seqs=2, chunk_tokens=64)
    rids = [engine.add(prompts[i], news[i]) for i in (0, 1)]
    out = engine.run()
    assert [out[r] for r in rids] == want[:2]
    assert {s[0] for s in engine.shapes} == {1, 2} and len({s[2] for s in engine.shapes}) > 1  # (B, T, M, P, ..)
