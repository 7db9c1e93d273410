"""A ready JupyterHub configuration for one course machine (a few dozen learners) with the classroom service.

    jupyterhub -f classroom/jupyterhub_config.py

Settings come from environment variables so this file needs no editing for a class:

    DANTINOX_HUB_PORT        public port of the hub's proxy (default 8000)
    DANTINOX_CLASSROOM_DB    the service's SQLite file (default classroom-data/classroom.sqlite)
    DANTINOX_INSTRUCTORS     comma-separated hub user names put in the hub group `instructors`
    DANTINOX_HUB_ADMINS      comma-separated hub admins (default: the instructors)
    DANTINOX_HUB_AUTH        `pam` (system accounts, the default) or `shared` (one class password, for a
                             trial run: set DANTINOX_HUB_PASSWORD, at least 8 characters; admins then
                             need DANTINOX_HUB_ADMIN_PASSWORD, or there are none)

The hub starts `dantinox classroom serve` as a managed service, gives it a role that may read users and
groups (to know who is an instructor), and adds `access:services!service=classroom` to the `user` and
`server` roles, keeping their defaults, so that a learner's kernel (which holds its server's token) may post
attempts. Kernels find the service through $DANTINOX_CLASSROOM_URL, set here for every user server.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SERVICE_NAME = "classroom"
SERVICE_PORT = 10101  # the service's own port on localhost; the hub's proxy routes /services/classroom/ to it


def _names(value: str) -> list[str]:
    return [n.strip() for n in value.split(",") if n.strip()]


def classroom_roles(service_name: str = SERVICE_NAME) -> list[dict]:
    """Roles for `c.JupyterHub.load_roles`: the default user and server roles plus access to the service."""
    from jupyterhub.roles import get_default_roles

    access = f"access:services!service={service_name}"
    defaults = {r["name"]: r for r in get_default_roles()}
    # a token's scopes are cut to its owner's, so the user role needs the scope too, not only the server role
    roles = [{**defaults[name], "scopes": [*defaults[name]["scopes"], access]} for name in ("user", "server")]
    roles.append({"name": f"{service_name}-service", "description": "read who is an instructor",
                  "scopes": ["read:users", "read:groups"], "services": [service_name]})
    return roles


def configure(c, *, hub_port: int = 8000, db_path: str | Path = "classroom-data/classroom.sqlite",
              instructors: list[str] = (), admins: list[str] | None = None, service_port: int = SERVICE_PORT,
              managed: bool = True, api_token: str | None = None, python: str = sys.executable,
              hub_ip: str = "", service_name: str = SERVICE_NAME) -> None:
    """Fill a traitlets config `c` with the hub, the classroom service, its roles and the instructors group.

    managed=False registers a service that something else starts (the tests do, to kill and restart it);
    it then needs `api_token`, the token the service process is given in $JUPYTERHUB_API_TOKEN."""
    service_url = f"http://127.0.0.1:{service_port}"
    c.JupyterHub.bind_url = f"http://{hub_ip}:{hub_port}"
    service = {"name": service_name, "url": service_url, "oauth_no_confirm": True, "display": True}
    if managed:
        service["command"] = [python, "-m", "dantinox_labs.cli", "classroom", "serve", "--port", str(service_port)]
        service["environment"] = {"DANTINOX_CLASSROOM_DB": str(Path(db_path).resolve())}
    else:
        if not api_token:
            raise ValueError("configure: managed=False needs api_token (the token the service process holds)")
        service["api_token"] = api_token
        service["oauth_client_id"] = f"service-{service_name}"
        service["oauth_redirect_uri"] = f"/services/{service_name}/oauth_callback"  # as a managed service's
    c.JupyterHub.services = [service]
    bin_dir = Path(python).parent  # the proxy and the user servers come from this environment, activated or not
    if (bin_dir / "configurable-http-proxy").exists():
        c.ConfigurableHTTPProxy.command = [str(bin_dir / "configurable-http-proxy")]
    if (bin_dir / "jupyterhub-singleuser").exists():
        c.Spawner.cmd = [str(bin_dir / "jupyterhub-singleuser")]
    c.JupyterHub.load_roles = classroom_roles(service_name)
    c.JupyterHub.load_groups = {"instructors": {"users": list(instructors)}}
    c.Authenticator.admin_users = set(instructors if admins is None else admins)
    c.Spawner.environment = {"DANTINOX_CLASSROOM_URL": f"http://127.0.0.1:{hub_port}/services/{service_name}"}
    c.Spawner.default_url = "/lab"


def _from_environment(c) -> None:
    env = os.environ
    instructors = _names(env.get("DANTINOX_INSTRUCTORS", ""))
    admins = _names(env["DANTINOX_HUB_ADMINS"]) if env.get("DANTINOX_HUB_ADMINS") else None
    configure(c, hub_port=int(env.get("DANTINOX_HUB_PORT", "8000")), instructors=instructors, admins=admins,
              db_path=env.get("DANTINOX_CLASSROOM_DB", "classroom-data/classroom.sqlite"))
    auth = env.get("DANTINOX_HUB_AUTH", "pam")
    if auth == "shared":
        password = env.get("DANTINOX_HUB_PASSWORD", "")
        if len(password) < 8:
            raise ValueError("DANTINOX_HUB_PASSWORD: expected a class password of at least 8 characters")
        c.JupyterHub.authenticator_class = "shared-password"
        c.SharedPasswordAuthenticator.user_password = password
        if env.get("DANTINOX_HUB_ADMIN_PASSWORD"):  # this authenticator makes admins log in with their own password
            c.SharedPasswordAuthenticator.admin_password = env["DANTINOX_HUB_ADMIN_PASSWORD"]
        else:
            c.Authenticator.admin_users = set()  # instructors still see everything through the group
        c.Authenticator.allow_all = True
        # one OS account runs every learner's server, each in its own home under /tmp: fine for a trial run
        c.JupyterHub.spawner_class = "simple"
    elif auth == "pam":
        c.Authenticator.allow_all = True  # any account on this machine may log in; narrow with allowed_users
    else:
        raise ValueError(f"DANTINOX_HUB_AUTH: expected pam or shared, got {auth!r}")


if "get_config" in globals():  # loaded by `jupyterhub -f`, not imported
    _from_environment(get_config())  # noqa: F821
