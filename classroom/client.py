"""Deliver a learner's outbox to the classroom service, from inside their JupyterHub server.

A kernel started by JupyterHub inherits two environment variables, and that is all this needs:

    JUPYTERHUB_API_TOKEN    the server's own hub token (the service checks it with the hub)
    DANTINOX_CLASSROOM_URL  where the service is, e.g. http://classroom--service.localhost/services/classroom
                            (classroom/jupyterhub_config.py sets it for every user server)

`deliver_pending` posts what `store.pending()` holds and marks only what the service acknowledged: if the
service is down the attempts stay in the outbox for the next round, and the service ignores a key it already
has, so an attempt is never lost and never counted twice. What the service refuses is set aside, one attempt
at a time, and the rest still goes. `BackgroundDelivery` runs those rounds in a thread with backoff, so a
learner's click never waits on the network. Standard library only.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass

from classroom.store import AnswerStore, Attempt

URL_ENV = "DANTINOX_CLASSROOM_URL"
TOKEN_ENV = "JUPYTERHUB_API_TOKEN"
BATCH = 200  # attempts per request, well under the service's limit
BACKOFF_S = (1.0, 15.0)  # first and longest wait between delivery rounds while the service is unreachable


@dataclass(frozen=True)
class Delivery:
    """What one delivery round did."""

    delivered: int  # attempts the service acknowledged in this round
    pending: int  # attempts still in the outbox (or held in memory) afterwards
    error: str | None = None  # why delivery stopped early (None when nothing is left to send)
    refused: int = 0  # attempts the service refused in this round, set aside (never sent again)
    refusal: str | None = None  # the service's reason for the last one


REFUSALS = (400, 403, 409, 413, 422)  # the service read the request and will never take it as it is


def classroom_url() -> str | None:
    """The service URL from $DANTINOX_CLASSROOM_URL, or None outside a classroom."""
    return os.environ.get(URL_ENV) or None


class LoopbackNames(http.client.HTTPConnection):
    """Names under .localhost are this machine (RFC 6761, as browsers treat them): the service's own origin on a
    one-machine class is classroom--service.localhost, which the system resolver may not know. The Host header
    keeps the name, so the hub's proxy routes the request to the service."""

    def connect(self) -> None:
        name = self.host
        if name.rstrip(".").lower().endswith(".localhost"):
            self.host = "127.0.0.1"
        try:
            super().connect()
        finally:
            self.host = name


class LoopbackHandler(urllib.request.HTTPHandler):
    def http_open(self, req):
        return self.do_open(LoopbackNames, req)


OPENER = urllib.request.build_opener(LoopbackHandler)


def post_attempts(url: str, token: str, payload: list[dict], *, timeout: float = 10.0) -> dict:
    """POST attempts to `url`/api/attempts with the hub token; returns the service's JSON reply."""
    req = urllib.request.Request(url.rstrip("/") + "/api/attempts", data=json.dumps(payload).encode(), method="POST",
                                 headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with OPENER.open(req, timeout=timeout) as resp:
        return json.loads(resp.read())


class _Unavailable(Exception):
    """The service (or the hub's proxy in front of it) did not take the request; try again later."""


def _send(url: str, token: str, batch: list[Attempt], timeout: float) -> set[str] | str:
    """The keys the service acknowledged, or the reason it refused the batch; raises _Unavailable."""
    try:
        reply = post_attempts(url, token, [a.to_json() for a in batch], timeout=timeout)
    except urllib.error.HTTPError as err:
        reason = f"HTTP {err.code} {_reason(err)}"
        if err.code in REFUSALS:
            return reason
        what = "does not accept this server's token" if err.code == 401 else "unavailable"  # 404: proxy restarting
        raise _Unavailable(f"classroom service {what}: {reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise _Unavailable(f"classroom service unreachable at {url}: {getattr(err, 'reason', err)}") from None
    sent = {a.key for a in batch}
    return {k for k in reply.get("keys", []) if k in sent}  # only what this batch carried


def send_all(url: str, token: str, attempts: list[Attempt], *, timeout: float = 10.0,
             acknowledged=lambda keys: None, refused=lambda attempt, reason: None) -> Delivery:
    """Post `attempts` in batches; a refused batch is sent again one attempt at a time, so one refused attempt
    never holds back the rest. `pending` in the result counts what was not sent because the service became
    unavailable (then `error` says why)."""
    done = n_refused = 0
    last = None
    for start in range(0, len(attempts), BATCH):
        batch = attempts[start:start + BATCH]
        try:
            result = _send(url, token, batch, timeout)
            if isinstance(result, str):
                for a in batch:  # one by one: only what is refused on its own is set aside
                    single = _send(url, token, [a], timeout) if len(batch) > 1 else result
                    if isinstance(single, str):
                        refused(a, single)
                        n_refused, last = n_refused + 1, single
                    else:
                        acknowledged(single)
                        done += len(single)
                continue
        except _Unavailable as err:
            return Delivery(done, len(attempts) - done - n_refused, str(err), n_refused, last)
        acknowledged(result)
        done += len(result)
    return Delivery(done, len(attempts) - done - n_refused, None, n_refused, last)


def deliver_pending(store: AnswerStore, *, url: str | None = None, token: str | None = None,
                    timeout: float = 10.0) -> Delivery:
    """Send the outbox to the classroom service; never raises for a down or refusing service.

    What the service refuses (a malformed attempt, one under another name after a hub user was renamed) is
    set aside in the store (`store.refused()`) with the reason, and the rest is still delivered."""
    url = url or classroom_url()
    token = token or os.environ.get(TOKEN_ENV)
    if not url or not token:
        missing = URL_ENV if not url else TOKEN_ENV
        return Delivery(0, len(store.pending()), f"${missing} is not set: not in a classroom hub")
    result = send_all(url, token, store.pending(), timeout=timeout, acknowledged=store.mark_delivered,
                      refused=lambda a, why: store.set_aside(a.key, why))
    return Delivery(result.delivered, len(store.pending()), result.error, result.refused, result.refusal)


def _reason(err: urllib.error.HTTPError) -> str:
    try:
        return json.loads(err.read()).get("error", err.reason)
    except (ValueError, AttributeError, OSError):
        return str(err.reason)


class BackgroundDelivery:
    """Delivers a store's outbox from a daemon thread, so a slow or hung service never blocks a click.

    `kick()` after each saved answer starts a round at once; while the service is unreachable the thread
    retries with exponential backoff (`backoff`: first and longest wait, seconds). `send_direct(attempt)`
    takes an answer the local store could not save and posts it straight away (it lives in memory only until
    the service acknowledges it). Every round's `Delivery` goes to each function in `listeners`."""

    def __init__(self, store: AnswerStore | None, *, url: str | None = None, token: str | None = None,
                 timeout: float = 10.0, backoff: tuple[float, float] | None = None):
        self.store, self.url, self.token, self.timeout = store, url, token, timeout
        self.backoff = backoff or BACKOFF_S
        self.listeners: list = []
        self.last: Delivery | None = None
        self._direct: list[Attempt] = []  # answers the store could not save: only here until acknowledged
        self._lock = threading.Lock()
        self._wake, self._idle = threading.Event(), threading.Event()
        self._wake.set()  # a first round at once: what an earlier session left in the outbox
        self._thread = threading.Thread(target=self._run, name="classroom-outbox", daemon=True)
        self._thread.start()

    def kick(self) -> None:
        """Deliver now (a new answer was saved)."""
        self._idle.clear()
        self._wake.set()

    def send_direct(self, attempt: Attempt) -> None:
        """Post an attempt that is in no store (it failed to save); kept in memory until acknowledged."""
        with self._lock:
            self._direct.append(attempt)
        self.kick()

    def wait_idle(self, timeout: float) -> bool:
        """Block until a round left nothing to send (True), or `timeout` seconds passed (False)."""
        return self._idle.wait(timeout)

    def round(self) -> Delivery:
        """One delivery round: the in-memory answers first, then the store's outbox."""
        url, token = self.url or classroom_url(), self.token or os.environ.get(TOKEN_ENV)
        with self._lock:
            direct = list(self._direct)
        first = Delivery(0, 0)
        if direct and url and token:
            def forget(keys):
                with self._lock:
                    self._direct = [a for a in self._direct if a.key not in keys]

            first = send_all(url, token, direct, timeout=self.timeout, acknowledged=forget,
                             refused=lambda a, why: forget({a.key}))
        writable = self.store is not None and not self.store.readonly  # a read-only outbox cannot be marked
        result = deliver_pending(self.store, url=url, token=token, timeout=self.timeout) if writable else \
            Delivery(0, 0, None if url and token else f"${URL_ENV if not url else TOKEN_ENV} is not set")
        with self._lock:
            held = len(self._direct)
        return Delivery(first.delivered + result.delivered, result.pending + held, first.error or result.error,
                        first.refused + result.refused, result.refusal or first.refusal)

    def _run(self) -> None:
        delay = self.backoff[0]
        while True:
            # jitter: a class's kernels that failed together do not all come back in the same instant
            self._wake.wait(None if self._idle.is_set() else delay * random.uniform(0.5, 1.0))
            self._wake.clear()
            try:
                result = self.round()
            except Exception as err:  # noqa: BLE001 - a store fault must not end the thread; shown, retried
                result = Delivery(0, 0, f"{type(err).__name__}: {err}")
            self.last = result
            for listener in list(self.listeners):
                try:
                    listener(result)
                except Exception:  # noqa: BLE001, S110 - a closed widget must not stop delivery for the others
                    pass
            if result.pending and result.error:
                delay = min(2 * delay, self.backoff[1])  # a new answer (kick) still tries at once
            else:
                delay = self.backoff[0]
                if not self._wake.is_set():
                    self._idle.set()


_senders: dict[str, BackgroundDelivery] = {}
_senders_lock = threading.Lock()


def background_delivery(store: AnswerStore | None) -> BackgroundDelivery:
    """The one background sender of this kernel for `store` (every quiz of a notebook shares it)."""
    key = str(store.path) if store is not None else ""
    with _senders_lock:
        if key not in _senders:
            _senders[key] = BackgroundDelivery(store)
        return _senders[key]
