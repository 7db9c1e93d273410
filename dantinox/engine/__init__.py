"""A serving engine you can read: continuous batching of a real model over one paged KV-cache pool.

    engine = dantinox.Engine(model, num_pages=64, page_size=16, prefix_caching=True, chunk_tokens=64)
    rid = engine.add(prompt_ids, max_new_tokens=32, arrival_step=0)
    report = engine.step()          # one iteration: what was scheduled, emitted, hit, preempted
    outputs = engine.run()          # {rid: generated token ids}

Each `step()` is one iteration over the running set (iteration-level batching, Orca, OSDI '22): every
running request feeds the tokens it has not yet cached (a prompt chunk, or the one token it sampled last),
new requests join when the pool and the token budget allow, finished ones leave and free their pages.
The feeds of one iteration run as a ragged batch ([B, T] ids, a fill per row, one page table) through the
model's own paged layout, in one compiled program per shape bucket (B, T and the table width M are
rounded up to a few sizes, so a long trace compiles a handful of programs).

The four techniques, each proven exact by tests/test_engine.py (every request's tokens equal
`dantinox.generate` of that request alone, greedy or seeded sampling):
  memory        a pool of `num_pages` pages (`PagePool`: free list in LRU order, reference counts). When a
                running request needs a page and none is free, the most recently admitted request is
                preempted: its pages are freed and it is recomputed later from its tokens, or (preempt="swap")
                its pages are copied to host memory and copied back when it resumes (vLLM, arXiv:2309.06180
                §4.5). No request is lost; one that could never fit is refused when it is added.
  prefix cache  a full page is named by a hash chained over its parent's hash and its tokens (vLLM's
                automatic prefix caching, docs `design/prefix_caching`); a new request takes the cached pages
                of its longest cached prefix and starts computing after them. Freed pages keep their hash and
                are reused in least-recently-freed order until the space is needed. A prompt that hits in full
                still computes its last token: its logits give the first output token.
  chunked fill  at most `chunk_tokens` tokens are fed per iteration, decodes first, so a long prompt is
                prefilled in chunks that share iterations with decodes (Sarathi-Serve, arXiv:2403.02310).
  speculation   prompt-lookup drafts (speculation.py), verified by one forward; the longest agreed prefix is
                kept plus the model's own next token. Rejected tokens are rolled back: paged slots
                past the fill are never read, and a sliding-window ring's slots that the rejected tokens
                overwrote are restored from a copy taken before the write.

Sliding-window (ring) layers keep one ring per running request (a "seat"), beside the pool. Their prefix is
cached by copying the ring, not by sharing pages (ring_prefixes.py). A seat holds `reach` (the most tokens one
iteration feeds a request: chunk_tokens) slots beyond its window, so at the end of every iteration each page
boundary it crossed is still covered by its ring.

The engine is three parts, along vLLM v1's and nano-vllm's seams, and `Engine` (engine.py), which wires them:
  scheduler.py   Scheduler: the token budget, admission, preemption order, static or continuous batching,
                 chunking and how many drafts a decode adds; plain Python, tests/test_scheduler.py drives it
                 with a fake runner
  kv_manager.py  KVManager: the layers' arrays, the page pool (dantinox/cache/page_pool.py), page tables and
                 ring seats, prefix hashes and hits, ring copies (ring_prefixes.py), swapping
  runner.py      Runner: the compiled ragged iteration, sampling, draft acceptance
  records.py     Request (with its RequestState), Row and StepReport: the plain data the three pass around
"""

from dantinox.engine.engine import Engine
from dantinox.engine.records import Request, RequestState, Row, StepReport

__all__ = ["Engine", "Request", "RequestState", "Row", "StepReport"]
