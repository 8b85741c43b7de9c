"""The one error type the backends raise."""


class BackendError(Exception):
    """A backend cannot be created or cannot run here; the message says which backend and why.

    Callers above the engine (settings, CLI) turn it into their own error type."""
