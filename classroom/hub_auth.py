"""The class password authenticator: one shared password for learners, a second one for instructors and admins.

JupyterHub's `SharedPasswordAuthenticator` lets anyone with the class password log in as any user who is not
in `admin_users` — an instructor who is only in the `instructors` group included, and with them the
dashboard and every learner's answers. Here every privileged name (configured instructors, configured admins,
and any user the hub's database holds as an admin or as a member of the instructors group, so one added
later through the admin page too) must give the instructor password, and the class password never logs them in.

A name first claimed with the class password is put in the hub group `class_password_group`, and the classroom
service gives no instructor rights to its members: made an instructor later, that earlier session and its
tokens still read nothing but their own answers. The first login under the name with the instructor password
takes it out of the group and first revokes every token and session it had (the hub's cookie id is renewed),
so instructor rights always rest on the instructor password given at the time.
"""

from __future__ import annotations

from secrets import compare_digest

from jupyterhub.authenticators.shared import SharedPasswordAuthenticator
from traitlets import Set, Unicode

INSTRUCTORS_GROUP = "instructors"
CLASS_PASSWORD_GROUP = "class-password-names"  # names claimed with the class password (see above)


class ClassroomPasswordAuthenticator(SharedPasswordAuthenticator):
    """Shared-password login where instructors and admins need `admin_password` (the instructor password)."""

    instructor_users = Set(Unicode(), config=True, help="names that log in only with the instructor password")
    instructor_group = Unicode(INSTRUCTORS_GROUP, config=True, help="hub group whose members are instructors")
    class_password_group = CLASS_PASSWORD_GROUP  # the service reads the same name: not configurable

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
            model = await super().authenticate(handler, data)
            if model and handler is not None:
                self._mark_class_password_name(handler.db, name)
            return model
        if self.admin_password and compare_digest(data["password"], self.admin_password):
            if handler is not None:
                self._revoke_class_password_sessions(handler.db, name)
            model = {"name": name}
            if name in self.admin_users:
                model["admin"] = True
            return model
        self.log.warning("instructor or admin %r: refused, the class password does not log them in", name)
        return None

    def _mark_class_password_name(self, db, name: str) -> None:
        """Record that `name` logged in with the class password (the hub makes the user if it is new)."""
        from jupyterhub import orm

        user = orm.User.find(db, name)
        if user is None:  # a first login: the hub would make the user next, from the name it is given
            user = orm.User(name=name)
            db.add(user)
        group = orm.Group.find(db, self.class_password_group)
        if group is None:
            group = orm.Group(name=self.class_password_group)
            db.add(group)
        if group not in user.groups:
            user.groups.append(group)
        db.commit()

    def _revoke_class_password_sessions(self, db, name: str) -> None:
        """Before `name` logs in with the instructor password: if it was claimed with the class password, every
        token and hub cookie it had stops working and it leaves the class-password group."""
        from jupyterhub import orm
        from jupyterhub.utils import new_token

        user = orm.User.find(db, name)
        if user is None or not any(g.name == self.class_password_group for g in user.groups):
            return
        for token in list(user.api_tokens):  # API, server and OAuth tokens (a service's cookie holds one)
            db.delete(token)
        user.cookie_id = new_token()  # the hub's login cookies of earlier sessions name the old id
        user.groups = [g for g in user.groups if g.name != self.class_password_group]
        db.commit()
        self.log.warning("%r: first login with the instructor password; revoked the tokens and sessions of its "
                         "class-password logins", name)
