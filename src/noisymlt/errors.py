"""One exception type for every user-facing failure, so the CLI can print it without a traceback."""


class NoisyMLTError(Exception):
    """Bad input or configuration. The message names the file or key and what is wrong."""


def cause(exc: BaseException, limit: int = 300) -> str:
    """A library's exception as one short line, its type first: the messages of pandas, pyarrow and torch span
    lines, and a user's error is one line."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:limit]}"


def describe_os_error(exc: OSError) -> str:
    """One line for a failed file operation: the file, the cause, and what to do for the common ones."""
    import errno

    where = exc.filename or "a file"
    if exc.filename2:
        where = f"{where} -> {exc.filename2}"
    cause = exc.strerror or str(exc)
    if exc.errno == errno.ENOSPC:
        return (f"{where}: {cause} (the disk is full: free space and run again; finished work is kept and a "
                "training run resumes from its last checkpoint)")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"{where}: {cause} (this user may not write there: check the folder's owner and permissions)"
    if exc.errno == errno.EROFS:
        return f"{where}: {cause} (the file system is mounted read-only)"
    return f"{where}: {cause}"
