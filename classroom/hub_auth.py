"""The class password authenticator: one shared password for learners, a second one for instructors and admins.

JupyterHub's `SharedPasswordAuthenticator` lets anyone with the class password log in as any user who is not
in `admin_users` — an instructor who is only in the `instructors` group included, and with them the
dashboard and every learner's answers. Here every privileged name (configured instructors, configured admins,
and any user the hub's database holds as an admin or as a member of the instructors group, so one added
later through the admin page too) must give the instructor password, and the class password never logs them in.
"""

from __future__ import annotations

from secrets import compare_digest

from jupyterhub.authenticators.shared import SharedPasswordAuthenticator
from traitlets import Set, Unicode

INSTRUCTORS_GROUP = "instructors"


class ClassroomPasswordAuthenticator(SharedPasswordAuthenticator):
    """Shared-password login where instructors and admins need `admin_password` (the instructor password)."""

    instructor_users = Set(Unicode(), config=True, help="names that log in only with the instructor password")
    instructor_group = Unicode(INSTRUCTORS_GROUP, config=True, help="hub group whose members are instructors")

    def privileged(self, handler, name: str) -> bool:
        """Whether `name` is an instructor or an admin, by configuration or in the hub's database."""
        if name in self.admin_users or name in self.instructor_users:
            return True
        from jupyterhub import orm

        user = orm.User.find(handler.db, name) if handler is not None else None
        return user is not None and (user.admin or any(g.name == self.instructor_group for g in user.groups))

    async def authenticate(self, handler, data):
        name = self.normalize_username(data["username"])
        if not self.privileged(handler, name):
            return await super().authenticate(handler, data)
        if self.admin_password and compare_digest(data["password"], self.admin_password):
            model = {"name": name}
            if name in self.admin_users:
                model["admin"] = True
            return model
        self.log.warning("instructor or admin %r: refused, the class password does not log them in", name)
        return None
