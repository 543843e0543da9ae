"""Crash-safe output directories: locked temp dirs, stale-dir cleanup, atomic swap.

A conversion writes into ``.<out>.tmp-<pid>-<rand>/`` next to the output and holds an
exclusive ``fcntl.flock`` on ``.<out>.tmp-<pid>-<rand>.lock`` for as long as it runs.
``<out>`` is the output's name, or for a name too long to leave room for the rest within
``NAME_MAX`` (255 bytes) its head and a hash of the whole name (:func:`sibling_stem`), so every
legal ``-o`` name can be written and its siblings are still found by :func:`clean_stale`.
The kernel drops the lock when the process dies, however it dies (SIGKILL included), so
the next conversion to the same output can tell a stale temp dir (lock free) from a
concurrent run's (lock held) and removes only the stale ones.

``--overwrite`` swaps the finished temp dir with the existing output in one
``renameat2(RENAME_EXCHANGE)`` call (Linux ≥ 3.15, glibc ≥ 2.28), so at every instant
the output path holds either the complete previous output or the complete new one. Where
the exchange is unavailable the previous output is first renamed to
``.<out>.old-<pid>-<rand>`` (covered by the same lock); a run killed between the two
renames leaves it there and the next run puts it back before doing anything else.

What ``--overwrite`` may replace is decided here, once (:func:`check_replaceable`, docs/cli.md).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping
from typing import Callable, Iterator

from .errors import InvalidInputError, SpecconvError

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2

#: The most bytes of the output's name a temp sibling carries: ``.`` + it + ``.tmp-<pid>-<8
#: random chars>.lock`` stays within NAME_MAX (255) for any pid up to 10 digits.
STEM_MAX = 200
#: Hex digits of the name's sha256 a shortened stem ends with.
_STEM_HASH = 16


def sibling_stem(name: str) -> str:
    """The output's name as its temp siblings (``.<stem>.tmp-…``, ``.<stem>.old-…``) carry it:
    ``name`` itself when it has at most :data:`STEM_MAX` bytes, else its longest head (whole
    characters) that leaves room for ``~`` and 16 hex digits of the sha256 of the whole name.
    One name always gives the same stem, two names (almost surely) two stems."""
    if len(os.fsencode(name)) <= STEM_MAX:
        return name
    head = name[:STEM_MAX]
    while len(os.fsencode(head)) > STEM_MAX - 1 - _STEM_HASH:
        head = head[:-1]
    return f"{head}~{hashlib.sha256(os.fsencode(name)).hexdigest()[:_STEM_HASH]}"


class OutputTemp:
    """A locked temp dir next to ``out_dir`` (``.<stem>.tmp-<pid>-<rand>``, :func:`sibling_stem`).

    Attributes:
        path: the temp dir (mode 0700 until the writer fixes the modes).
        lock: the lock file beside it, held with ``LOCK_EX`` until :meth:`release`.
        old: where the previous output goes if the atomic exchange is unavailable.
        step: what is being done with the output now, for an OS error's message
            (:func:`temp_output`; :func:`move_into_place` sets its own).
    """

    def __init__(self, out_dir: Path) -> None:
        import fcntl
        import tempfile

        parent, stem = out_dir.parent, sibling_stem(out_dir.name)
        self.step = "writing its files"
        # the dir first (a cleaner that sees it before its lock checks the pid in the name)
        self.path = Path(tempfile.mkdtemp(prefix=f".{stem}.tmp-{os.getpid()}-", dir=parent))
        tag = self.path.name[len(f".{stem}.tmp-"):]
        self.lock = parent / f".{stem}.tmp-{tag}.lock"
        self.old = parent / f".{stem}.old-{tag}"
        try:
            self._fd = os.open(self.lock, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            os.rmdir(self.path)
            raise

    def release(self) -> None:
        """Remove the temp dir (and a left-over ``old``), then the lock file; unlock."""
        for d in (self.path, self.old):
            if d.is_symlink():  # a replaced symlink output: the link goes, its target stays
                d.unlink()
            elif d.exists():
                shutil.rmtree(d, ignore_errors=True)
        self.lock.unlink(missing_ok=True)
        os.close(self._fd)


def public_modes(path: Path) -> None:
    """Give ``path`` (an :class:`OutputTemp` dir, mode 0700) and everything under it the modes
    a plain ``mkdir`` / ``open`` would have (0777 / 0666 less the umask)."""
    umask = os.umask(0)
    os.umask(umask)
    for p in [path, *path.rglob("*")]:
        os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~umask)


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
    parent, stem = out_dir.parent, sibling_stem(out_dir.name)
    if not parent.is_dir():
        return []
    names = sorted(os.listdir(parent))  # prefixes compared as text: a name may hold glob characters
    done = []
    for kind in ("old", "tmp"):  # restore a previous output before deleting temp dirs
        prefix = f".{stem}.{kind}-"
        for d in (parent / n for n in names if n.startswith(prefix) and not n.endswith(".lock")):
            tag = d.name[len(prefix):]
            lock = parent / f".{stem}.tmp-{tag}.lock"
            if not (_lock_free(lock) if lock.exists() else not _pid_alive(tag, d)):
                continue
            if kind == "old" and not out_dir.exists() and not out_dir.is_symlink():
                os.rename(d, out_dir)
            else:
                shutil.rmtree(d, ignore_errors=True)
            done.append(d.name)
    for lock in (parent / n for n in names if n.startswith(f".{stem}.tmp-") and n.endswith(".lock")):
        if not (parent / lock.name[: -len(".lock")]).exists() and _lock_free(lock):
            lock.unlink(missing_ok=True)
    return done


class OutputWriteError(InvalidInputError):
    """An OS error while an output was being written (exit 3, ``os_error``): the message names
    the output path, the step and the OS's reason (with the file it names)."""

    code = "os_error"

    def __init__(self, out_dir: Path, step: str, error: OSError) -> None:
        reason = error.strerror or str(error)
        where = f" ({error.filename})" if error.filename and str(error.filename) != str(out_dir) else ""
        super().__init__(f"cannot write output {out_dir}: {step} failed: {reason}{where}", code="os_error")


@contextlib.contextmanager
def temp_output(out_dir: Path) -> Iterator[OutputTemp]:
    """The locked temp dir an output is written in: its parent created, stale siblings cleaned
    (:func:`clean_stale`), released (removed, unlocked) on the way out, however it ends. An OS
    error meanwhile becomes :class:`OutputWriteError` naming ``out_dir`` and the step
    (:attr:`OutputTemp.step`: creating the temp dir, writing, moving into place).

    Raises:
        OutputWriteError: exit 3, ``os_error``.
    """
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        clean_stale(out_dir)
        tmp = OutputTemp(out_dir)
    except OSError as e:
        raise OutputWriteError(out_dir, "creating its temporary directory beside it", e) from e
    try:
        yield tmp
    except OSError as e:
        raise OutputWriteError(out_dir, tmp.step, e) from e
    finally:
        tmp.release()


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


def move_into_place(tmp: OutputTemp, out_dir: Path, overwrite: bool, kind: str, kinds: Kinds | None = None) -> None:
    """Put the finished ``tmp.path`` at ``out_dir`` (call with signals deferred).

    Without ``overwrite`` a plain rename; with it, :func:`check_replaceable` (``kind``) once
    more, on what is there now, then an atomic exchange with the existing output (which then
    sits in ``tmp.path`` and is removed by :meth:`OutputTemp.release`), or the two-rename
    fallback that restores the previous output on failure.

    Raises:
        InvalidInputError: ``output_exists`` when ``out_dir`` is not replaceable, or appeared
            meanwhile without ``overwrite`` (nothing replaced).
        OSError: the rename failed; the previous output is back in place.
    """
    tmp.step = "moving it into place"
    if overwrite or out_dir.exists():  # what is there now, not what was there at the start
        check_replaceable(out_dir, kind, kinds)  # a refusal stands with or without --overwrite
    if out_dir.exists() and not overwrite:  # created meanwhile (another run)
        raise InvalidInputError(f"output {out_dir} appeared while writing; pass --overwrite to replace it",
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
            raise InvalidInputError(f"output {out_dir} appeared while writing (another run?); "
                                    "nothing was replaced", code="output_exists") from e
        raise


# --------------------------------------------------------------- what --overwrite may replace
_Listing = "dict[str, str | None] | None"


@dataclass(frozen=True)
class OutputKind:
    """A kind of directory specconv writes, and so may replace (one :data:`KINDS` entry).

    Attributes:
        name: what messages call it (``conversion``).
        record: the file inside that marks the kind (always an allowed entry).
        format: the record's ``format`` value (None: ``listed`` alone decides).
        listed: ``(dir, record JSON object) →`` the other entries the record lists (relative
            POSIX path → None for a file, or the :data:`KINDS` key a sub-directory is judged
            as), or None when the record does not describe this kind; may raise
            :class:`~specconv.errors.SpecconvError` for an unreadable record. Listed entries
            may be absent.
    """

    name: str
    record: str
    format: str | None
    listed: Callable[[Path, dict], _Listing]


def conversion_kind(subdirs: Mapping[str, str]) -> OutputKind:
    """The conversion's kind: ``specconv.json`` with a conversion section lists its ``output_files``,
    the local card and ``subdirs`` (an export's directory name → the kind it is judged as)."""

    def listed(d: Path, raw: dict) -> _Listing:
        from .record import read_record

        conv = read_record(d).conversion
        if conv is None:
            return None
        return {**dict.fromkeys(conv.output_files), "README.md": None, **subdirs}

    return OutputKind("conversion", "specconv.json", None, listed)


def files_listed(d: Path, rec: dict) -> _Listing:
    """A record whose ``files`` (a list, or a dict keyed by path) names every file beside it."""
    files = rec.get("files")
    if not isinstance(files, (list, dict)) or not all(isinstance(f, str) for f in files):
        return None
    return dict.fromkeys(files)


#: the kinds every run knows; the engines' kinds join them (``specconv.engines.exportdir.output_kinds``)
KINDS: dict[str, OutputKind] = {"conversion": conversion_kind({})}
#: the kinds a check may judge: a mapping, or a function returning one (called only when needed)
Kinds = Mapping[str, OutputKind] | Callable[[], Mapping[str, OutputKind]]


def _kinds(kinds: Kinds | None) -> Mapping[str, OutputKind]:
    if kinds is None:
        return KINDS
    return kinds() if callable(kinds) else kinds


def _listing(d: Path, kind: OutputKind) -> tuple[_Listing, str]:
    """(the entries ``d``'s record lists, "") or (None, why ``d`` is not this kind)."""
    p = d / kind.record
    if p.is_symlink():
        return None, f"{kind.record} is a symlink"
    if not p.is_file():
        return None, f"no {kind.record}"
    try:
        rec = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return None, f"{kind.record} is not readable JSON ({e})"
    if not isinstance(rec, dict):
        return None, f"{kind.record} is not a JSON object"
    if kind.format is not None and rec.get("format") != kind.format:
        return None, f"{kind.record} has format {rec.get('format')!r}, not {kind.format!r}"
    try:
        listed = kind.listed(d, rec)
    except SpecconvError as e:
        return None, e.message
    if listed is None:
        return None, f"{kind.record} does not describe a specconv {kind.name}"
    return {**listed, kind.record: None}, ""


def _entries(d: Path) -> list[str]:
    """The names in ``d``, directories with a trailing ``/``."""
    return [e.name + ("/" if e.is_dir(follow_symlinks=False) else "") for e in _scan(d)]


def _scan(d: Path) -> list[os.DirEntry]:
    return sorted(os.scandir(d), key=lambda e: e.name)


def _judge(d: Path, kind: OutputKind, kinds: Mapping[str, OutputKind]) -> tuple[str, list[str]]:
    """("", []) when ``d`` may be replaced as ``kind``; else (why it is not that kind at all,
    what it holds) or ("", the entries its record does not list, relative to ``d``)."""
    found = _entries(d)
    if not found:
        return "", []
    listed, why = _listing(d, kind)
    if listed is None:
        return why, found
    parents = {"/".join(p.split("/")[:i]) for p in listed for i in range(1, p.count("/") + 1)}
    return "", _unlisted(d, listed, parents, "", kinds)


def _unlisted(d: Path, listed: dict[str, str | None], parents: set[str], rel: str,
              kinds: Mapping[str, OutputKind]) -> list[str]:
    """The entries under ``d`` (relative path ``rel``) that ``listed`` does not name."""
    out = []
    for e in _scan(d):
        r = rel + e.name
        if e.is_dir(follow_symlinks=False) and listed.get(r) is not None:  # its own kind
            sub = kinds[listed[r]]
            why, found = _judge(Path(e.path), sub, kinds)
            out += [f"{r}/ (not a specconv {sub.name}: {why})"] if why else [f"{r}/{f}" for f in found]
        elif e.is_dir(follow_symlinks=False) and r in parents:
            out += _unlisted(Path(e.path), listed, parents, r + "/", kinds)
        elif e.is_dir(follow_symlinks=False):
            out.append(r + "/")
        elif r not in listed or listed[r] is not None:
            out.append(r)
    return out


def _some(names: list[str], n: int = 8) -> str:
    more = f" and {len(names) - n} more" if len(names) > n else ""
    return ", ".join(names[:n]) + more


def check_replaceable(path: str | os.PathLike, kind: str, kinds: Kinds | None = None) -> None:
    """Refuse to replace ``path`` unless specconv wrote it (the one rule of ``--overwrite``).

    Replaceable: a missing path, an empty directory, or specconv's own output of ``kind``
    (a :data:`KINDS` key) holding nothing its record does not list (a listed sub-directory
    of another kind, e.g. a conversion's ``onnx/``, is judged by that kind's rule). A
    symlink is judged by the directory it points to. ``'.'``, ``'..'`` and ``'/'`` are
    refused by name. Reads only; call it before anything is moved or deleted.

    Raises:
        InvalidInputError: exit 3, ``output_exists``; the message names ``path`` (and a
            symlink's target) and what was found there.
    """
    path = Path(path)
    if path.name in ("", ".", ".."):
        raise InvalidInputError(f"output {str(path)!r} must name a directory to create (not '.', '..' or '/')",
                                code="output_exists")
    if not path.exists() and not path.is_symlink():
        return
    shown = f"{path} (a symlink to {os.path.realpath(path)})" if path.is_symlink() else str(path)
    if not path.is_dir():
        raise InvalidInputError(f"output {shown} exists and is not a directory; refusing to replace it",
                                code="output_exists")
    table = _kinds(kinds)
    k = table[kind]
    why, found = _judge(path.resolve(), k, table)
    if why:
        raise InvalidInputError(
            f"refusing to replace {shown}: it is not empty and not a specconv {k.name} ({why}); "
            f"it holds {_some(found)}; nothing was touched", code="output_exists",
            hint="choose an output that does not exist, is empty or holds specconv's own output")
    if found:
        raise InvalidInputError(
            f"refusing to replace {shown}: it holds what specconv did not write (its {k.record} does not "
            f"list it): {_some(found)}; nothing was touched", code="output_exists",
            hint="move those files out of the directory, or choose another output")


def check_output(path: str | os.PathLike, kind: str, overwrite: bool, *,
                 drafter_dir: str | os.PathLike | None = None, kinds: Kinds | None = None) -> None:
    """The one check before writing an output of ``kind`` (a :data:`KINDS` key) at ``path``.

    An export's output must not be its ``drafter_dir`` or contain it (checked first, when
    given). What :func:`check_replaceable` refuses is refused with or without ``overwrite`` (its
    message, never a suggestion to pass ``--overwrite``); what it accepts, if it exists,
    still needs ``overwrite``. Reads only.

    Raises:
        InvalidInputError: exit 3, ``output_is_input``: ``path`` is ``drafter_dir`` or holds it;
            ``output_exists``: not replaceable, or it exists and ``overwrite`` is false (the
            hint then is ``--overwrite``, which would replace it).
    """
    path = Path(path)
    if drafter_dir is not None and (path.resolve() == Path(drafter_dir).resolve()
                                    or path.resolve() in Path(drafter_dir).resolve().parents):
        raise InvalidInputError(f"output {path} must not be the drafter dir or contain it", code="output_is_input")
    check_replaceable(path, kind, kinds)
    if not overwrite and (path.exists() or path.is_symlink()):
        raise InvalidInputError(f"output {path} exists; pass --overwrite to replace it", code="output_exists")
