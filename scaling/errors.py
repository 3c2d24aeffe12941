"""Errors the user can fix. The CLI prints their message as one line and exits with status 2."""


class UsageError(Exception):
    """Bad input or an impossible request: one line that names the problem and the fix."""
