"""The one error type the loaders raise."""


class ModelLoadError(Exception):
    """A model file or folder cannot be loaded; the message names the file or field and the problem."""
