"""The hub's proxy: the pure-Python configurable-http-proxy, forwarding a whole class's requests at once.

    python -m classroom.proxy [configurable-http-proxy's arguments]     # what classroom/jupyterhub_config.py runs

That proxy forwards through tornado's default HTTP client, which sends at most 10 requests at a time and queues
the rest inside the proxy; with a few dozen learners answering, their answers waited there. This runs the
same proxy with room for MAX_FORWARDED requests in flight (measured: benchmarks/classroom_load.py).

JupyterHub asks for host routing (each user server and service in its own origin) with a bare
`--host-routing`, the Node proxy's flag; the Python port's option takes a value, so the flag is given one, and
its request handler (0.4) looks every request up without its host, so a request for a user's or the service's
origin went to the hub: `target_url` looks it up under /HOST/PATH, as the routes are stored.
"""

from __future__ import annotations

import sys
import urllib.parse

MAX_FORWARDED = 100  # requests forwarded at once: a class's answers, dashboards and pages


async def target_url(handler, path: str) -> str | None:
    """The URL a request for `path` goes to: its route looked up under the request's host (without the port)
    when the proxy routes by host; None after answering 404 when no route matches."""
    proxy = handler.proxy
    host = handler.request.host_name if proxy.host_routing else None
    handler.target = proxy.target_for_req(host, "/" + path.lstrip("/"))  # the handler's path has no leading /
    if handler.target is None:
        await handler.handle_proxy_error(404, err=None)
        return None
    forwarded = urllib.parse.quote(path)
    if not proxy.include_prefix:  # the route's prefix, less the host it is stored under
        prefix = handler.target["prefix"][len(host) + 1:] if host else handler.target["prefix"]
        forwarded = forwarded[len(urllib.parse.quote(prefix)):]
    target = urllib.parse.urlparse(handler.target["target"])
    if proxy.prepend_path:
        query = "&".join(q for q in (target.query, handler.request.query) if q)
        return target._replace(query=query, path=target.path.rstrip("/") + "/" + forwarded.lstrip("/")).geturl()
    return target._replace(query=handler.request.query, path=forwarded).geturl()


def main() -> int:
    from configurable_http_proxy.cli import main as proxy_main
    from configurable_http_proxy.handlers import ProxyHandler
    from tornado.httpclient import AsyncHTTPClient

    AsyncHTTPClient.configure(None, max_clients=MAX_FORWARDED)
    ProxyHandler.get_target_url = target_url
    return proxy_main()


def with_flag_values(args: list[str]) -> list[str]:
    """A bare `--host-routing` (followed by another option or nothing) becomes `--host-routing true`."""
    out = []
    for i, arg in enumerate(args):
        out.append(arg)
        if arg == "--host-routing" and (i + 1 == len(args) or args[i + 1].startswith("--")):
            out.append("true")
    return out


if __name__ == "__main__":
    sys.argv = ["configurable-http-proxy", *with_flag_values(sys.argv[1:])]
    sys.exit(main())
