"""A real JupyterHub, its proxy and the classroom service on free localhost ports, for tests and benchmarks.

The hub logs in with the shipped shared-password mode (`Hub.class_password` for learners,
`Hub.instructor_password` for instructors and admins) and spawns no user servers; learners and instructors
are made through the hub's REST API with a test-only admin service token, and their tokens are asked of the
API too.
The classroom service is registered as an external service so a test can kill -9 and restart it.
As in the shipped config, every user server and the service have their own origin under `localhost`
(http://classroom--service.localhost:PORT): this process resolves names under .localhost to 127.0.0.1, as
browsers do (RFC 6761). The service holds its database exclusively, so tests read the records through it.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import os
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SERVICE = "classroom"

_getaddrinfo = socket.getaddrinfo


def _loopback_names(host, *args, **kwargs):
    if isinstance(host, str) and host.rstrip(".").lower().endswith(".localhost"):
        host = "127.0.0.1"
    return _getaddrinfo(host, *args, **kwargs)


socket.getaddrinfo = _loopback_names  # requests and urllib in this test process: names under .localhost


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, token: str | None = None, body=None, timeout: float = 30.0,
         follow: bool = True) -> tuple[int, bytes, dict]:
    """One request; returns (status, body, headers) for any status, never raises on 4xx/5xx."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"token {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    from classroom.client import LoopbackHandler

    opener = urllib.request.build_opener(LoopbackHandler, *([] if follow else [_NoRedirect]))
    try:
        with opener.open(req, timeout=timeout) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read(), dict(err.headers)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def wait_until(check, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (OSError, sqlite3.Error):  # not listening yet, or its file has no table yet
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{what} not ready after {timeout:.0f} s")


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class Hub:
    """JupyterHub + proxy (+ the classroom service when `start_service` is called) in a temporary directory."""

    def __init__(self, *, managed: bool = False, extra_config: str = "", ports: tuple[int, ...] | None = None):
        from classroom.jupyterhub_config import service_public_url

        self.dir = Path(tempfile.mkdtemp(prefix="dantinox-hub-"))
        os.chmod(self.dir, 0o755)  # as a clone's folder: the data folder inside it is what must be private
        self.port, self.hub_port, self.proxy_api_port, self.service_port = ports or [free_port() for _ in range(4)]
        self.url = f"http://localhost:{self.port}"
        self.api = f"{self.url}/hub/api"
        self.service_url = service_public_url("localhost", self.port)  # through the proxy, its own origin
        self.direct_url = f"http://127.0.0.1:{self.service_port}/services/{SERVICE}"  # the peer: no proxy
        self.admin_token, self.service_token = secrets.token_hex(16), secrets.token_hex(16)
        self.class_password, self.instructor_password = "class-" + secrets.token_hex(4), secrets.token_hex(20)
        self.db = self.dir / "data" / "classroom.sqlite"
        self.proxy_pid_file = self.db.with_name("jupyterhub-proxy.pid")  # the config puts it beside the answers
        self.managed, self.proc, self.service, self.extra_config = managed, None, None, extra_config
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"),
                                                                 os.environ.get("PYTHONPATH", "")]),
                    "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")])}

    def write_config(self) -> Path:
        path = self.dir / "jupyterhub_config.py"
        path.write_text(f"""
from classroom.jupyterhub_config import configure
configure(c, hub_port={self.port}, hub_ip="127.0.0.1", db_path={str(self.db)!r}, service_port={self.service_port},
          managed={self.managed}, api_token={self.service_token!r}, python={sys.executable!r},
          auth="shared", class_password={self.class_password!r}, instructor_password={self.instructor_password!r},
          hub_api_port={self.hub_port}, proxy_api_port={self.proxy_api_port})
c.JupyterHub.cleanup_servers = True
c.JupyterHub.services.append({{"name": "tester", "api_token": {self.admin_token!r}}})
c.JupyterHub.load_roles.append({{"name": "admin", "services": ["tester"]}})  # the hub's own admin role
""" + self.extra_config)
        return path

    def start(self) -> Hub:
        if not self.managed:
            self.start_service(wait=False)  # the hub waits for an external service to answer before it is ready
        config = self.write_config()
        self.log = open(self.dir / "hub.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([str(BIN / "jupyterhub"), "-f", str(config)], cwd=self.dir, env=self.env,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(lambda: self._alive() and http("GET", self.api + "/", timeout=2)[0] == 200, "JupyterHub", 90)
        if not self.managed:
            wait_until(lambda: self._service_up(), "classroom service", 60)
        return self

    def _alive(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"JupyterHub exited: {(self.dir / 'hub.log').read_text()[-2000:]}")
        return True

    def service_env(self) -> dict:
        """The environment JupyterHub gives a service it manages, for a service the test manages."""
        return {**self.env, "JUPYTERHUB_API_TOKEN": self.service_token,
                "JUPYTERHUB_API_URL": f"http://127.0.0.1:{self.hub_port}/hub/api",
                "JUPYTERHUB_BASE_URL": "/", "JUPYTERHUB_SERVICE_NAME": SERVICE,
                "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{self.service_port}",
                "JUPYTERHUB_SERVICE_PREFIX": f"/services/{SERVICE}/", "JUPYTERHUB_CLIENT_ID": f"service-{SERVICE}",
                "JUPYTERHUB_OAUTH_CALLBACK_URL": f"{self.service_url}/oauth_callback",
                "JUPYTERHUB_HOST": self.url, "JUPYTERHUB_PUBLIC_HUB_URL": f"{self.url}/hub/",
                "JUPYTERHUB_PUBLIC_URL": f"{self.service_url}/", "JUPYTERHUB_OAUTH_ACCESS_SCOPES":
                    json.dumps([f"access:services!service={SERVICE}", "access:services"])}

    def start_service(self, wait: bool = True) -> subprocess.Popen:
        """Start (or restart) the classroom service process and wait until it answers."""
        self.service_log = open(self.dir / "service.log", "ab")  # noqa: SIM115 - closed in stop()
        self.service = subprocess.Popen(
            [sys.executable, "-m", "classroom.service", "--db", str(self.db), "--port", str(self.service_port)],
            cwd=ROOT, env=self.service_env(), stdout=self.service_log, stderr=subprocess.STDOUT)
        if wait:
            wait_until(lambda: self._service_up(), "classroom service", 60)
        return self.service

    def _service_up(self) -> bool:
        if self.service.poll() is not None:
            raise RuntimeError(f"classroom service exited: {(self.dir / 'service.log').read_text()[-2000:]}")
        return http("GET", self.direct_url + "/api/me", timeout=2)[0] == 401

    def kill_service(self, sig: int = signal.SIGKILL) -> None:
        self.service.send_signal(sig)
        self.service.wait(10)

    def stop(self) -> None:
        _stop(self.service)
        _stop(self.proc)
        if self.proc is not None:
            try:  # anything the hub started (its proxy, a managed service) that outlived it
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:  # the proxy runs in a session of its own: a hub killed with -9 leaves it behind
            import psutil

            proxy = psutil.Process(int(self.proxy_pid_file.read_text()))
            if "classroom.proxy" in " ".join(proxy.cmdline()):  # not a stranger that took a stale pid
                proxy.kill()
        except (OSError, ValueError, psutil.Error):
            pass
        for name in ("log", "service_log"):
            if hasattr(self, name):
                getattr(self, name).close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # Hub API, as the test-only admin service -----------------------------------------------------------
    def admin(self, method: str, path: str, body=None) -> dict | list | None:
        status, data, _ = http(method, self.api + path, self.admin_token, body)
        if status >= 300:
            raise RuntimeError(f"hub API {method} {path}: HTTP {status} {data[:300]!r}")
        return json.loads(data) if data else None

    def add_users(self, *names: str) -> None:
        self.admin("POST", "/users", {"usernames": list(names)})

    def add_to_group(self, group: str, *names: str) -> None:
        self.admin("POST", f"/groups/{group}/users", {"users": list(names)})

    def token_for(self, name: str, scopes: list[str] | None = None) -> str:
        """A token for `name` with the scopes a kernel's server token carries for this service."""
        scopes = scopes if scopes is not None else [f"access:services!service={SERVICE}"]
        return self.admin("POST", f"/users/{name}/tokens", {"scopes": scopes, "note": "test"})["token"]

    def service_log_text(self) -> str:
        return (self.dir / "service.log").read_text(errors="replace")

    def reader_token(self) -> str:
        """The token of an instructor who only reads (made once): the service holds its file exclusively."""
        if not hasattr(self, "_reader"):
            self.add_users("records-reader")
            self.add_to_group("instructors", "records-reader")
            self._reader = self.token_for("records-reader")
        return self._reader

    def records(self) -> list[dict]:
        """Every attempt the service has stored, as its instructor export gives them."""
        status, body, _ = http("GET", self.service_url + "/api/attempts", self.reader_token())
        if status != 200:  # a ConnectionError: wait_until tries again while the service starts
            raise ConnectionError(f"reading the records through the service: HTTP {status} {body[:300]!r}")
        return json.loads(body)


def login_form(h: Hub, name: str, password: str):
    """Post the hub's login form as a browser does; returns (session, response) without following it."""
    import re

    import requests

    session = requests.Session()
    page = session.get(h.url + "/hub/login", timeout=30).text
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page).group(1)
    login = session.post(h.url + "/hub/login", data={"username": name, "password": password, "_xsrf": xsrf},
                         allow_redirects=False, timeout=30)  # no user server to go to: stop at the hub
    return session, login


# Load: many learners posting at once ----------------------------------------------------------------------
VERSION = "0" * 64  # a valid content_version for generated attempts


@functools.cache
def _kv_cache_entry():
    import content

    return content.load_entry("kv-cache")


def make_attempt(learner: str, i: int) -> dict:
    """A gradable attempt at one of kv-cache's checks with a fresh idempotency key (generated answers, not a
    real learner's). The verdict, question and attempt number are left for the service to decide."""
    entry = _kv_cache_entry()
    index = i % len(entry.checks)
    check = entry.checks[index]
    response = check.options[i % len(check.options)] if check.kind == "choice" else str(i)
    return {"key": secrets.token_hex(16), "learner": learner, "entry_id": "kv-cache", "check_index": index,
            "question": "as the client saw it", "params": {}, "response": response, "expected": "?",
            "correct": False, "attempt": 1, "time": time.time(), "content_version": VERSION}


def server_timing(header: str) -> dict[str, float]:
    """'auth;dur=0.41, grade;dur=0.30' -> {'auth': 0.41, 'grade': 0.30} (milliseconds)."""
    out = {}
    for part in filter(None, (p.strip() for p in header.split(","))):
        name, _, dur = part.partition(";dur=")
        out[name] = float(dur)
    return out


def run_load(url: str, tokens: dict[str, str], per_learner: int, *, on_ack=None, timeout: float = 60.0,
             timings: list | None = None) -> list:
    """Every learner posts `per_learner` single attempts one after another, all learners at once.

    Returns (learner, key, status, seconds, body) per request; status 599 is a connection failure.
    `on_ack(n)` is called after each acknowledged (200) request with the running count; `timings`, when
    given, gets the service's Server-Timing of each acknowledged request (`server_timing`)."""
    import asyncio

    from tornado.httpclient import AsyncHTTPClient, HTTPRequest

    async def main():
        client = AsyncHTTPClient(force_instance=True, max_clients=len(tokens))
        results, acked = [], 0

        async def learner(name: str, token: str):
            nonlocal acked
            for i in range(per_learner):
                attempt = make_attempt(name, i)
                req = HTTPRequest(url + "/api/attempts", method="POST", body=json.dumps(attempt),
                                  headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
                                  request_timeout=timeout, connect_timeout=timeout)
                start = time.perf_counter()
                resp = await client.fetch(req, raise_error=False)
                body = resp.body or str(resp.error).encode()
                results.append((name, attempt["key"], resp.code, time.perf_counter() - start, body))
                if resp.code == 200:
                    acked += 1
                    if timings is not None:
                        timings.append(server_timing(resp.headers.get("Server-Timing", "")))
                    if on_ack:
                        on_ack(acked)

        await asyncio.gather(*(learner(n, t) for n, t in tokens.items()))
        client.close()
        return results

    # a fresh loop in a worker thread: another suite's fixture (Playwright's sync API) may own this thread's loop
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, main()).result()
