"""A ready JupyterHub configuration for one course machine (a few dozen learners) with the classroom service.

    jupyterhub -f classroom/jupyterhub_config.py

Settings come from environment variables so this file needs no editing for a class:

    DANTINOX_HUB_PORT        public port of the hub's proxy (default 8000)
    DANTINOX_CLASSROOM_PORT  the service's own port on localhost (default 10101)
    DANTINOX_CLASSROOM_DB    the service's SQLite file (default classroom-data/classroom.sqlite; its directory
                             is made 0700 and the file 0600, readable by the hub's OS account only)
    DANTINOX_INSTRUCTORS     comma-separated hub user names put in the hub group `instructors`
    DANTINOX_HUB_ADMINS      comma-separated hub admins (default: the instructors)
    DANTINOX_HUB_AUTH        `pam` (the default, for a class) or `shared` (a trial run on one trusted machine)

`pam`: learners and instructors log in with their own system accounts and JupyterHub's default spawner
runs each learner's server as that account (the hub runs as root). The service runs as the hub's account, so
no learner can read its database or stop it, and no learner can log in as an instructor without the
instructor's own system password.

`shared`: one class password (DANTINOX_HUB_PASSWORD, at least 8 characters) logs anyone in under any name
that is not an instructor's or an admin's; those need DANTINOX_HUB_INSTRUCTOR_PASSWORD (at least 32
characters), and the hub refuses to start without it when there are any. Every learner's server runs as the
hub's own OS account (with --allow-root when that is root): any learner can read every file that account can
(the answer database included) and kill the service. Use it only for a trial on a machine whose users all
trust each other.

Learners' servers start without nbgrader's extensions (LEARNER_JUPYTER_CONFIG, put on their
$JUPYTER_CONFIG_PATH at each spawn); instructors and admins keep them.

The hub starts the service (`python -m classroom.service`, the same as `dantinox classroom serve`) as a
managed service that stops when the hub process is gone (`--hub-pid`), gives it a role that may read users
and groups (to know who is an instructor), and adds `access:services!service=classroom` to the `user` and
`server` roles, keeping their defaults, so that a learner's kernel (which holds its server's token) may
post attempts. Kernels find the service through $DANTINOX_CLASSROOM_URL, set here for every user server.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SERVICE_NAME = "classroom"
SERVICE_PORT = 10101  # the service's own port on localhost; the hub's proxy routes /services/classroom/ to it
INSTRUCTORS_GROUP = "instructors"
# a Jupyter config folder (for $JUPYTER_CONFIG_PATH) that turns off nbgrader's server and lab extensions: its
# menus, Validate button and Create Assignment panel are for instructors, who keep them
LEARNER_JUPYTER_CONFIG = Path(__file__).resolve().with_name("learner_jupyter")


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


def hide_nbgrader_from_learners(spawner) -> None:
    """`Spawner.pre_spawn_hook`: a learner's server starts without nbgrader's extensions (LEARNER_JUPYTER_CONFIG);
    hub admins and members of the instructors group, as the hub knows them at this spawn, keep them."""
    user = spawner.user
    if user.admin or INSTRUCTORS_GROUP in {group.name for group in user.groups}:
        return
    paths = [str(LEARNER_JUPYTER_CONFIG), *filter(None, spawner.environment.get("JUPYTER_CONFIG_PATH", "").split(
        os.pathsep))]
    spawner.environment = {**spawner.environment, "JUPYTER_CONFIG_PATH": os.pathsep.join(paths)}  # not the shared dict


def configure(c, *, hub_port: int = 8000, db_path: str | Path = "classroom-data/classroom.sqlite",
              instructors: list[str] = (), admins: list[str] | None = None, service_port: int = SERVICE_PORT,
              managed: bool = True, api_token: str | None = None, python: str = sys.executable,
              hub_ip: str = "", service_name: str = SERVICE_NAME, auth: str = "pam",
              class_password: str | None = None, instructor_password: str | None = None) -> None:
    """Fill a traitlets config `c` with the hub, the classroom service, its roles and the instructors group.

    auth="pam" logs in with system accounts (each learner's server runs as that account); auth="shared" is the
    trial mode: learners give `class_password`, instructors and admins `instructor_password` (required as
    soon as there is one). managed=False registers a service that something else starts (the tests do, to
    kill and restart it); it then needs `api_token`, the token the service process holds."""
    service_url = f"http://127.0.0.1:{service_port}"
    c.JupyterHub.bind_url = f"http://{hub_ip}:{hub_port}"
    service = {"name": service_name, "url": service_url, "oauth_no_confirm": True, "display": True}
    if managed:
        # no jax to import; --hub-pid: this file runs inside the hub, so the service stops when this process dies
        service["command"] = [python, "-m", "classroom.service", "--port", str(service_port),
                              "--hub-pid", str(os.getpid())]
        service["environment"] = {"DANTINOX_CLASSROOM_DB": str(Path(db_path).resolve())}
    else:
        if not api_token:
            raise ValueError("configure: managed=False needs api_token (the token the service process holds)")
        service["api_token"] = api_token
        service["oauth_client_id"] = f"service-{service_name}"
        service["oauth_redirect_uri"] = f"/services/{service_name}/oauth_callback"  # as a managed service's
    c.JupyterHub.services = [service]
    bin_dir = Path(python).parent  # the proxy and the user servers come from this environment, activated or not
    if (bin_dir / "configurable-http-proxy").exists():  # the pure-Python proxy, with room for a class's requests
        c.ConfigurableHTTPProxy.command = [python, "-m", "classroom.proxy"]
    if (bin_dir / "jupyterhub-singleuser").exists():
        c.Spawner.cmd = [str(bin_dir / "jupyterhub-singleuser")]
    c.JupyterHub.load_roles = classroom_roles(service_name)
    c.JupyterHub.load_groups = {INSTRUCTORS_GROUP: {"users": list(instructors)}}
    admins = list(instructors if admins is None else admins)
    c.Authenticator.admin_users = set(admins)
    c.Spawner.environment = {"DANTINOX_CLASSROOM_URL": f"http://127.0.0.1:{hub_port}/services/{service_name}"}
    c.Spawner.default_url = "/lab"
    c.Spawner.pre_spawn_hook = hide_nbgrader_from_learners
    c.Spawner.http_timeout = 120  # a server spawned while the machine is busy with a class takes its time
    c.Authenticator.allow_all = True  # pam: any account of this machine; shared: any name (narrow: allowed_users)
    if auth == "shared":
        _shared_password(c, class_password, instructor_password, [*instructors, *admins])
    elif auth != "pam":
        raise ValueError(f"DANTINOX_HUB_AUTH: expected pam or shared, got {auth!r}")


def _shared_password(c, class_password: str | None, instructor_password: str | None,
                     privileged: list[str]) -> None:
    from classroom.hub_auth import ClassroomPasswordAuthenticator

    if not class_password or len(class_password) < 8:
        raise ValueError("DANTINOX_HUB_PASSWORD: expected a class password of at least 8 characters")
    if privileged and not instructor_password:
        raise ValueError(f"DANTINOX_HUB_INSTRUCTOR_PASSWORD: expected a password for the instructors and admins "
                         f"({', '.join(sorted(set(privileged)))}) in shared mode, got none: with the class "
                         f"password alone any learner could log in as them")
    if instructor_password and (len(instructor_password) < 32 or instructor_password == class_password):
        raise ValueError("DANTINOX_HUB_INSTRUCTOR_PASSWORD: expected at least 32 characters, "
                         "different from the class password")
    c.JupyterHub.authenticator_class = ClassroomPasswordAuthenticator
    c.SharedPasswordAuthenticator.user_password = class_password
    if instructor_password:
        c.SharedPasswordAuthenticator.admin_password = instructor_password
    c.ClassroomPasswordAuthenticator.instructor_users = set(privileged)
    # a trial run: every learner's server runs as the hub's own OS account (each in a home under /tmp), so any
    # learner can read the service's files and stop its process. Not for a class whose answers matter.
    c.JupyterHub.spawner_class = "simple"
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        c.Spawner.args = ["--allow-root"]  # the hub's account is root here, and Jupyter refuses root without it


def _port(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    if not value:
        return default
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise ValueError(f"{name}: expected a port number 1 to 65535, got {value!r}")
    return int(value)


def _from_environment(c) -> None:
    env = os.environ
    if env.get("DANTINOX_HUB_ADMIN_PASSWORD"):
        raise ValueError("DANTINOX_HUB_ADMIN_PASSWORD: renamed DANTINOX_HUB_INSTRUCTOR_PASSWORD (instructors "
                         "need it too)")
    admins = _names(env["DANTINOX_HUB_ADMINS"]) if env.get("DANTINOX_HUB_ADMINS") else None
    configure(c, hub_port=_port("DANTINOX_HUB_PORT", 8000),
              instructors=_names(env.get("DANTINOX_INSTRUCTORS", "")), admins=admins,
              service_port=_port("DANTINOX_CLASSROOM_PORT", SERVICE_PORT),
              db_path=env.get("DANTINOX_CLASSROOM_DB", "classroom-data/classroom.sqlite"),
              auth=env.get("DANTINOX_HUB_AUTH", "pam"), class_password=env.get("DANTINOX_HUB_PASSWORD"),
              instructor_password=env.get("DANTINOX_HUB_INSTRUCTOR_PASSWORD"))


if "get_config" in globals():  # loaded by `jupyterhub -f`, not imported
    try:
        _from_environment(get_config())  # noqa: F821
    except ValueError as err:  # a misconfigured class must not start: one line, no traceback
        sys.exit(f"classroom/jupyterhub_config.py: {err}")
