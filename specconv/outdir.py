"""Crash-safe output directories: locked temp dirs, stale-dir cleanup, atomic swap.

A conversion writes into ``.<out>.tmp-<pid>-<rand>/`` next to the output and holds an
exclusive ``fcntl.flock`` on ``.<out>.tmp-<pid>-<rand>.lock`` for as long as it runs.
The kernel drops the lock when the process dies, however it dies (SIGKILL included), so
the next conversion to the same output can tell a stale temp dir (lock free) from a
concurrent run's (lock held) and removes only the stale ones.

``--overwrite`` swaps the finished temp dir with the existing output in one
``renameat2(RENAME_EXCHANGE)`` call (Linux ≥ 3.15, glibc ≥ 2.28), so at every instant
the output path holds either the complete previous output or the complete new one. Where
the exchange is unavailable the previous output is first renamed to
``.<out>.old-<pid>-<rand>`` (covered by the same lock); a run killed between the two
renames leaves it there and the next run puts it back before doing anything else.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from .errors import InvalidInputError

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


class OutputTemp:
    """A locked temp dir next to ``out_dir`` (``.<name>.tmp-<pid>-<rand>``).

    Attributes:
        path: the temp dir (mode 0700 until the writer fixes the modes).
        lock: the lock file beside it, held with ``LOCK_EX`` until :meth:`release`.
        old: where the previous output goes if the atomic exchange is unavailable.
    """

    def __init__(self, out_dir: Path) -> None:
        import fcntl
        import tempfile

        parent, name = out_dir.parent, out_dir.name
        # the dir first (a cleaner that sees it before its lock checks the pid in the name)
        self.path = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-{os.getpid()}-", dir=parent))
        tag = self.path.name[len(f".{name}.tmp-"):]
        self.lock = parent / f".{name}.tmp-{tag}.lock"
        self.old = parent / f".{name}.old-{tag}"
        try:
            self._fd = os.open(self.lock, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            os.rmdir(self.path)
            raise

    def release(self) -> None:
        """Remove the temp dir (and a left-over ``old``), then the lock file; unlock."""
        for d in (self.path, self.old):
            if d.exists():
                shutil.rmtree(d, ignore_errors=True)
        self.lock.unlink(missing_ok=True)
        os.close(self._fd)


def _lock_free(lock: Path) -> bool:
    """True when no live process holds ``lock`` (or it does not exist)."""
    import fcntl

    try:
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


#: A temp dir whose name carries no pid (an older specconv's) counts as stale only after this long.
_NO_PID_STALE_S = 24 * 3600


def _pid_alive(tag: str, d: Path) -> bool:
    """Whether the conversion that named its dir ``tag`` may still be running."""
    try:
        pid = int(tag.split("-", 1)[0])
    except ValueError:
        import time

        try:
            return time.time() - d.stat().st_mtime < _NO_PID_STALE_S
        except OSError:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale(out_dir: Path) -> list[str]:
    """Remove the temp dirs of dead conversions to ``out_dir``; restore a stale previous
    output (``.old-``) when ``out_dir`` itself is missing. A dir whose lock is held (a
    concurrent conversion) is never touched; a dir without a lock file (older specconv)
    is removed only when the pid in its name is gone.

    Returns:
        The names removed or restored (for logs and tests).
    """
    parent, name = out_dir.parent, out_dir.name
    if not parent.is_dir():
        return []
    done = []
    for kind in ("old", "tmp"):  # restore a previous output before deleting temp dirs
        for d in sorted(parent.glob(f".{name}.{kind}-*")):
            if d.name.endswith(".lock"):
                continue
            tag = d.name[len(f".{name}.{kind}-"):]
            lock = parent / f".{name}.tmp-{tag}.lock"
            if not (_lock_free(lock) if lock.exists() else not _pid_alive(tag, d)):
                continue
            if kind == "old" and not out_dir.exists() and not out_dir.is_symlink():
                os.rename(d, out_dir)
            else:
                shutil.rmtree(d, ignore_errors=True)
            done.append(d.name)
    for lock in parent.glob(f".{name}.tmp-*.lock"):
        if not (parent / lock.name[: -len(".lock")]).exists() and _lock_free(lock):
            lock.unlink(missing_ok=True)
    return done


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths (``renameat2(RENAME_EXCHANGE)``).

    Returns:
        False when the kernel, libc or filesystem cannot exchange (nothing changed).

    Raises:
        OSError: any other failure (nothing changed).
    """
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a))


def move_into_place(tmp: OutputTemp, out_dir: Path, overwrite: bool) -> None:
    """Put the finished ``tmp.path`` at ``out_dir`` (call with signals deferred).

    Without ``overwrite`` a plain rename; with it, an atomic exchange with the existing
    output (which then sits in ``tmp.path`` and is removed by :meth:`OutputTemp.release`),
    or the two-rename fallback that restores the previous output on failure.

    Raises:
        InvalidInputError: ``output_exists`` when ``out_dir`` appeared meanwhile without
            ``overwrite`` (nothing replaced).
        OSError: the rename failed; the previous output is back in place.
    """
    if out_dir.exists() and not overwrite:  # created meanwhile (another conversion)
        raise InvalidInputError(f"output {out_dir} appeared while converting; pass --overwrite to replace it",
                                code="output_exists")
    if overwrite and out_dir.exists() and exchange(tmp.path, out_dir):
        return
    moved = False
    if overwrite and out_dir.exists():
        try:
            os.replace(out_dir, tmp.old)
            moved = True
        except FileNotFoundError:  # removed meanwhile
            pass
    try:
        os.rename(tmp.path, out_dir)
    except OSError as e:
        if moved:
            os.replace(tmp.old, out_dir)  # put the previous output back
        if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
            raise InvalidInputError(f"output {out_dir} appeared while converting (another conversion?); "
                                    "nothing was replaced", code="output_exists") from e
        raise
