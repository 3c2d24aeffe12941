"""The one error a dataset that cannot be used raises: a one-line message for the user."""

from scaling.errors import UsageError


class DatasetError(UsageError):
    """A missing, empty or malformed dataset; raised before any worker starts where possible."""
