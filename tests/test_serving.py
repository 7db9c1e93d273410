"""The serving simulator: traces are seeded and documented, bytes add up, every policy serves every token."""

import numpy as np
import pytest

import dantinox
from dantinox.engine.simulator import CHAT_MEANS, TraceRequest, make_trace, serve

CFG = dantinox.ModelConfig.preset("tiny")  # 4 layers, 4 KV heads of 32, f32: 4 KiB per cached token
TOKEN = dantinox.kv_cache_bytes(CFG, tokens=1)
POLICIES = [("static", "max"), ("contiguous", "max"), ("contiguous", "pow2"), ("contiguous", "oracle"),
            ("paged", "max")]


def test_traces_are_seeded_and_follow_their_distribution():
    a, b = make_trace(50, 0.5, "sharegpt", 256, seed=1), make_trace(50, 0.5, "sharegpt", 256, seed=1)
    assert a == b and a != make_trace(50, 0.5, "sharegpt", 256, seed=2)
    big = make_trace(4000, 2.0, "sharegpt", 2048, seed=0)  # the paper's own maximum length: no scaling
    prompt, output = (np.mean([getattr(r, f) for r in big]) for f in ("prompt", "output"))
    assert abs(prompt / CHAT_MEANS["sharegpt"][0] - 1) < 0.1  # output is cut a little more at 2048 tokens
    assert 0.8 < output / CHAT_MEANS["sharegpt"][1] < 1.05
    assert abs(len(big) / big[-1].arrival / 2.0 - 1) < 0.1  # Poisson arrivals at 2 requests per step
    for name in ("uniform", "sharegpt", "alpaca"):
        assert all(r.prompt >= 1 and r.output >= 1 and r.prompt + r.output <= 256
                   for r in make_trace(300, 1.0, name, 256, seed=3))


@pytest.mark.parametrize("policy,reservation", POLICIES)
def test_every_token_is_served_within_the_budget(policy, reservation):
    trace = make_trace(60, 0.5, "uniform", CFG.max_context, seed=4)
    budget = 3 << 20
    r = serve(trace, policy, budget, CFG, page_size=8, n=2, reservation=reservation)
    assert r.token_bytes == TOKEN
    assert r.tokens.sum() == 2 * sum(q.output for q in trace)
    held = r.token_states + r.reserved + r.internal
    assert held.max() <= budget and (r.external + held <= budget).all()
    assert (r.first_token >= r.arrival).all() and (r.finish >= r.first_token).all()
    assert abs(sum(r.shares().values()) - 1) < 1e-12


def test_reservation_and_fragmentation_where_each_policy_has_them():
    trace = make_trace(60, 0.5, "sharegpt", CFG.max_context, seed=5)
    oracle = serve(trace, "contiguous", 2 << 20, CFG, reservation="oracle")
    assert not oracle.internal.any() and oracle.reserved.any()  # exact regions: nothing past the final length
    paged = serve(trace, "paged", 2 << 20, CFG, page_size=16)
    assert not paged.reserved.any() and not paged.external.any()
    assert (paged.internal < 16 * TOKEN * np.maximum(paged.running, 1)).all()  # at most a page tail per sequence
    maxed = serve(trace, "contiguous", 2 << 20, CFG, reservation="max")
    assert paged.utilisation > 0.8 > 0.4 > maxed.utilisation  # the shape of the paper's Fig. 2
    assert paged.running.max() > maxed.running.max() and paged.steps < maxed.steps


def test_parallel_samples_share_the_prompt_pages():
    trace = (TraceRequest(0, 0, prompt=40, output=10),)
    paged = serve(trace, "paged", 1 << 20, CFG, page_size=16, n=4)
    # 32 prompt tokens in two full pages, stored once; the 8-token tail is copied per sample, + 1 new token each
    assert paged.token_states[0] == (32 + 4 * (8 + 1)) * TOKEN
    assert paged.internal[0] == (2 + 4) * 16 * TOKEN - paged.token_states[0]
    oracle = serve(trace, "contiguous", 1 << 20, CFG, n=4, reservation="oracle")
    assert oracle.token_states[0] == 4 * (40 + 1) * TOKEN


@pytest.mark.parametrize("policy", ["static", "contiguous", "paged"])
def test_max_running_caps_every_policy(policy):
    """An engine's batch limit, for the simulator to replay the engine's schedule."""
    trace = make_trace(30, 2.0, "alpaca", CFG.max_context, seed=7)
    free, capped = (serve(trace, policy, 4 << 20, CFG, reservation="oracle", max_running=m) for m in (None, 3))
    assert free.running.max() > 3 == capped.running.max() and capped.tokens.sum() == free.tokens.sum()


def test_paged_preempts_and_recomputes_when_the_pool_runs_out():
    trace = make_trace(40, 2.0, "uniform", CFG.max_context, seed=6)
    r = serve(trace, "paged", 1 << 20, CFG, page_size=16)
    assert r.preemptions > 0 and r.recomputed_tokens > 0
    assert r.tokens.sum() == sum(q.output for q in trace)


def test_bad_arguments_are_named():
    trace = make_trace(5, 1.0, "uniform", 256)
    with pytest.raises(ValueError, match="policy: expected one of static, contiguous, paged, got 'vllm'"):
        serve(trace, "vllm", 1 << 20, CFG)
    with pytest.raises(ValueError, match=r"budget_bytes: request \d+ reserves 1 x 256 slots of 4096 B"):
        serve(trace, "static", 100_000, CFG)
    with pytest.raises(ValueError, match=r"budget_bytes: request \d+ needs \d+ pages of 16 tokens"):
        serve(trace, "paged", 10_000, CFG)
    with pytest.raises(ValueError, match="lengths: expected one of uniform, sharegpt, alpaca, got 'chat'"):
        make_trace(5, 1.0, "chat", 256)
    with pytest.raises(ValueError, match="rate: expected requests per step > 0, got 0"):
        make_trace(5, 0, "uniform", 256)


def test_serving_lab_renders_the_measured_waste_bar_and_refuses_bad_values():
    from widgets.serving_lab import ServingLab, page_table_html

    lab = ServingLab(n_requests=40, budget_mib=4)
    lab.update(page_size=8, n=2)
    r = lab.reading
    assert lab.error == "" and r.page_size == 8 and r.n == 2 and r.budget_bytes == 4 << 20
    shares = {label: res.shares() for label, res in r.results.items()}
    bars = {bar.name: dict(zip(bar.x, bar.y, strict=True)) for bar in lab.bars.data}
    for label, share in shares.items():
        assert abs(sum(bars[cat][label] for cat in bars) - 100) < 1e-9
        assert bars["token states"][label] == 100 * share["token states"]
    assert shares["paged + continuous"]["token states"] > shares["static batching, max reservation"]["token states"]
    assert lab.formula_params() == {"T": round(r.mean_length), "P": 8}
    lab.update(page_size=16)
    lab.update(page_size=8, n=2)  # back to a setting already run: served from the cache
    assert lab.reading.seconds == 0 and lab.reading.results is r.results
    with pytest.raises(ValueError, match="page_size: expected one of 1, 8, 16, 32, 64 .*, got 4"):
        lab.update(page_size=4)
    assert not lab.page_size.type("4") and "expected one of 1, 8, 16, 32, 64" in lab.page_size.message
    assert lab.page_size.type("32") and lab.reading.page_size == 32  # typing is taken (it was ignored)
    assert lab.rate.type("0.45") and lab.reading.rate == 0.45  # off the 0.1 grid, used as typed
    lab.update(budget_mib=2, page_size=64, lengths="uniform", n=4)
    assert lab.error.startswith("KV memory budget (2 MiB) too small: ") and "budget_bytes" not in lab.error
    html = page_table_html({(0, 0): [3, 5], (0, 1): [3, 7]}, {3}, 16)
    assert html.count("background:#ffe082") == 3  # the legend and page 3 in both rows


def test_the_copy_on_write_demo_has_a_partly_filled_page_to_copy():
    """labs/serving.ipynb's prompt was exactly 3 pages: it printed 'copies made: []' under text about the copy."""
    import json
    import re
    from pathlib import Path

    from flax import nnx

    from dantinox.architectures import tokenizer
    from dantinox.generation import forking

    cells = json.loads((Path(__file__).parents[1] / "labs" / "serving.ipynb").read_text())["cells"]
    source = next("".join(c["source"]) for c in cells if "forking.sample_n(" in "".join(c["source"]))
    text = re.search(r'prompt = np\.array\(\[tokenizer\.encode\("([^"]+)"\)\]', source).group(1)
    page = int(re.search(r"page_size=(\d+)", source).group(1))
    assert len(tokenizer.encode(text)) % page, "the demo prompt must end inside a page, or nothing is copied"
    assert "len(run.copies)" in source  # the notebook checks the copies itself
    model = dantinox.Transformer(dantinox.ModelConfig.preset("test"), rngs=nnx.Rngs(0))
    for length, copies in ((10, 2), (16, 0)):  # a partly filled last page is copied by all but the last sample
        ids = np.arange(1, length + 1, dtype=np.int32)[None]
        run = forking.sample_n(model, ids, n=3, max_new_tokens=4, page_size=8, temperature=1.0, seed=0)
        assert len(run.copies) == copies
