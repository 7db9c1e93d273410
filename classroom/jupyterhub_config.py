"""A ready JupyterHub configuration for one course machine (a few dozen learners) with the classroom service.

    jupyterhub -f classroom/jupyterhub_config.py

Settings come from environment variables so this file needs no editing for a class:

    DANTINOX_HUB_DOMAIN      the machine's name (default localhost); every learner's server is served from its
                             own origin, http://NAME.DOMAIN:PORT, and the service from
                             http://classroom--service.DOMAIN:PORT, so DOMAIN needs wildcard DNS (*.DOMAIN)
                             for learners on other machines (names under localhost reach this machine only)
    DANTINOX_HUB_PORT        public port of the hub's proxy (default 80 with pam, 8000 with shared)
    DANTINOX_HUB_API_PORT    the hub's own port on localhost (default 1001 with pam, 8081 with shared)
    DANTINOX_PROXY_API_PORT  the proxy's API port on localhost (default 1002 with pam, 8001 with shared)
    DANTINOX_CLASSROOM_PORT  the service's own port on localhost (default 1003 with pam, 10101 with shared)
    DANTINOX_CLASSROOM_DB    the service's SQLite file (default classroom-data/classroom.sqlite; its directory
                             is made 0700 and the file 0600, readable by the hub's OS account only); the
                             hub's own database, cookie secret and proxy pid file go into the same directory
    DANTINOX_INSTRUCTORS     comma-separated hub user names put in the hub group `instructors`
    DANTINOX_HUB_ADMINS      comma-separated hub admins (default: the instructors)
    DANTINOX_HUB_AUTH        `pam` (the default, for a class) or `shared` (a trial run on one trusted machine)

`pam`: learners and instructors log in with their own system accounts and JupyterHub's default spawner
runs each learner's server as that account (the hub runs as root). The service runs as the hub's account, so
no learner can read its database or stop it, and no learner can log in as an instructor without the
instructor's own system password. Every port a class component listens on (the proxy's public port and
API, the hub, the service) must be below the machine's first unprivileged port
(/proc/sys/net/ipv4/ip_unprivileged_port_start, normally 1024), which only root may bind: when one of them is
down for a moment (killed, restarting), no learner's process can listen in its place and collect the
tokens, cookies and answers sent to it. The hub refuses to start otherwise.

`shared`: one class password (DANTINOX_HUB_PASSWORD, at least 8 characters) logs anyone in under any name
that is not an instructor's or an admin's; those need DANTINOX_HUB_INSTRUCTOR_PASSWORD (at least 32
characters), and the hub refuses to start without it when there are any. A name once claimed with the class
password has no instructor rights even if it is later made an instructor, until someone logs in under it
with the instructor password, which revokes every token and session the name had before. Every learner's
server runs as the hub's own OS account (with --allow-root when that is root): any learner can read every
file that account can (the answer database included) and kill the service. Use it only for a trial on a
machine whose users all trust each other.

Every user server loads the environment's JupyterLab extensions but the course site's JupyterLite kernel
front end, which fails on every page of a server (a config folder of links made at each hub start, beside
the answers' folder: DATA-lab for a database in DATA, readable by every account; classroom/lab_extensions.py).
Learners' servers also start without nbgrader's extensions (LEARNER_JUPYTER_CONFIG, put on their
$JUPYTER_CONFIG_PATH at each spawn); instructors and admins keep them.

The hub starts the service (`python -m classroom.service`, the same as `dantinox classroom serve`) as a
managed service that stops when the hub process is gone (`--hub-pid`) and that the hub starts again within
SERVICE_POLL_S of its exit; it gives it a role that may read users and groups (to know who is an instructor),
and adds `access:services!service=classroom` to the `user` and `server` roles, keeping their defaults, so that
a learner's kernel (which holds its server's token) may post attempts. Kernels find the service through
$DANTINOX_CLASSROOM_URL, set here for every user server.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from classroom.lab_extensions import hub_lab_config

SERVICE_NAME = "classroom"
SERVICE_PORT = 10101  # the service's own port on localhost; the hub's proxy routes /services/classroom/ to it
INSTRUCTORS_GROUP = "instructors"
SERVICE_POLL_S = 1  # how often the hub looks whether its managed service is still running (JupyterHub: 30)
# per mode: public port, the hub's own port, the proxy's API port, the service's port. pam's are all below
# 1024, which only root may bind; shared mode keeps JupyterHub's (its learners run as the hub's account anyway)
PORTS = {"pam": (80, 1001, 1002, 1003), "shared": (8000, 8081, 8001, SERVICE_PORT)}
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


def configure(c, *, hub_port: int | None = None, db_path: str | Path = "classroom-data/classroom.sqlite",
              instructors: list[str] = (), admins: list[str] | None = None, service_port: int | None = None,
              managed: bool = True, api_token: str | None = None, python: str = sys.executable,
              hub_ip: str = "", service_name: str = SERVICE_NAME, auth: str = "pam",
              class_password: str | None = None, instructor_password: str | None = None,
              domain: str = "localhost", hub_api_port: int | None = None,
              proxy_api_port: int | None = None) -> None:
    """Fill a traitlets config `c` with the hub, the classroom service, its roles and the instructors group.

    auth="pam" logs in with system accounts (each learner's server runs as that account) and needs every
    port below the machine's first unprivileged one; auth="shared" is the trial mode: learners give
    `class_password`, instructors and admins `instructor_password` (required as soon as there is one). Ports
    left None take PORTS[auth]. Every user server and the service get their own origin under `domain`
    (JupyterHub's subdomain_host). managed=False registers a service that something else starts (the tests
    do, to kill and restart it); it then needs `api_token`, the token the service process holds."""
    if auth not in PORTS:
        raise ValueError(f"DANTINOX_HUB_AUTH: expected pam or shared, got {auth!r}")
    given = {"DANTINOX_HUB_PORT": hub_port, "DANTINOX_HUB_API_PORT": hub_api_port,
             "DANTINOX_PROXY_API_PORT": proxy_api_port, "DANTINOX_CLASSROOM_PORT": service_port}
    ports = {name: default if port is None else port for (name, port), default in zip(given.items(), PORTS[auth],
                                                                                       strict=True)}
    if auth == "pam":
        _require_privileged(ports)
    hub_port, hub_api_port, proxy_api_port, service_port = ports.values()
    data = Path(db_path).resolve().parent
    _private_dir(data)
    service_url = f"http://127.0.0.1:{service_port}"
    c.JupyterHub.bind_url = f"http://{hub_ip}:{hub_port}"
    c.JupyterHub.hub_ip, c.JupyterHub.hub_port = "127.0.0.1", hub_api_port
    c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{proxy_api_port}"
    # each learner's server in its own origin: a page a learner serves cannot act with an instructor's cookies
    c.JupyterHub.subdomain_host = f"http://{domain}:{hub_port}"
    # the hub's own files beside the answers, in the 0700 directory, not in the (world-readable) clone
    c.JupyterHub.db_url = f"sqlite:///{data / 'jupyterhub.sqlite'}"
    c.JupyterHub.cookie_secret_file = str(data / "jupyterhub_cookie_secret")
    c.ConfigurableHTTPProxy.pid_file = str(data / "jupyterhub-proxy.pid")
    service = {"name": service_name, "url": service_url, "oauth_no_confirm": True, "display": True}
    if managed:
        # no jax to import; --hub-pid: this file runs inside the hub, so the service stops when this process dies
        service["command"] = [python, "-m", "classroom.service", "--port", str(service_port),
                              "--hub-pid", str(os.getpid())]
        service["environment"] = {"DANTINOX_CLASSROOM_DB": str(Path(db_path).resolve())}
        _restart_services_promptly()
    else:
        if not api_token:
            raise ValueError("configure: managed=False needs api_token (the token the service process holds)")
        service["api_token"] = api_token
        service["oauth_client_id"] = f"service-{service_name}"  # its callback: on its own origin, as a managed one's
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
    lab = hub_lab_config(data.with_name(f"{data.name}-lab"))  # not in `data`: every account reads this one
    c.Spawner.environment = {"DANTINOX_CLASSROOM_URL": service_public_url(domain, hub_port, service_name),
                             "JUPYTER_CONFIG_PATH": str(lab)}
    c.Spawner.default_url = "/lab"
    c.Spawner.pre_spawn_hook = hide_nbgrader_from_learners
    c.Spawner.http_timeout = 120  # a server spawned while the machine is busy with a class takes its time
    c.Authenticator.allow_all = True  # pam: any account of this machine; shared: any name (narrow: allowed_users)
    if auth == "shared":
        _shared_password(c, class_password, instructor_password, [*instructors, *admins])


def service_public_url(domain: str, hub_port: int, service_name: str = SERVICE_NAME) -> str:
    """Where browsers and kernels reach the service: its own origin, as JupyterHub names it."""
    from jupyterhub.utils import subdomain_hook_idna

    return f"http://{subdomain_hook_idna(service_name, domain, 'service')}:{hub_port}/services/{service_name}"


def unprivileged_port_start() -> int:
    """The first port any account may bind (Linux's net.ipv4.ip_unprivileged_port_start; 1024 elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text())
    except (OSError, ValueError):
        return 1024


def _require_privileged(ports: dict[str, int]) -> None:
    first = unprivileged_port_start()
    for name, port in ports.items():
        if not 0 < port < first:
            raise ValueError(f"{name}: expected a port below {first} (only root may bind those, so no learner can "
                             f"listen there while the component is down), got {port}"
                             + ("; this machine lets any account bind every port: raise "
                                "net.ipv4.ip_unprivileged_port_start to 1024" if first <= 1 else ""))


def _private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_uid == os.getuid() and path.stat().st_mode & 0o077:
        os.chmod(path, 0o700)


def _restart_services_promptly() -> None:
    """Managed services are polled by a LocalProcessSpawner every `poll_interval` (30 s): a killed service
    stayed down that long. JupyterHub makes its service spawner without config, so its class is swapped for
    one that polls every SERVICE_POLL_S."""
    from jupyterhub.services import service as hub_services
    from traitlets import default

    spawner = getattr(hub_services, "_ServiceSpawner", None)
    if spawner is None or not hasattr(spawner, "poll_interval"):
        raise ValueError("jupyterhub: expected jupyterhub.services.service._ServiceSpawner (JupyterHub 5 or 6) "
                         "to shorten the service's restart; install a JupyterHub version pyproject.toml allows")
    if getattr(spawner, "dantinox_prompt", False):
        return

    class PromptServiceSpawner(spawner):
        dantinox_prompt = True

        @default("poll_interval")
        def _poll_interval(self):
            return SERVICE_POLL_S

    hub_services._ServiceSpawner = PromptServiceSpawner


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


def _port(name: str) -> int | None:
    value = os.environ.get(name, "")
    if not value:
        return None
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise ValueError(f"{name}: expected a port number 1 to 65535, got {value!r}")
    return int(value)


def _from_environment(c) -> None:
    env = os.environ
    if env.get("DANTINOX_HUB_ADMIN_PASSWORD"):
        raise ValueError("DANTINOX_HUB_ADMIN_PASSWORD: renamed DANTINOX_HUB_INSTRUCTOR_PASSWORD (instructors "
                         "need it too)")
    admins = _names(env["DANTINOX_HUB_ADMINS"]) if env.get("DANTINOX_HUB_ADMINS") else None
    domain = env.get("DANTINOX_HUB_DOMAIN", "localhost")
    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?", domain):
        raise ValueError(f"DANTINOX_HUB_DOMAIN: expected a host name such as class.example.edu, got {domain!r}")
    configure(c, hub_port=_port("DANTINOX_HUB_PORT"), hub_api_port=_port("DANTINOX_HUB_API_PORT"),
              proxy_api_port=_port("DANTINOX_PROXY_API_PORT"), service_port=_port("DANTINOX_CLASSROOM_PORT"),
              instructors=_names(env.get("DANTINOX_INSTRUCTORS", "")), admins=admins, domain=domain,
              db_path=env.get("DANTINOX_CLASSROOM_DB", "classroom-data/classroom.sqlite"),
              auth=env.get("DANTINOX_HUB_AUTH", "pam"), class_password=env.get("DANTINOX_HUB_PASSWORD"),
              instructor_password=env.get("DANTINOX_HUB_INSTRUCTOR_PASSWORD"))


if "get_config" in globals():  # loaded by `jupyterhub -f`, not imported
    try:
        _from_environment(get_config())  # noqa: F821
    except ValueError as err:  # a misconfigured class must not start: one line, no traceback
        sys.exit(f"classroom/jupyterhub_config.py: {err}")
