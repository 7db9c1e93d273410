"""The classroom service behind a real JupyterHub and its proxy: identity, access, delivery, load, kill -9.

Every request below goes through the hub's proxy (the public URL) with a token the hub API issued, unless
a test says it talks to the service directly. Users, the instructors group and tokens are made through the
hub's REST API. Generated attempts, not real learners.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from classroom_hub import SERVICE, Hub, http, login_form, make_attempt, run_load, wait_until

from classroom.client import BackgroundDelivery, Delivery, deliver_pending
from classroom.jupyterhub_config import classroom_roles
from classroom.store import AnswerStore, Attempt


@pytest.fixture(scope="module")
def hub():
    h = Hub()
    try:
        h.start()
        h.add_users("alice", "bob", "carol", "olga", "teacher", "boss")
        h.add_to_group("instructors", "teacher")
        h.admin("PATCH", "/users/boss", {"admin": True})
        h.tokens = {name: h.token_for(name) for name in ("alice", "bob", "carol", "olga", "teacher", "boss")}
        yield h
    finally:
        h.stop()


def stored(h: Hub) -> list[tuple]:
    """(learner, key) of every row in the service's file, as the service exports them (it holds the file)."""
    return [(a["learner"], a["key"]) for a in h.records()]


def post(h: Hub, who: str, body, url: str | None = None):
    return http("POST", (url or h.service_url) + "/api/attempts", h.tokens[who], body)


def get_json(h: Hub, who: str | None, path: str):
    status, body, _ = http("GET", h.service_url + path, h.tokens.get(who) if who else None)
    return status, json.loads(body) if body else None


def test_attempts_recorded_under_the_hub_identity_through_the_proxy(hub, tmp_path):
    store = AnswerStore(tmp_path / "alice.sqlite")  # alice's kernel: attempts go to the outbox first
    for i in range(3):
        store.add(Attempt.from_json(make_attempt("alice", i)), outbox=True)
    result = deliver_pending(store, url=hub.service_url, token=hub.tokens["alice"])
    assert (result.delivered, result.pending, result.error) == (3, 0, None)
    assert post(hub, "bob", [make_attempt("bob", 0), make_attempt("bob", 1)])[0] == 200
    status, mine = get_json(hub, "alice", "/api/attempts/mine")
    assert status == 200 and {a["key"] for a in mine} == {a.key for a in store.attempts()}
    status, everyone = get_json(hub, "teacher", "/api/attempts?learner=bob")
    assert status == 200 and len(everyone) == 2 and {a["learner"] for a in everyone} == {"bob"}


def test_a_learner_reads_and_writes_only_their_own_records(hub):
    assert post(hub, "bob", make_attempt("bob", 7))[0] == 200
    status, mine = get_json(hub, "alice", "/api/attempts/mine")
    assert status == 200 and all(a["learner"] == "alice" for a in mine)
    assert get_json(hub, "alice", "/api/attempts")[0] == 403
    assert get_json(hub, "alice", "/api/attempts?learner=bob")[0] == 403
    assert get_json(hub, "alice", "/api/summary")[0] == 403
    status, body, _ = post(hub, "alice", make_attempt("bob", 8))  # a typed name is not an identity
    assert status == 403 and b"attempts[0].learner: expected 'alice'" in body


def test_only_instructors_and_admins_open_the_dashboard(hub):
    assert http("GET", hub.service_url + "/", hub.tokens["alice"])[0] == 403
    for who in ("teacher", "boss"):  # the instructors group, a hub admin
        status, body, headers = http("GET", hub.service_url + "/", hub.tokens[who])
        assert status == 200 and b"Classroom dashboard" in body
        assert headers["X-Frame-Options"] == "DENY" and "frame-ancestors 'none'" in headers["Content-Security-Policy"]
        # content reaches the page only through textContent: no HTML-parsing sink exists to escape for
        assert not any(sink in body for sink in (b"innerHTML", b"outerHTML", b"insertAdjacentHTML", b"document.write"))


def browser_login(h: Hub, name: str, password: str | None = None):
    """A browser session: log in to the hub with the class (or given) password, then open the dashboard."""
    session, login = login_form(h, name, password or h.class_password)
    assert login.status_code == 302, login.text[:300]
    return session, session.get(h.service_url + "/", timeout=30)  # hub OAuth redirects, then the page


def test_the_class_password_never_logs_in_an_instructor_or_an_admin(hub):
    hub.add_users("late-teacher")
    hub.add_to_group("instructors", "late-teacher")  # made an instructor after the hub started, on the admin page
    for who in ("teacher", "boss", "late-teacher"):
        session, login = login_form(hub, who, hub.class_password)
        assert login.status_code == 403  # the login page again, no session
        page = session.get(hub.service_url + "/", timeout=30)  # ends on the hub's login page
        assert "Classroom dashboard" not in page.text and "/hub/login" in page.url
        assert "learner" not in session.get(hub.service_url + "/api/attempts?format=csv", timeout=30).text
    assert login_form(hub, "alice", hub.instructor_password)[1].status_code == 403  # not a learner's password
    assert login_form(hub, "new-learner", hub.class_password)[1].status_code == 302
    _, page = browser_login(hub, "late-teacher", hub.instructor_password)
    assert page.status_code == 200 and "Classroom dashboard" in page.text


def test_the_dashboard_in_a_browser_goes_through_hub_oauth(hub):
    import re

    session, page = browser_login(hub, "teacher", hub.instructor_password)
    assert page.status_code == 200 and "Classroom dashboard" in page.text
    xsrf = re.search(r'<meta name="xsrf" content="([^"]+)">', page.text).group(1)
    fetch = {"Sec-Fetch-Mode": "cors", "Sec-Fetch-Site": "same-origin"}  # what the page's fetch() sends
    summary = session.get(hub.service_url + "/api/summary", headers={**fetch, "X-XSRFToken": xsrf}, timeout=30)
    assert summary.status_code == 200 and "questions" in summary.json()
    forged = session.get(hub.service_url + "/api/summary", headers=fetch, timeout=30)  # no token: not the page
    assert forged.status_code in (401, 403)
    assert browser_login(hub, "alice")[1].status_code == 403  # logged in, not an instructor


def test_unauthenticated_and_unscoped_requests_never_reach_data(hub):
    assert http("GET", hub.service_url + "/api/attempts")[0] == 401
    assert http("POST", hub.service_url + "/api/attempts", None, make_attempt("alice", 0))[0] == 401
    status, body, _ = http("GET", hub.service_url + "/api/attempts", "not-a-hub-token")
    assert status == 401 and b"key" not in body
    status, _, headers = http("GET", hub.service_url + "/", follow=False)  # a browser is sent to the hub login
    assert status == 302 and headers["Location"].startswith(hub.url + "/hub/api/oauth2/authorize")  # the hub origin
    narrow = hub.token_for("carol", scopes=["read:users:name!user"])  # a valid token without the access scope
    assert http("GET", hub.service_url + "/api/attempts/mine", narrow)[0] == 403
    status, body, _ = http("GET", hub.service_url + "/api/attempts", hub.admin_token)  # a service, not a user
    assert status == 403 and b"only hub users" in body


def test_bad_bodies_get_one_line_errors(hub):
    status, body, _ = http("POST", hub.service_url + "/api/attempts", hub.tokens["alice"], None)
    assert status == 400 and json.loads(body)["error"].startswith("body: expected JSON")
    bad = {k: v for k, v in make_attempt("alice", 0).items() if k != "correct"}
    status, body, _ = post(hub, "alice", [make_attempt("alice", 1), bad])
    assert status == 400 and json.loads(body)["error"] == "attempts[1]: attempt: missing field(s) correct"
    status, body, _ = http("GET", hub.service_url + "/api/attempts?format=xml", hub.tokens["teacher"])
    assert status == 400 and "format: expected json or csv" in json.loads(body)["error"]


def test_the_service_grades_numbers_and_words_every_attempt_itself(hub):
    import content

    entry = content.load_entry("kv-cache")
    c = next(i for i, ch in enumerate(entry.checks) if ch.kind == "choice")
    check = entry.checks[c]
    wrong = check.options[(check.answer + 1) % len(check.options)]
    hub.add_users("eve")
    hub.tokens["eve"] = hub.token_for("eve")
    lie = {"correct": True, "expected": wrong, "question": "what eve wants the dashboard to say"}
    first = {**make_attempt("eve", 0), "check_index": c, "response": wrong, **lie}
    assert post(hub, "eve", first)[0] == 200
    backdated = {**make_attempt("eve", 0), "check_index": c, "response": check.options[check.answer],
                 "attempt": 1, "time": 1.0, "correct": False}  # an earlier "first try", right this time
    assert post(hub, "eve", backdated)[0] == 200
    rows = {a["key"]: a for a in get_json(hub, "teacher", "/api/attempts?learner=eve")[1]}
    got, late = rows[first["key"]], rows[backdated["key"]]
    assert (got["correct"], got["attempt"], got["question"], got["expected"]) == \
        (False, 1, check.question, check.options[check.answer])  # graded from the entry, not from the body
    assert (late["correct"], late["attempt"]) == (True, 2) and late["time"] >= got["time"] > 1.0  # by arrival
    assert got["content_version"] == content.content_version("kv-cache")
    eve = next(r for r in get_json(hub, "teacher", "/api/summary")[1]["learners"] if r["learner"] == "eve")
    assert eve["first_try_right"] == 0  # the back-dated right answer did not become her first try
    value = content.check_answer(entry, 0, {"T": 1024.0})
    numeric = {**make_attempt("eve", 0), "check_index": 0, "params": {"T": 1024.0}, "response": f"{value:,.4f}"}
    assert post(hub, "eve", numeric)[0] == 200
    assert get_json(hub, "eve", "/api/attempts/mine")[1][-1]["correct"] is True


def test_unknown_entries_checks_and_params_are_refused_whole(hub):
    before = len(stored(hub))
    cases = [({"entry_id": "made-up-entry"}, "attempts[1].entry_id: expected an entry or exercise of this course"),
             ({"check_index": 99}, "attempts[1].check_index: expected 0 to"),
             ({"check_index": 0, "params": {"T": 1e300}}, "attempts[1].params.T: expected"),
             ({"check_index": 0, "params": {"tokens": 1.0}}, "attempts[1].params: expected some of"),
             ({"check_index": 0, "response": "six"}, "attempts[1].answer: expected a number in MiB"),
             ({"check_index": 2, "response": "an option nobody wrote"}, "attempts[1].response: expected one of"),
             ({"check_index": 2 ** 63}, "attempts[1].check_index: expected 0 to")]
    for change, message in cases:
        status, body, _ = post(hub, "alice", [make_attempt("alice", 0), {**make_attempt("alice", 0), **change}])
        assert status == 400 and json.loads(body)["error"].startswith(message), (change, body)
    deep = "[" * 100_000 + "]" * 100_000
    for raw in (deep.encode(), b'{"key": "\\ud800"}'):
        req = urllib.request.Request(hub.service_url + "/api/attempts", data=raw, method="POST",
                                     headers={"Authorization": f"token {hub.tokens['alice']}"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=30)
        assert err.value.code == 400
    status, body, _ = http("POST", hub.service_url + "/api/attempts", hub.tokens["alice"], ["x" * (5 << 20)])
    assert status == 413 and b"body: expected at most" in body
    assert len(stored(hub)) == before  # the valid first attempt of each batch was not kept behind the refusal
    taken = make_attempt("alice", 0)
    assert post(hub, "alice", taken)[0] == 200
    status, body, _ = post(hub, "bob", {**taken, "learner": "bob"})  # bob reuses alice's key
    assert status == 409 and "already stored for another learner" in json.loads(body)["error"]


def test_a_learner_flooding_the_service_is_rate_limited(hub):
    hub.add_users("mallory")
    hub.tokens["mallory"] = hub.token_for("mallory")
    statuses = [post(hub, "mallory", [make_attempt("mallory", i) for i in range(1000)])[0] for _ in range(4)]
    assert statuses[:3] == [200, 200, 200] and statuses[3] == 429
    assert post(hub, "alice", make_attempt("alice", 1))[0] == 200  # the others are not slowed down


def test_revoked_tokens_deleted_users_and_removed_instructors_stop_within_seconds(hub):
    hub.add_users("rita", "sam", "tina")
    hub.add_to_group("instructors", "tina")
    made = hub.admin("POST", "/users/rita/tokens", {"scopes": [f"access:services!service={SERVICE}"]})
    sam, tina = hub.token_for("sam"), hub.token_for("tina")
    for token, who in ((made["token"], "rita"), (sam, "sam")):
        assert http("POST", hub.service_url + "/api/attempts", token, make_attempt(who, 0))[0] == 200
    assert http("GET", hub.service_url + "/api/summary", tina)[0] == 200  # the service now holds all three
    hub.admin("DELETE", f"/users/rita/tokens/{made['id']}")
    hub.admin("DELETE", "/users/sam")
    hub.admin("DELETE", "/groups/instructors/users", {"users": ["tina"]})
    def post_as(token: str, who: str) -> int:
        return http("POST", hub.service_url + "/api/attempts", token, make_attempt(who, 0))[0]

    start, stopped = time.monotonic(), {}
    while len(stopped) < 3 and time.monotonic() - start < 20:
        checks = {"revoked token": lambda: post_as(made["token"], "rita"), "deleted user": lambda: post_as(sam, "sam"),
                  "removed instructor": lambda: http("GET", hub.service_url + "/api/summary", tina)[0]}
        for what, check in checks.items():
            if what not in stopped and check() in (401, 403):
                stopped[what] = time.monotonic() - start
        time.sleep(0.2)
    assert stopped.keys() == {"revoked token", "deleted user", "removed instructor"}, stopped
    assert stopped["revoked token"] < 5 and stopped["deleted user"] < 5  # TOKEN_CACHE_S is 3
    assert stopped["removed instructor"] < 8  # ROLE_CACHE_S is 5


def test_summary_and_exports_match_the_records(hub):
    assert post(hub, "alice", make_attempt("alice", 3))[0] == 200
    status, summary = get_json(hub, "teacher", "/api/summary")
    rows = stored(hub)
    assert status == 200 and summary["attempts"] == len(rows)
    for path in (hub.db, hub.db.with_name(hub.db.name + "-wal")):  # no other OS account reads the answers
        assert path.stat().st_mode & 0o777 == 0o600, path
    assert summary["learner_count"] == len({learner for learner, _ in rows})
    assert sum(q["attempts"] for q in summary["questions"]) + sum(x["checks"] for x in summary["exercises"]) == \
        len(rows)
    status, body, headers = http("GET", hub.service_url + "/api/attempts?format=csv", hub.tokens["teacher"])
    assert status == 200 and headers["Content-Type"].startswith("text/csv")
    assert len(body.decode().strip().splitlines()) == len(rows) + 1  # header + one line per attempt


def test_csv_exports_open_as_text_in_a_spreadsheet(hub):
    import csv
    import io

    hub.add_users("=1+1")  # a hub name is any text its authenticator allows
    token = hub.token_for("=1+1")
    for response in ("+6", "-6", "@6"[1:]):
        attempt = {**make_attempt("=1+1", 0), "check_index": 0, "response": response}
        assert http("POST", hub.service_url + "/api/attempts", token, attempt)[0] == 200
    for path in ("/api/attempts?format=csv", "/api/summary?format=csv"):
        status, body, headers = http("GET", hub.service_url + path, hub.tokens["teacher"])
        assert status == 200 and headers["X-Content-Type-Options"] == "nosniff"
        cells = [cell for row in csv.reader(io.StringIO(body.decode())) for cell in row]
        assert not [c for c in cells if c.startswith(("=", "+", "-", "@", "\t", "\r"))], path
    text = http("GET", hub.service_url + "/api/attempts?format=csv", hub.tokens["teacher"])[1].decode()
    assert "'=1+1" in text and "'+6" in text and "'-6" in text


def test_dashboard_counts_each_option_with_the_belief_it_embodies(hub):
    import content
    from classroom.summary import belief

    entry = content.load_entry("multi-head-latent-attention")  # generated attempts elsewhere are all kv-cache
    index, check = next((i, c) for i, c in enumerate(entry.checks) if c.kind == "choice")
    wrong = next(j for j in range(len(check.options)) if j != check.answer)
    for who, pick in (("alice", wrong), ("bob", wrong), ("carol", check.answer)):
        first = {**make_attempt(who, 0), "entry_id": entry.id, "check_index": index, "question": check.question,
                 "params": {}, "response": check.options[pick], "correct": pick == check.answer, "attempt": 1}
        assert post(hub, who, first)[0] == 200
    status, summary = get_json(hub, "teacher", "/api/summary")
    row = next(q for q in summary["questions"] if (q["entry"], q["check"]) == (entry.id, index))
    assert status == 200 and row["question"] == check.question and summary["content_error"] is None
    assert row["learners"] == 3 and row["first_try_right"] == 1
    chosen = row["options"][wrong]
    assert chosen["first_choice"] == 2 and chosen["belief"] == belief(entry, index, wrong) != ""
    assert row["options"][check.answer]["first_choice"] == 1 and row["options"][check.answer]["correct"]


def test_exercise_checks_are_recorded_as_the_kernels_claim_checked_against_the_catalogue(hub, tmp_path,
                                                                                          monkeypatch):
    from classroom.exercise_catalogue import CATALOGUE, VERSION
    from widgets.exercises import Verdict
    from widgets.exercises.record import ExerciseRecorder

    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", hub.tokens["carol"])  # carol's kernel, inside the class
    monkeypatch.setenv("DANTINOX_CLASSROOM_URL", hub.service_url)
    store = AnswerStore(tmp_path / "carol.sqlite")
    recorder, before = ExerciseRecorder(store, learner="carol"), time.time()
    recorder.record("d-ring-buffer", Verdict(False, "d-ring-buffer: case 2 of 8 (...)", "window-plus-one", 2), 11)
    recorder.record("d-ring-buffer", Verdict(True, "d-ring-buffer: all 8 cases agree", None, 8), 12)
    wait_until(lambda: store.pending() == [] and store.count() == 2, "the background sender delivered both")
    rows = get_json(hub, "teacher", "/api/attempts?entry_id=d-ring-buffer")[1]
    assert [(r["learner"], r["correct"], r["mistake"], r["attempt"], r["params"]["seed"]) for r in rows] == \
        [("carol", False, "window-plus-one", 1, 11), ("carol", True, None, 2, 12)]
    assert {(r["question"], r["content_version"]) for r in rows} == {(CATALOGUE["d-ring-buffer"].title, VERSION)}
    assert all(r["time"] >= before - 1 for r in rows)  # the service's clock
    claim = {**make_attempt("carol", 0), "entry_id": "d-ring-buffer", "check_index": 0, "params": {"seed": 3},
             "response": "passed", "correct": True, "time": 1.0, "attempt": 9}
    refusals = [({"mistake": "window-plus-one"}, "attempts[0].mistake: expected none for a check that passed"),
                ({"correct": False, "mistake": "keys-only"}, "attempts[0].mistake: expected none or one of "
                                                             "window-plus-one, slot-after-newest"),
                ({"params": {"seed": 3, "answer": 1}}, "attempts[0].params: expected only seed and cases"),
                ({"check_index": 1}, "attempts[0].check_index: expected 0 for an exercise"),
                ({"entry_id": "kv-cache", "check_index": 0, "response": "6", "correct": False,
                  "mistake": "keys-only"}, "attempts[0].mistake: expected null for a quiz answer")]
    for change, message in refusals:
        status, body, _ = post(hub, "carol", {**claim, **change})
        assert status == 400 and json.loads(body)["error"].startswith(message), (change, body)
    assert post(hub, "carol", claim)[0] == 200  # a pass is the kernel's word: kept, numbered and timed here
    late = get_json(hub, "carol", "/api/attempts/mine?entry_id=d-ring-buffer")[1][-1]
    assert (late["correct"], late["attempt"], late["time"] > 1.0) == (True, 3, True)
    ring = next(x for x in get_json(hub, "teacher", "/api/summary")[1]["exercises"] if x["exercise"] == "d-ring-buffer")
    assert (ring["passed_by"], ring["commonest_mistake"], ring["commonest_mistake_learners"]) == \
        (["carol"], "window-plus-one", 1)


def test_outbox_waits_for_a_restarted_service_and_counts_once(hub, tmp_path):
    store = AnswerStore(tmp_path / "olga.sqlite")
    hub.kill_service(signal.SIGTERM)
    for i in range(5):
        store.add(Attempt.from_json(make_attempt("olga", i)), outbox=True)
    down = deliver_pending(store, url=hub.service_url, token=hub.tokens["olga"], timeout=5)
    assert down.delivered == 0 and down.pending == 5 and "HTTP 50" in down.error  # the proxy answers for it
    sender = BackgroundDelivery(store, url=hub.service_url, token=hub.tokens["olga"], timeout=5, backoff=(0.2, 1))
    wait_until(lambda: sender.last is not None and sender.last.error, "a failed background round", 30)
    hub.start_service()  # no new answer: the background sender retries on its own
    assert sender.wait_idle(30) and store.pending() == []
    assert {k for learner, k in stored(hub) if learner == "olga"} == {a.key for a in store.attempts()}
    store.add(Attempt.from_json(make_attempt("olga", 9)), outbox=True)
    with sqlite3.connect(store.path) as db:  # as if the ack was lost: every attempt is sent again
        db.execute("UPDATE attempts SET delivered = 0")
    assert deliver_pending(store, url=hub.service_url, token=hub.tokens["olga"]) == Delivery(6, 0, None)
    olga = [key for learner, key in stored(hub) if learner == "olga"]
    assert sorted(olga) == sorted(a.key for a in store.attempts())  # six rows, none twice


def test_a_refused_attempt_does_not_hold_back_the_rest_of_the_outbox(hub, tmp_path):
    store = AnswerStore(tmp_path / "carol.sqlite")
    good = [Attempt.from_json(make_attempt("carol", i)) for i in range(4)]
    renamed = Attempt.from_json(make_attempt("carol-before-rename", 0))  # queued under her old hub name
    for a in (good[0], renamed, *good[1:]):
        store.add(a, outbox=True)
    result = deliver_pending(store, url=hub.service_url, token=hub.tokens["carol"])
    assert (result.delivered, result.pending, result.refused) == (4, 0, 1)
    assert "attempts[0].learner: expected 'carol'" in result.refusal
    assert [(a.key, why[:8]) for a, why in store.refused()] == [(renamed.key, "HTTP 403")]
    assert {a.key for a in good} <= {k for learner, k in stored(hub) if learner == "carol"}


def test_no_other_process_can_hold_the_service_database_lock(hub):
    # The service holds its file exclusively: another process can neither hold a write lock that would stall
    # the service's writes (and, before, freeze nothing but still delay answers) nor read around the service.
    outsider = sqlite3.connect(hub.db, timeout=0.2, isolation_level=None)
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            outsider.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            outsider.execute("SELECT COUNT(*) FROM attempts").fetchone()
    finally:
        outsider.close()
    start = time.monotonic()
    assert post(hub, "alice", make_attempt("alice", 2))[0] == 200
    for who, path in (("alice", "/api/me"), ("alice", "/api/attempts/mine"), ("teacher", "/api/summary"),
                      ("teacher", "/api/attempts?learner=bob")):
        assert get_json(hub, who, path)[0] == 200
    assert time.monotonic() - start < 5


@pytest.fixture(scope="module")
def class_of_50(hub):
    names = [f"learner{i:02d}" for i in range(50)]
    hub.add_users(*names)
    return {n: hub.token_for(n) for n in names}


def test_50_learners_x_100_attempts_through_the_proxy(hub, class_of_50):
    before = len(stored(hub))
    results = run_load(hub.service_url, class_of_50, 100)
    assert Counter(status for *_, status, _, _ in results) == {200: 5000}
    rows = stored(hub)
    sent = {key for _, key, *_ in results}
    assert len(rows) == before + 5000 and len({key for _, key in rows}) == len(rows)  # 0 lost, 0 duplicated
    assert sent <= {key for _, key in rows}
    assert "database is locked" not in hub.service_log_text()
    assert not any(b"locked" in body for *_, body in results)


def test_kill_9_mid_load_keeps_every_acknowledged_attempt(hub, class_of_50):
    killed = threading.Event()

    def kill_after(n):  # the service dies with requests in flight
        if n == 400 and not killed.is_set():
            killed.set()
            hub.kill_service(signal.SIGKILL)

    learners = dict(list(class_of_50.items())[:20])
    results = run_load(hub.service_url, learners, 50, on_ack=kill_after, timeout=10)
    assert killed.is_set()
    acked = {key for _, key, status, _, _ in results if status == 200}
    failed = [status for *_, status, _, _ in results if status != 200]
    assert len(acked) >= 400 and failed  # some landed before the kill, the rest were refused
    with contextlib.closing(sqlite3.connect(hub.db)) as db:  # the killed service's lock went with it
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    hub.start_service()
    keys = {key for _, key in stored(hub)}
    assert acked <= keys  # every acknowledged attempt survived kill -9
    wait_until(lambda: post(hub, "alice", make_attempt("alice", 50))[0] == 200, "service after restart", 30)


def test_roles_add_service_access_and_keep_the_hub_defaults():
    from jupyterhub.roles import get_default_roles

    defaults = {r["name"]: set(r["scopes"]) for r in get_default_roles()}
    roles = {r["name"]: r for r in classroom_roles("classroom")}
    for name in ("user", "server"):
        assert set(roles[name]["scopes"]) == defaults[name] | {"access:services!service=classroom"}
    assert roles["classroom-service"]["services"] == ["classroom"]


# A user server as the hub starts it (its own server-role token, the config's environment): standing in for a
# kernel, it records one attempt in its outbox and delivers it, as the quiz widget does, then becomes the real
# single-user JupyterLab server with the arguments the hub gave it.
KERNEL = """
import os, sys, time
from classroom.client import deliver_pending
from classroom.store import AnswerStore, Attempt
from classroom_hub import make_attempt
store = AnswerStore(os.path.join(os.environ["HOME"], "answers.sqlite"))
store.add(Attempt.from_json(make_attempt(os.environ["JUPYTERHUB_USER"], 0)), outbox=True)
while deliver_pending(store).pending:
    time.sleep(0.5)
server = os.path.join(os.path.dirname(sys.executable), "jupyterhub-singleuser")
os.execv(server, [server, *sys.argv[1:]])
"""


def test_the_shipped_config_on_a_real_hub_its_learners_server_and_a_kill_9_of_the_hub():
    import re
    import socket

    import psutil

    h = Hub(managed=True)  # the hub itself starts `dantinox classroom serve`
    h.extra_config = (f"c.JupyterHub.spawner_class = 'simple'\nc.Spawner.http_timeout = 120\n"
                      f"c.Spawner.cmd = [{sys.executable!r}, '-c', {KERNEL!r}]\n"
                      f"c.SimpleLocalProcessSpawner.home_dir_template = {str(h.dir / 'home' / '{username}')!r}\n")
    started = []
    try:
        h.start()
        h.add_users("dora")
        h.admin("POST", "/users/dora/server")  # the hub spawns dora's server with its own token
        wait_until(lambda: [learner for learner, _ in stored(h)] == ["dora"], "dora's attempt from her server", 90)
        wait_until(lambda: h.admin("GET", "/users/dora")["servers"][""]["ready"], "dora's JupyterLab", 120)
        token = h.token_for("dora", scopes=["access:servers!user=dora"])
        dora = "http://dora.localhost:" + str(h.port)  # her own origin
        assert http("GET", f"{dora}/user/dora/formgrader", token)[0] == 404  # nbgrader's server side is off
        status, page, _ = http("GET", f"{dora}/user/dora/lab", token)
        config = json.loads(re.search(rb'id="jupyter-config-data"[^>]*>(.*?)</script>', page, re.S).group(1))
        assert status == 200 and "@jupyter/nbgrader" in config["disabledExtensions"]  # menus, Validate
        assert "@jupyterlab/apputils-extension:announcements" in config["disabledExtensions"]  # no news toast

        started = psutil.Process(h.proc.pid).children()  # the proxy, the service, dora's server
        service = next(p for p in started if "classroom.service" in p.cmdline())
        h.proc.kill()  # kill -9 of the hub: its service must not stay behind holding the port and the database
        h.proc.wait(10)

        def gone() -> bool:
            try:
                return service.status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True

        wait_until(gone, "the service of a killed hub to exit", 10)
        with socket.socket() as s:  # the port is free for the next hub's service (bound as tornado binds)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", h.service_port))
    finally:
        for p in started:  # what the killed hub left running (its proxy, dora's server)
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        h.stop()


def test_learners_servers_start_without_nbgrader_and_instructors_keep_it():
    import os
    from types import SimpleNamespace

    from classroom.jupyterhub_config import LEARNER_JUPYTER_CONFIG, hide_nbgrader_from_learners

    shared = {"DANTINOX_CLASSROOM_URL": "u", "JUPYTER_CONFIG_PATH": "/site"}  # c.Spawner.environment, one dict

    def spawn(admin: bool = False, groups: tuple = ()):
        user = SimpleNamespace(admin=admin, groups=[SimpleNamespace(name=g) for g in groups])
        spawner = SimpleNamespace(user=user, environment=shared)
        hide_nbgrader_from_learners(spawner)
        return spawner.environment

    assert spawn(groups=("late-comers",))["JUPYTER_CONFIG_PATH"] == f"{LEARNER_JUPYTER_CONFIG}{os.pathsep}/site"
    assert spawn(groups=("instructors",)) is shared and spawn(admin=True) is shared  # formgrader stays theirs
    assert shared["JUPYTER_CONFIG_PATH"] == "/site"


def test_a_new_service_waits_for_its_port_while_an_earlier_one_lets_go():
    import socket

    from tornado import web

    from classroom import service

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    threading.Timer(0.3, held.close).start()  # the earlier service stops a moment later
    start = time.monotonic()
    service._listen(web.Application(), port, "127.0.0.1")
    assert 0.2 < time.monotonic() - start < service.BIND_WAIT_S


def test_serve_outside_a_hub_is_a_one_line_error(monkeypatch, capsys, tmp_path):
    from dantinox_labs.cli import main

    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    assert main(["classroom", "serve", "--db", str(tmp_path / "c.sqlite")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "$JUPYTERHUB_API_TOKEN is not set" in err


def test_serve_on_a_port_still_held_is_a_one_line_error(monkeypatch, capsys, tmp_path):
    import socket

    from classroom import service
    from dantinox_labs.cli import main

    monkeypatch.setattr(service, "BIND_WAIT_S", 0.3)  # it waits that long for a stopping service to let go

    h = Hub()  # not started: only its environment for a service
    for name, value in h.service_env().items():
        if name.startswith("JUPYTERHUB_"):
            monkeypatch.setenv(name, value)
    with socket.socket() as held:  # a stranger's process
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert main(["classroom", "serve", "--db", str(tmp_path / "c.sqlite"), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--port {port}: cannot listen" in err and "another process holds it" in err
    h.stop()


def test_delivery_without_a_reachable_service_keeps_the_outbox(monkeypatch, tmp_path):
    from classroom_hub import free_port

    store = AnswerStore(tmp_path / "solo.sqlite")
    store.add(Attempt.from_json(make_attempt("solo", 0)), outbox=True)
    monkeypatch.delenv("DANTINOX_CLASSROOM_URL", raising=False)
    assert deliver_pending(store, token="t").error.startswith("$DANTINOX_CLASSROOM_URL is not set")
    closed = f"http://127.0.0.1:{free_port()}/services/classroom"  # nothing listens there
    result = deliver_pending(store, url=closed, token="t", timeout=5)
    assert result.delivered == 0 and result.pending == 1 and "unreachable" in result.error


def test_the_config_file_reads_a_class_from_the_environment(monkeypatch, tmp_path):
    import os

    from classroom_hub import ROOT
    from traitlets.config.loader import PyFileConfigLoader

    from classroom.hub_auth import ClassroomPasswordAuthenticator

    def load():
        return PyFileConfigLoader("jupyterhub_config.py", path=str(ROOT / "classroom")).load_config()

    monkeypatch.setenv("DANTINOX_INSTRUCTORS", "ada, grace")
    monkeypatch.setenv("DANTINOX_HUB_AUTH", "shared")
    monkeypatch.setenv("DANTINOX_HUB_PASSWORD", "class-2026")
    monkeypatch.setenv("DANTINOX_HUB_INSTRUCTOR_PASSWORD", "i" * 32)
    monkeypatch.setenv("DANTINOX_CLASSROOM_PORT", "10202")
    monkeypatch.setenv("DANTINOX_CLASSROOM_DB", str(tmp_path / "class" / "classroom.sqlite"))
    c = load()
    assert c.JupyterHub.load_groups == {"instructors": {"users": ["ada", "grace"]}}
    assert c.JupyterHub.services[0]["command"][-6:] == ["-m", "classroom.service", "--port", "10202",
                                                        "--hub-pid", str(os.getpid())]  # the hub loads this file
    assert c.JupyterHub.authenticator_class is ClassroomPasswordAuthenticator
    assert c.ClassroomPasswordAuthenticator.instructor_users == {"ada", "grace"}
    assert c.SharedPasswordAuthenticator.admin_password == "i" * 32
    assert c.Spawner.environment["DANTINOX_CLASSROOM_URL"] == "http://classroom--service.localhost:8000/services/classroom"
    assert c.JupyterHub.subdomain_host == "http://localhost:8000"  # every user server in its own origin
    data = tmp_path / "class"  # the hub's own files beside the answers, in a folder only its account reads
    assert c.JupyterHub.db_url == f"sqlite:///{data / 'jupyterhub.sqlite'}" and data.stat().st_mode & 0o777 == 0o700
    assert c.JupyterHub.cookie_secret_file == str(data / "jupyterhub_cookie_secret")
    assert c.Spawner.http_timeout == 120
    assert c.ConfigurableHTTPProxy.command[-2:] == ["-m", "classroom.proxy"]  # room for a class's requests
    assert c.Spawner.pre_spawn_hook.__name__ == "hide_nbgrader_from_learners"  # the file's own copy of it
    # every server's JupyterLab: the environment's extensions but JupyterLite's (which fails on every page),
    # from a folder beside the private one that every account can read
    lab = tmp_path / "class-lab"
    assert c.Spawner.environment["JUPYTER_CONFIG_PATH"] == str(lab) and lab.stat().st_mode & 0o777 == 0o755
    server = json.loads((lab / "jupyter_server_config.json").read_text())
    assert server == {"LabApp": {"labextensions_path": [str(lab / "labextensions")]}}
    links = lab / "labextensions"
    assert (links / "@jupyter-widgets" / "jupyterlab-manager" / "package.json").is_file()
    assert (Path(sys.prefix) / "share" / "jupyter" / "labextensions" / "@jupyterlite").is_dir()  # installed...
    assert not (links / "@jupyterlite").exists()  # ...and left out
    monkeypatch.setenv("DANTINOX_HUB_AUTH", "ldap")
    with pytest.raises(SystemExit, match="DANTINOX_HUB_AUTH: expected pam or shared, got 'ldap'$"):
        load()


def test_the_hub_refuses_to_start_with_instructors_and_no_instructor_password(tmp_path):
    import os
    import subprocess

    from classroom_hub import BIN, ROOT

    env = {**os.environ, "DANTINOX_INSTRUCTORS": "ada", "DANTINOX_HUB_AUTH": "shared",
           "DANTINOX_HUB_PASSWORD": "class-2026"}
    env.pop("DANTINOX_HUB_INSTRUCTOR_PASSWORD", None)
    proc = subprocess.run([str(BIN / "jupyterhub"), "-f", str(ROOT / "classroom" / "jupyterhub_config.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "DANTINOX_HUB_INSTRUCTOR_PASSWORD: expected a password" in proc.stderr
    assert not (tmp_path / "jupyterhub.sqlite").exists()  # refused before the hub made anything
