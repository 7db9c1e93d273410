"""Shared behaviour of the lab widgets."""

from __future__ import annotations

import contextlib


class QuietUpdates:
    """Mixin for a lab: set several controls at once and refresh once, not once per control.

    Observers call `refresh()` only when `self._quiet` is false; `with self._hold(): ...` silences them.
    """

    _quiet = False

    @contextlib.contextmanager
    def _hold(self):
        quiet, self._quiet = self._quiet, True
        try:
            yield
        finally:
            self._quiet = quiet
