"""Deliver a learner's outbox to the classroom service, from inside their JupyterHub server.

A kernel started by JupyterHub inherits two environment variables, and that is all this needs:

    JUPYTERHUB_API_TOKEN    the server's own hub token (the service checks it with the hub)
    DANTINOX_CLASSROOM_URL  where the service is, e.g. http://127.0.0.1:8000/services/classroom
                            (classroom/jupyterhub_config.py sets it for every user server)

`deliver_pending` posts what `store.pending()` holds and marks only what the service acknowledged: if the
service is down the attempts stay in the outbox for the next call, and the service ignores a key it already
has, so an attempt is never lost and never counted twice. Standard library only.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass

from classroom.store import AnswerStore

URL_ENV = "DANTINOX_CLASSROOM_URL"
TOKEN_ENV = "JUPYTERHUB_API_TOKEN"
BATCH = 200  # attempts per request, well under the service's limit


@dataclass(frozen=True)
class Delivery:
    """What one `deliver_pending` call did."""

    delivered: int  # attempts the service acknowledged in this call
    pending: int  # attempts still in the outbox afterwards
    error: str | None = None  # why delivery stopped early (None when the outbox was emptied)


def classroom_url() -> str | None:
    """The service URL from $DANTINOX_CLASSROOM_URL, or None outside a classroom."""
    return os.environ.get(URL_ENV) or None


def post_attempts(url: str, token: str, payload: list[dict], *, timeout: float = 10.0) -> dict:
    """POST attempts to `url`/api/attempts with the hub token; returns the service's JSON reply."""
    req = urllib.request.Request(url.rstrip("/") + "/api/attempts", data=json.dumps(payload).encode(), method="POST",
                                 headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def deliver_pending(store: AnswerStore, *, url: str | None = None, token: str | None = None,
                    timeout: float = 10.0) -> Delivery:
    """Send the outbox to the classroom service; never raises for a down or refusing service."""
    url = url or classroom_url()
    token = token or os.environ.get(TOKEN_ENV)
    if not url or not token:
        missing = URL_ENV if not url else TOKEN_ENV
        return Delivery(0, len(store.pending()), f"${missing} is not set: not in a classroom hub")
    delivered, error = 0, None
    pending = store.pending()
    for start in range(0, len(pending), BATCH):
        batch = pending[start:start + BATCH]
        try:
            reply = post_attempts(url, token, [a.to_json() for a in batch], timeout=timeout)
        except urllib.error.HTTPError as err:
            what = "unavailable" if err.code >= 500 else "refused the attempts"  # 5xx: down or restarting
            error = f"classroom service {what}: HTTP {err.code} {_reason(err)}"
            break
        except (urllib.error.URLError, TimeoutError, ConnectionError, json.JSONDecodeError) as err:
            error = f"classroom service unreachable at {url}: {getattr(err, 'reason', err)}"
            break
        sent = {a.key for a in batch}
        acked = [k for k in reply.get("keys", []) if k in sent]  # only what this batch carried
        store.mark_delivered(acked)
        delivered += len(acked)
    return Delivery(delivered, len(store.pending()), error)


def _reason(err: urllib.error.HTTPError) -> str:
    try:
        return json.loads(err.read()).get("error", err.reason)
    except (ValueError, AttributeError, OSError):
        return str(err.reason)
