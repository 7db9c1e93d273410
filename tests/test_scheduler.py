"""The engine's scheduler alone: a fake runner (each feed advances its request; a feed that reaches the end of a
request's tokens emits one, drafts all rejected) and the real page allocator without arrays. No model, no JAX.

Each test pins one rule of dantinox/engine/scheduler.py so that breaking the rule fails it: the token budget,
decodes before prompt chunks, admission in arrival order with no overtaking, the most recently admitted request
preempted first, static batching waiting for the whole batch, max_seqs, and drafts cut to the budget."""

import ast
from pathlib import Path

from dantinox.cache.page_pool import PagePool, pages_for
from dantinox.engine.records import Request, RequestState
from dantinox.engine.scheduler import Scheduler

ROOT = Path(__file__).resolve().parents[1]


class PagesOnly:
    """The KV manager's page accounting (the engine's own allocator), without arrays or a prefix cache."""

    def __init__(self, num_pages: int, page_size: int):
        self.pool, self.page_size = PagePool(num_pages), page_size

    def allocate(self, req, upto):
        need = pages_for(upto, self.page_size) - len(req.pages)
        if need > self.pool.num_free:
            return False
        req.pages += [self.pool.take() for _ in range(max(0, need))]
        return True

    def cached(self, req):
        return 0, []

    def admit(self, req, cached, n):
        return pages_for(n, self.page_size) <= self.pool.num_free and self.allocate(req, n)

    def preempt(self, req):  # recompute: its tokens are fed again from the start
        req.computed = 0
        self.release(req)

    def register(self, req):
        pass

    def release(self, req):
        for page in req.pages:
            self.pool.release(page)
        req.pages = []


def request(rid, prompt, new, arrival=0):
    prompt = list(prompt) if not isinstance(prompt, int) else list(range(1, prompt + 1))
    return Request(rid, prompt, new, arrival, frozenset(), list(prompt))


def step(scheduler):
    """One iteration with a fake runner; returns the plan. The emitted token repeats the request's tokens with
    period 3, so prompt lookup finds drafts; every draft is rejected."""
    plan = scheduler.schedule()
    for req, n, drafts in plan.feeds:
        real = n - len(drafts)
        if real < len(req.tokens) - req.computed:  # a prompt chunk short of the end
            req.computed += n
        else:
            req.computed += real
            req.tokens.append(req.tokens[-3] if len(req.tokens) >= 3 else 0)
    scheduler.finish()
    scheduler.kv.pool.check([r.pages for r in scheduler.running])
    return plan


def serve(scheduler, requests, max_steps=100):
    for req in requests:
        scheduler.add(req)
    plans = []
    while not scheduler.finished:
        assert len(plans) < max_steps
        plans.append(step(scheduler))
    assert scheduler.kv.pool.num_free == scheduler.kv.pool.num_pages  # every page came back
    return plans


def first_admitted(plans):
    return {rid: i for i, plan in reversed(list(enumerate(plans))) for rid in plan.admitted}


def test_budget_holds_and_a_long_prompt_is_chunked_after_the_decodes():
    scheduler = Scheduler(PagesOnly(64, 4), max_seqs=4, chunk_tokens=8)
    plans = serve(scheduler, [request(0, 3, 10), request(1, 20, 2, arrival=1)])
    assert all(plan.fed <= 8 for plan in plans)
    chunks = [n for plan in plans for req, n, _ in plan.feeds if req.rid == 1]
    assert chunks == [7, 7, 6, 1]  # 20 prompt tokens in what the decode leaves of 8, then its own decode
    assert all([(req.rid, n) for req, n, _ in plan.feeds][0] == (0, 1) for plan in plans[1:5])  # decodes first
    assert [plan.fed for plan in plans[:4]] == [3, 8, 8, 7]  # chunks fill the budget the decode leaves


def test_no_budget_feeds_whole_prompts():
    scheduler = Scheduler(PagesOnly(64, 4), max_seqs=4, chunk_tokens=None)
    plans = serve(scheduler, [request(0, 30, 2), request(1, 25, 2)])
    assert [(req.rid, n) for req, n, _ in plans[0].feeds] == [(0, 30), (1, 25)]


def test_admission_in_arrival_order_and_no_request_overtakes_one_that_does_not_fit():
    scheduler = Scheduler(PagesOnly(5, 4), max_seqs=4, chunk_tokens=None)
    big, second, small = request(0, 12, 4), request(1, 12, 2), request(2, 2, 2)
    plans = serve(scheduler, [big, second, small])
    assert plans[0].admitted == [0]  # 3 of 5 pages taken: the second (3 pages) waits, the small one behind it too
    assert first_admitted(plans) == {0: 0, 1: 4, 2: 4}
    assert plans[4].admitted == [1, 2]  # both once the first has finished (4 new tokens: iterations 0-3)


def test_the_most_recently_admitted_request_is_preempted_and_nothing_joins_in_that_iteration():
    scheduler = Scheduler(PagesOnly(4, 2), max_seqs=3, chunk_tokens=3)
    older, newer = request(0, 2, 6), request(1, 2, 6)
    for req in (older, newer):
        scheduler.add(req)
    plans = [step(scheduler) for _ in range(3)]
    assert not any(plan.preempted for plan in plans) and scheduler.kv.pool.num_free == 0
    plan = scheduler.schedule()  # the older one asks for a third page first: the newer one gives its 2 pages up
    assert plan.preempted == [1] and [(req.rid, n) for req, n, _ in plan.feeds] == [(0, 1)]
    assert newer.state is RequestState.WAITING and scheduler.waiting == [newer] and newer.preemptions == 1
    assert older.state is RequestState.RUNNING and len(older.pages) == 3 and newer.pages == [] and newer.computed == 0
    # a page is free and 2 tokens of budget are left, enough to start recomputing it, but not in this iteration
    assert scheduler.kv.pool.num_free == 1 and plan.fed == 1 and plan.admitted == []


def test_the_newest_request_preempts_itself_when_it_is_the_one_short_of_a_page():
    scheduler = Scheduler(PagesOnly(4, 2), max_seqs=3, chunk_tokens=2)
    older, newer = request(0, 2, 6), request(1, 2, 6, arrival=1)
    for req in (older, newer):
        scheduler.add(req)
    plans = [step(scheduler) for _ in range(3)]
    assert not any(plan.preempted for plan in plans) and len(older.pages) == 2 and len(newer.pages) == 1
    plan = scheduler.schedule()  # the older one takes the last page; the newer one then needs one: itself
    assert plan.preempted == [1] and [(req.rid, n) for req, n, _ in plan.feeds] == [(0, 1)]
    assert older.preemptions == 0 and len(older.pages) == 3 and scheduler.waiting == [newer]


def test_static_batching_waits_until_the_whole_batch_has_finished():
    def trace():
        return [request(0, 3, 3), request(1, 3, 5), request(2, 3, 2, arrival=1)]

    static = serve(Scheduler(PagesOnly(64, 4), max_seqs=4, chunk_tokens=None, batching="static"), trace())
    assert static[0].admitted == [0, 1]
    assert first_admitted(static)[2] == 5  # the batch's last request emits its 5th token in iteration 4
    continuous = serve(Scheduler(PagesOnly(64, 4), max_seqs=4, chunk_tokens=None), trace())
    assert first_admitted(continuous)[2] == 1  # the same trace, continuous: it joins when it arrives


def test_at_most_max_seqs_run_at_once():
    scheduler = Scheduler(PagesOnly(64, 4), max_seqs=2, chunk_tokens=None)
    plans = serve(scheduler, [request(0, 3, 2), request(1, 3, 4), request(2, 3, 2)])
    assert plans[0].admitted == [0, 1] and first_admitted(plans)[2] == 2  # after request 0's 2 tokens
    assert all(len(plan.feeds) <= 2 for plan in plans)


def test_drafts_fit_the_budget_and_the_tokens_left():
    scheduler = Scheduler(PagesOnly(64, 4), max_seqs=2, chunk_tokens=3, speculate=4)
    periodic = request(0, [1, 2, 3, 1, 2], 5)  # the fake runner continues the period: lookup finds drafts
    plans = serve(scheduler, [periodic])
    feeds = [(n, len(drafts)) for plan in plans for _, n, drafts in plan.feeds]
    assert feeds[:2] == [(3, 0), (2, 0)]  # the prompt in chunks of 3
    assert feeds[2] == (3, 2)  # a decode + min(speculate 4, budget 3 - 1, 5 - 1 - 1 tokens left after it) drafts
    assert feeds[4:] == [(2, 1), (1, 0)]  # 1 token left after the decode: 1 draft; the last token: none


def load_time_imports(body):
    """Module names a module body imports when it is loaded (function bodies and TYPE_CHECKING blocks do not run)."""
    for node in body:
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
        elif isinstance(node, ast.If) and not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
            yield from load_time_imports(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from load_time_imports(node.body + node.orelse + node.finalbody)


def test_the_scheduler_imports_no_jax():
    """Plain Python: nothing the scheduler's module loads, directly or through dantinox modules, is JAX or Flax."""
    seen, todo, found = set(), ["dantinox.engine.scheduler"], set()
    while todo:
        name = todo.pop()
        path = ROOT / (name.replace(".", "/") + ".py")
        if name in seen or not path.exists():
            continue
        seen.add(name)
        names = list(load_time_imports(ast.parse(path.read_text()).body))
        found.update(n.split(".")[0] for n in names)
        todo += [n for n in names if n.startswith("dantinox.")]
    assert {"dantinox.engine.records", "dantinox.engine.speculation"} <= seen
    assert not found & {"jax", "jaxlib", "flax", "optax"}
