"""The classroom service: one tornado process, run by JupyterHub, that every quiz attempt and exercise check of
a class goes to.

    dantinox classroom serve [--db PATH]      # started by the hub (classroom/jupyterhub_config.py)

Every request is authenticated by the hub (`jupyterhub.services.auth.HubOAuth`): a token in the
`Authorization: token ...` header (kernels send their server's `JUPYTERHUB_API_TOKEN`) or the hub's OAuth
cookie (the instructor's browser). The learner's name is the hub's, never a field the client typed.
Learners read and write only their own attempts; members of the hub group `instructors` and hub admins read
everything; any other identity gets 403 and an unauthenticated request never reaches a handler's body.
All writes go through this one process into one SQLite file (`classroom.store.AnswerStore`), in a worker
thread so that a slow or locked file never stalls the event loop. The service grades every attempt itself
from its concept entry (`classroom.grading`): what a client says about correctness, timing, attempt number
or question text is replaced, unknown entries and checks are refused, and each learner is rate-limited.

Exercise checks (the learner's code run against a reference in their kernel, `widgets.exercises`) arrive on
the same endpoint as attempts whose entry_id is an exercise id. This service re-runs nothing, so it cannot
grade them: pass / fail, the recognised mistake and the verdict line are recorded as the learner kernel's
claim. What it does decide is the same as for a quiz answer — who (the hub's name), when (arrival time),
which attempt (arrival order) — plus that the exercise and its mistake are in the catalogue
(`classroom.exercise_catalogue`), that a pass names no mistake, and the title and catalogue version kept with
the record. A grade that needs the code re-run comes from nbgrader's hidden tests (`dantinox classroom
nbgrader`).

Endpoints, under the service prefix (`/services/classroom/`):

    GET  ./                     instructor dashboard (HTML; polls api/summary)
    GET  api/me                 {"name", "instructor"}
    POST api/attempts           one attempt or a list (JSON), stored all or none; idempotent by key
                                -> {"received", "new", "keys"}; 400/403/409/413 refuse the whole body
    GET  api/attempts/mine      the caller's attempts (JSON)
    GET  api/attempts           everyone's attempts, instructors only; ?format=json|csv, ?learner=, ?entry_id=
    GET  api/summary            per-question and per-learner summary, instructors only; ?format=json|csv
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import queue
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path
from urllib.parse import quote

from jupyterhub.services.auth import HubOAuth, HubOAuthCallbackHandler, HubOAuthenticated, UserNotAllowed
from jupyterhub.utils import url_path_join
from tornado import httpclient, ioloop, web

from classroom.dashboard import class_summary, dashboard_page
from classroom.exercise_catalogue import grade_exercise, is_exercise
from classroom.grading import grade
from classroom.hub_auth import CLASS_PASSWORD_GROUP
from classroom.store import AnswerStore, Attempt, KeyConflict
from classroom.summary import Tally, attempt_table, to_csv

DB_ENV_VAR = "DANTINOX_CLASSROOM_DB"
INSTRUCTORS_GROUP = "instructors"
MAX_BATCH = 1000  # attempts in one POST: a kernel's whole outbox after a long outage, not a bulk import
MAX_BODY_BYTES = 4 * 1024 * 1024  # 1000 attempts of a few KB; larger bodies get 413
TOKEN_CACHE_S = 3  # how long the hub's word on a token is trusted: a revoked token stops writing within this
ROLE_CACHE_S = 5.0  # how long a learner's group membership is trusted before asking the hub again
# per learner: requests and attempts each come from a bucket that refills at a steady rate (token bucket)
RATE_REQUESTS = (100, 50.0)  # burst, per second: a quiz click is one request; a load test is far more
RATE_ATTEMPTS = (3000, 100.0)  # burst (a whole outbox after an outage), per second
PARENT_CHECK_S = 1.0  # how often a hub-started service checks that its hub is still its parent
BIND_WAIT_S = 10.0  # how long a new service waits for its port while an earlier one lets go of it


def _port_from(url: str) -> int | None:
    tail = url.rsplit(":", 1)[1].split("/")[0] if url.count(":") == 2 else ""
    return int(tail) if tail.isdigit() else None


def default_db_path() -> Path:
    """$DANTINOX_CLASSROOM_DB when set, else classroom.sqlite in the user's data directory."""
    env = os.environ.get(DB_ENV_VAR)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return platformdirs.user_data_path("dantinox-labs") / "classroom.sqlite"


@dataclass
class _Role:
    instructor: bool
    checked: float


class Roles:
    """Asks the hub (with the service's own token) whether a user is an admin or in the instructors group."""

    def __init__(self, hub_auth: HubOAuth, group: str = INSTRUCTORS_GROUP):
        self.hub_auth, self.group, self._cache = hub_auth, group, {}
        self._http = httpclient.AsyncHTTPClient()

    async def is_instructor(self, name: str) -> bool:
        role = self._cache.get(name)
        if role and time.monotonic() - role.checked < ROLE_CACHE_S:
            return role.instructor
        url = url_path_join(self.hub_auth.api_url, "users", quote(name, safe=""))
        try:
            resp = await self._http.fetch(url, headers={"Authorization": f"token {self.hub_auth.api_token}"},
                                          raise_error=False)
            code = resp.code
        except (OSError, httpclient.HTTPClientError) as err:  # the hub is down or restarting
            code = f"nothing ({err})"
        if code != 200:  # the service's role lacks read:users, or the hub is down: refuse, never guess
            raise web.HTTPError(503, f"cannot read hub user {name!r} (hub answered {code})")
        model = json.loads(resp.body)
        groups = model.get("groups", [])
        # a name first claimed with the class password (shared mode) is no instructor until someone logs in
        # under it with the instructor password, which revokes that earlier session (classroom/hub_auth.py)
        instructor = (bool(model.get("admin")) or self.group in groups) and CLASS_PASSWORD_GROUP not in groups
        self._cache[name] = _Role(instructor, time.monotonic())
        return instructor


class RateLimit:
    """Token buckets per learner: `take(name, n)` is False when `n` more would exceed the burst and rate."""

    def __init__(self, burst: float, per_s: float):
        self.burst, self.per_s, self._buckets = burst, per_s, {}

    def take(self, name: str, n: float = 1) -> bool:
        now = time.monotonic()
        level, then = self._buckets.get(name, (self.burst, now))
        level = min(self.burst, level + (now - then) * self.per_s)
        ok = level >= n
        self._buckets[name] = (level - n if ok else level, now)
        return ok


class GroupCommit:
    """The one writer: a thread that stores, in one transaction (one commit), every request that arrived while
    it wrote the previous one, each request still all or none; the event loop only hands requests over.

    Under a class's load this keeps the store's share of an answer's time small: requests no longer queue one
    transaction and one thread round trip each, and the writer never waits for the event loop between them."""

    def __init__(self, store: AnswerStore):
        self.store, self.queue = store, queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="classroom-write", daemon=True)
        self.thread.start()

    async def add(self, attempts: list[Attempt]) -> list[bool]:
        """Store `attempts` (numbered in arrival order); per attempt whether it was new. Raises KeyConflict
        (this request only) or sqlite3.OperationalError (everyone in the transaction)."""
        future = asyncio.get_running_loop().create_future()
        self.queue.put((attempts, future))
        return await future

    def close(self) -> None:
        """Finish what was handed over, then stop the thread."""
        self.queue.put(None)
        self.thread.join()

    def _run(self) -> None:
        while True:
            batch = [self.queue.get()]
            while not self.queue.empty():
                batch.append(self.queue.get())
            stop = None in batch
            batch = [item for item in batch if item is not None]
            if batch:
                try:
                    outcomes = self.store.add_groups([attempts for attempts, _ in batch], number=True)
                except Exception as err:  # noqa: BLE001 - locked, disk full: every request in it is told
                    outcomes = [err] * len(batch)
                loop = batch[0][1].get_loop()
                loop.call_soon_threadsafe(self._settle, [future for _, future in batch], outcomes)
            if stop:
                return

    @staticmethod
    def _settle(futures: list[asyncio.Future], outcomes: list) -> None:
        for future, outcome in zip(futures, outcomes, strict=True):
            if future.done():  # its client went away
                continue
            if isinstance(outcome, Exception):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)


class _Handler(HubOAuthenticated, web.RequestHandler):
    """Authenticates through the hub before any handler body runs."""

    def initialize(self, store: AnswerStore, hub_auth: HubOAuth, roles: Roles, reads: ThreadPoolExecutor,
                   tally: Tally):
        self.store, self.hub_auth, self.roles, self.reads, self.tally = store, hub_auth, roles, reads, tally

    def set_default_headers(self):
        self.set_header("X-Content-Type-Options", "nosniff")  # an export is data, never run as a page
        self.set_header("X-Frame-Options", "DENY")

    async def db(self, fn, *args, **kwargs):
        """Run a store read in a worker thread, off the event loop (WAL readers never wait for a writer, so a
        write stuck on another process's lock holds back no read; writes go through GroupCommit)."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self.reads, lambda: fn(*args, **kwargs))
        except sqlite3.Error as err:  # disk full, damaged pages: try again later
            raise web.HTTPError(503, f"answer database unavailable ({err})") from None

    def timed(self, name: str, since: float) -> float:
        """Add the time since `since` to this response's Server-Timing header (in ms); returns now."""
        now = time.perf_counter()
        self.timings.append(f"{name};dur={1000 * (now - since):.2f}")
        self.set_header("Server-Timing", ", ".join(self.timings))
        return now

    async def prepare(self):
        self.timings = []  # where a request's time goes: the benchmark reads them (benchmarks/classroom_load.py)
        length = self.request.headers.get("Content-Length", "0")
        if length.isdigit() and int(length) > MAX_BODY_BYTES:
            raise web.HTTPError(413, f"body: expected at most {MAX_BODY_BYTES} bytes, got {length}")
        start = time.perf_counter()
        try:
            model = await self.hub_auth.get_user(self, sync=False)
        except web.HTTPError as err:  # the hub did not answer (dying or restarting): try again, not a fault here
            if err.status_code < 500:
                raise
            raise web.HTTPError(503, f"cannot check this token with the hub now (hub answered {err.status_code}); "
                                     "try again in a few seconds") from None
        self.timed("auth", start)  # the hub's word on the token: cached TOKEN_CACHE_S, then asked again
        try:
            self._hub_auth_user_cache = self.check_hub_user(model) if model else None
        except UserNotAllowed:
            who = f"{model.get('kind', 'user')} {model.get('name')}"
            raise web.HTTPError(403, f"{who} lacks access:services!service=<this service>") from None
        if self._hub_auth_user_cache is None:
            self.refuse_anonymous()
            return
        if self._hub_auth_user_cache.get("kind", "user") != "user":
            raise web.HTTPError(403, "only hub users record or read attempts")
        self.learner = self._hub_auth_user_cache["name"]

    def refuse_anonymous(self):
        raise web.HTTPError(401, "authenticate through JupyterHub (Authorization: token ...)")

    async def require_instructor(self):
        if not await self.roles.is_instructor(self.learner):
            raise web.HTTPError(403, f"{self.learner} is not in the hub group {self.roles.group!r} nor an admin, or "
                                     f"logged in with the class password")

    def write_error(self, status_code, **kwargs):
        reason = self._reason
        exc = kwargs.get("exc_info", (None, None))[1]
        if isinstance(exc, web.HTTPError) and exc.log_message:
            reason = exc.log_message % exc.args if exc.args else exc.log_message
        self.finish({"error": reason, "status": status_code})

    def write_json(self, obj):
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(obj))


class DashboardHandler(_Handler):
    def refuse_anonymous(self):
        self.redirect(self.get_login_url())  # a browser goes through the hub's login and OAuth

    async def get(self):
        await self.require_instructor()
        self.set_header("Cache-Control", "no-store")
        self.set_header("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline' 'self'; "
                                                   "style-src 'unsafe-inline'; frame-ancestors 'none'")
        token = self.xsrf_token  # the hub's signed XSRF token for this login (also set as a cookie)
        self.finish(dashboard_page(token.decode() if isinstance(token, bytes) else token))


class MeHandler(_Handler):
    async def get(self):
        self.write_json({"name": self.learner, "instructor": await self.roles.is_instructor(self.learner)})


class OAuthCallbackHandler(HubOAuthCallbackHandler):
    def initialize(self, hub_auth: HubOAuth):
        self.hub_auth = hub_auth  # the instance that holds this login's OAuth state (PKCE verifier)


def parse_attempts(body: bytes, learner: str) -> list[Attempt]:
    """Validate a POST body: one attempt object or a list of them, each recorded under `learner` only."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"body: expected JSON, got invalid JSON ({err})") from None
    except RecursionError:
        raise ValueError("body: expected JSON attempts, got JSON nested too deeply") from None
    items = data if isinstance(data, list) else [data]
    if not items or len(items) > MAX_BATCH:
        raise ValueError(f"body: expected 1 to {MAX_BATCH} attempts, got {len(items)}")
    out = []
    for i, item in enumerate(items):
        try:
            a = Attempt.from_json(item)
        except (TypeError, ValueError) as err:
            raise ValueError(f"attempts[{i}]: {err}") from None
        if a.learner != learner:
            raise PermissionError(f"attempts[{i}].learner: expected {learner!r} (your hub name), got {a.learner!r}")
        out.append(a)
    return out


def grade_all(attempts: list[Attempt], entries: Entries, now: float) -> list[Attempt]:
    """Each attempt graded from its entry; an unknown entry or an ungradable answer raises ValueError."""
    known = entries.get()
    out = []
    for i, a in enumerate(attempts):
        if is_exercise(a.entry_id):  # recorded as the kernel's claim, checked against the catalogue
            try:
                out.append(grade_exercise(a, now=now))
            except ValueError as err:
                raise ValueError(f"attempts[{i}].{err}") from None
            continue
        if a.mistake is not None:
            raise ValueError(f"attempts[{i}].mistake: expected null for a quiz answer, got {a.mistake!r}")
        entry = known.get(a.entry_id)
        if entry is None:
            raise ValueError(f"attempts[{i}].entry_id: expected an entry or exercise of this course, "
                             f"got {a.entry_id[:80]!r}")
        try:
            out.append(grade(entry, entries.version(a.entry_id), a, now=now))
        except ValueError as err:
            raise ValueError(f"attempts[{i}].{err}") from None
    return out


class AttemptsHandler(_Handler):
    def initialize(self, entries, limits, writer, **kw):
        super().initialize(**kw)
        self.entries, self.limits, self.writer = entries, limits, writer

    async def post(self):
        start = time.perf_counter()
        requests, attempts_bucket = self.limits
        if not requests.take(self.learner):
            self.set_header("Retry-After", "1")
            raise web.HTTPError(429, f"{self.learner}: more than {requests.per_s:g} requests per second")
        try:
            attempts = parse_attempts(self.request.body, self.learner)
        except PermissionError as err:
            raise web.HTTPError(403, str(err)) from None
        except ValueError as err:
            raise web.HTTPError(400, str(err)) from None
        if not attempts_bucket.take(self.learner, len(attempts)):
            self.set_header("Retry-After", "5")
            raise web.HTTPError(429, f"{self.learner}: more than {attempts_bucket.per_s:g} attempts per second")
        if not self.entries.get():
            raise web.HTTPError(503, f"cannot grade: content does not load ({self.entries.error})")
        try:
            graded = grade_all(attempts, self.entries, time.time())  # arrival time, not the client's clock
        except ValueError as err:
            raise web.HTTPError(400, str(err)) from None
        start = self.timed("grade", start)  # parsing and validation included
        try:  # all of the body is stored, numbered in arrival order, before we acknowledge
            new = await self.writer.add(graded)
        except KeyConflict as err:
            raise web.HTTPError(409, str(err)) from None
        except sqlite3.Error as err:  # disk full, a file turned read-only: the answers wait in the outboxes
            raise web.HTTPError(503, f"answer database unavailable ({err})") from None
        start = self.timed("store", start)  # waiting for the writer included
        for a, is_new in zip(graded, new, strict=True):
            if is_new:
                self.tally.add(a)  # the dashboard's numbers, kept up to date here rather than recounted per poll
        self.timed("tally", start)
        self.write_json({"received": len(attempts), "new": sum(new), "keys": [a.key for a in attempts]})

    async def get(self):
        await self.require_instructor()
        rows = await self.db(self.store.attempts, self.get_argument("learner", None),
                             self.get_argument("entry_id", None), include_reset=True)
        fmt = self.get_argument("format", "json")
        if fmt == "json":
            self.write_json([a.to_json() for a in rows])
        elif fmt == "csv":
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            self.set_header("Content-Disposition", 'attachment; filename="classroom-attempts.csv"')
            self.finish(attempts_csv(rows))
        else:
            raise web.HTTPError(400, f"format: expected json or csv, got {fmt!r}")


def attempts_csv(rows: list[Attempt]) -> str:
    """Attempts as CSV with a header even when there are none (an empty class still exports its columns)."""
    return to_csv(attempt_table(rows), fieldnames=[f.name for f in fields(Attempt)])


class MyAttemptsHandler(_Handler):
    async def get(self):
        rows = await self.db(self.store.attempts, self.learner, self.get_argument("entry_id", None),
                             include_reset=True)
        self.write_json([a.to_json() for a in rows])


class SummaryHandler(_Handler):
    def initialize(self, entries, **kw):
        super().initialize(**kw)
        self.entries = entries

    async def get(self):
        await self.require_instructor()
        summary = class_summary(self.tally, self.entries.get())
        summary["content_error"] = self.entries.error
        fmt = self.get_argument("format", "json")
        if fmt == "json":
            self.write_json(summary)
        elif fmt == "csv":
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            self.set_header("Content-Disposition", 'attachment; filename="classroom-questions.csv"')
            self.finish(to_csv(summary["questions"]))
        else:
            raise web.HTTPError(400, f"format: expected json or csv, got {fmt!r}")


class Entries:
    """The content entries (question text, options, beliefs), loaded at the first summary request.

    Attempts are recorded whatever state content/ is in; if it does not load, the summary says why
    (`content_error`) and shows counts without question text."""

    def __init__(self, entries: dict | None = None):
        self._entries, self.error, self._versions = entries, None, {}

    def get(self) -> dict:
        if self._entries is None:
            try:
                import content

                self._entries = content.load_all()
            except Exception as err:  # noqa: BLE001 - shown on the dashboard, retried next request
                self.error = str(err).splitlines()[0]
                return {}
            self.error = None
        return self._entries

    def version(self, entry_id: str) -> str:
        """sha256 of the entry's YAML file (of its loaded data for entries given in memory)."""
        if entry_id not in self._versions:
            import hashlib

            import content

            try:
                self._versions[entry_id] = content.content_version(entry_id)
            except content.ContentError:
                data = self.get()[entry_id].model_dump_json().encode()
                self._versions[entry_id] = hashlib.sha256(data).hexdigest()
        return self._versions[entry_id]


def make_app(store: AnswerStore, hub_auth: HubOAuth | None = None, entries: dict | None = None) -> web.Application:
    """The tornado application; `hub_auth` defaults to one configured from the hub's environment and
    `entries` (for question text, options and beliefs) to every entry in content/."""
    hub_auth = hub_auth or HubOAuth(cache_max_age=TOKEN_CACHE_S)
    prefix = hub_auth.base_url  # $JUPYTERHUB_SERVICE_PREFIX, e.g. /services/classroom/
    reads, writer = ThreadPoolExecutor(2, thread_name_prefix="classroom-read"), GroupCommit(store)  # one writer
    tally = Tally(store.attempts())  # once at start; then each stored attempt is added as it arrives
    kw = dict(store=store, hub_auth=hub_auth, roles=Roles(hub_auth), reads=reads, tally=tally)
    content_entries = Entries(entries)
    content_entries.get()  # load now: the first answer of a class should not wait for it
    limits = (RateLimit(*RATE_REQUESTS), RateLimit(*RATE_ATTEMPTS))
    routes = [
        (prefix, DashboardHandler, kw),
        (url_path_join(prefix, "api/me"), MeHandler, kw),
        (url_path_join(prefix, "api/attempts"), AttemptsHandler,
         {**kw, "entries": content_entries, "limits": limits, "writer": writer}),
        (url_path_join(prefix, "api/attempts/mine"), MyAttemptsHandler, kw),
        (url_path_join(prefix, "api/summary"), SummaryHandler, {**kw, "entries": content_entries}),
        (url_path_join(prefix, "oauth_callback"), OAuthCallbackHandler, {"hub_auth": hub_auth}),
    ]
    secret = os.urandom(32)  # signs the OAuth cookie; a restart only costs the browser one hub round trip
    return web.Application(routes, cookie_secret=secret, hub_auth=hub_auth, xsrf_cookies=False, writer=writer)


def _listen(app: web.Application, port: int, ip: str) -> None:
    """Listen on ip:port, waiting up to BIND_WAIT_S while the port is still held (the service of a hub that
    was just killed needs up to PARENT_CHECK_S to notice and let go of it)."""
    deadline = time.monotonic() + BIND_WAIT_S
    while True:
        try:
            app.listen(port, address=ip, max_body_size=8 * MAX_BODY_BYTES)  # prepare() answers 413 up to here
            return
        except OSError as err:
            if err.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                raise ValueError(f"--port {port}: cannot listen on {ip}:{port} ({err.strerror}); another process "
                                 f"holds it (not a classroom service of a stopped hub: those exit within "
                                 f"{PARENT_CHECK_S:g} s). Stop it or choose another DANTINOX_CLASSROOM_PORT") from None
            time.sleep(0.2)


def _exit_with_hub(hub_pid: int) -> None:
    """Stop the service once the hub that started it (its parent) is gone, so that no orphan keeps the port
    and the database after a kill -9 of the hub: a dead parent is certain, never a guess about a stranger."""
    if os.getppid() != hub_pid:
        raise ValueError(f"--hub-pid {hub_pid}: expected the pid of the hub that started this service (its "
                         f"parent), got a process that is not its parent ({os.getppid()} is)")

    def check() -> None:
        if os.getppid() != hub_pid:
            print(f"classroom service: its hub (pid {hub_pid}) is gone: stopping", flush=True)
            ioloop.IOLoop.current().stop()

    ioloop.PeriodicCallback(check, PARENT_CHECK_S * 1000).start()


def open_class_store(path: str | Path) -> tuple[AnswerStore, str | None]:
    """The service's store, held exclusively (see AnswerStore); a damaged file is renamed aside untouched and a
    new one started, so that the class goes on and the hub does not restart a failing service in a loop.
    Returns the store and, when a file was set aside, the one line that says so (None otherwise)."""
    path = Path(path).expanduser()
    try:
        store = AnswerStore(path, exclusive=True)
        try:
            with store._read_lock:
                verdict = store._rdb.execute("PRAGMA quick_check").fetchone()[0]
        except sqlite3.DatabaseError as err:
            verdict = str(err)
        if verdict == "ok":
            return store, None
        store.close()
    except ValueError as err:
        if "not a usable SQLite file" not in str(err):
            raise  # not a damaged file: a directory, no room, another process holding it
        verdict = str(err).rsplit("(", 1)[-1].rstrip(")")
    aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}")
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{path}{suffix}").exists():
            os.replace(f"{path}{suffix}", f"{aside}{suffix}")  # a rename: the damaged bytes stay as they were
    verdict = " ".join(verdict.replace("*** in database main ***", "").split())  # quick_check: several lines
    notice = (f"classroom service: {path} is damaged ({verdict[:120]}); kept aside untouched as {aside.name} and "
              f"started an empty database; recover its answers with `sqlite3 {aside} .recover`")
    return AnswerStore(path, exclusive=True), notice


def serve(db: str | Path | None = None, port: int | None = None, ip: str = "127.0.0.1",
          hub_pid: int | None = None) -> None:
    """Run the service until killed, or until the hub process `hub_pid` (its parent) is gone. Needs the
    environment a JupyterHub service is started with."""
    for name in ("JUPYTERHUB_API_TOKEN", "JUPYTERHUB_API_URL", "JUPYTERHUB_SERVICE_PREFIX"):
        if not os.environ.get(name):
            raise ValueError(f"${name} is not set: run this as a JupyterHub service "
                             "(see classroom/jupyterhub_config.py)")
    if hub_pid is not None:
        _exit_with_hub(hub_pid)
    if port is None:
        port = _port_from(os.environ.get("JUPYTERHUB_SERVICE_URL", "")) or 10101
    store, notice = open_class_store(db if db is not None else default_db_path())
    if notice:
        print(notice, flush=True)
    app = make_app(store)
    _listen(app, port, ip)
    print(f"classroom service on http://{ip}:{port}{app.settings['hub_auth'].base_url} writing {store.path}",
          flush=True)
    ioloop.IOLoop.current().start()
    app.settings["writer"].close()  # a write already handed to the writer is committed before exit
    store.close()


if __name__ == "__main__":  # `python -m classroom.service`: the same as `dantinox classroom serve`, without jax
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m classroom.service", description="the classroom service")
    p.add_argument("--db", default=None)
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--ip", default="127.0.0.1")
    p.add_argument("--hub-pid", type=int, default=None, help="stop when this process (the hub) is gone")
    args = p.parse_args()
    try:
        serve(db=args.db, port=args.port, ip=args.ip, hub_pid=args.hub_pid)
    except ValueError as err:
        sys.exit(f"classroom serve: error: {err}")
