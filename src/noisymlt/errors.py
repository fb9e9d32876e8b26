"""One exception type for every user-facing failure, so the CLI can print it without a traceback."""


class NoisyMLTError(Exception):
    """Bad input or configuration. The message names the file or key and what is wrong."""
