"""The hub's proxy: the pure-Python configurable-http-proxy, forwarding a whole class's requests at once.

    python -m classroom.proxy [configurable-http-proxy's arguments]     # what classroom/jupyterhub_config.py runs

That proxy forwards through tornado's default HTTP client, which sends at most 10 requests at a time and queues
the rest inside the proxy; with a few dozen learners answering, their answers waited there. This runs the
same proxy with room for MAX_FORWARDED requests in flight (measured: benchmarks/classroom_load.py).
"""

from __future__ import annotations

import sys

MAX_FORWARDED = 100  # requests forwarded at once: a class's answers, dashboards and pages


def main() -> int:
    from configurable_http_proxy.cli import main as proxy_main
    from tornado.httpclient import AsyncHTTPClient

    AsyncHTTPClient.configure(None, max_clients=MAX_FORWARDED)
    return proxy_main()


if __name__ == "__main__":
    sys.argv[0] = "configurable-http-proxy"
    sys.exit(main())
