"""Crash-safe output directories: locked temp dirs, stale-dir cleanup, atomic swap, and what
``--overwrite`` may replace (docs/cli.md). The kernel drops a temp dir's ``flock`` however its
process dies (SIGKILL included), so a free lock marks a stale dir. The exchange needs Linux ≥ 3.15,
glibc ≥ 2.28; without it the previous output waits in ``.<out>.old-…`` (a killed run's is put back).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

from .errors import InvalidInputError, SpecconvError

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2

#: The most bytes of the output's name a temp sibling carries (NAME_MAX for any pid up to 10 digits).
STEM_MAX = 200
#: Hex digits of the name's sha256 a shortened stem ends with.
_STEM_HASH = 16


def sibling_stem(name: str) -> str:
    """The output's name as its temp siblings carry it: ``name`` up to :data:`STEM_MAX` bytes, else its
    head (whole characters), ``~`` and 16 hex digits of the sha256 of the whole name."""
    if len(os.fsencode(name)) <= STEM_MAX:
        return name
    head = name[:STEM_MAX]
    while len(os.fsencode(head)) > STEM_MAX - 1 - _STEM_HASH:
        head = head[:-1]
    return f"{head}~{hashlib.sha256(os.fsencode(name)).hexdigest()[:_STEM_HASH]}"


class OutputTemp:
    """A locked temp dir (``path``, mode 0700) next to ``out_dir``; ``lock`` held until :meth:`release`;
    ``old``: the previous output without the exchange; ``step``: for an OS error's message."""

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
    """Give ``path`` and everything under it the modes a plain ``mkdir`` / ``open`` would have."""
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
    """Remove the temp dirs of dead runs to ``out_dir`` (lock free, or no lock and pid gone); restore a
    stale ``.old-`` when ``out_dir`` is missing. Returns the names removed or restored."""
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
    """An OS error while an output was written (exit 3): names the output, the step and the reason."""

    code = "os_error"

    def __init__(self, out_dir: Path, step: str, error: OSError) -> None:
        reason = error.strerror or str(error)
        where = f" ({error.filename})" if error.filename and str(error.filename) != str(out_dir) else ""
        super().__init__(f"cannot write output {out_dir}: {step} failed: {reason}{where}", code="os_error")


@contextlib.contextmanager
def temp_output(out_dir: Path) -> Iterator[OutputTemp]:
    """The locked temp dir an output is written in (stale siblings cleaned first), released however it
    ends; an OS error meanwhile raises :class:`OutputWriteError`."""
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
    """Atomically swap two existing paths (``renameat2(RENAME_EXCHANGE)``); False when the kernel,
    libc or filesystem cannot (nothing changed). Raises OSError otherwise."""
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
    """Put the finished ``tmp.path`` at ``out_dir`` (signals deferred): a rename, or with ``overwrite``
    :func:`check_replaceable` again then the exchange (or two renames, undone on failure).

    Raises:
        InvalidInputError: ``output_exists`` (not replaceable, or appeared meanwhile). OSError: the
            rename failed; the previous output is back in place.
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
_Listing: TypeAlias = dict[str, str | None] | None


@dataclass(frozen=True)
class OutputKind:
    """A kind of directory specconv writes (one :data:`KINDS` entry): its ``record`` file and ``format``
    (None: ``listed`` decides); ``listed(dir, record)``: relative path → None (a file) or the kind a
    sub-directory is judged as, or None when the record is not this kind (may raise SpecconvError)."""

    name: str
    record: str
    format: str | None
    listed: Callable[[Path, dict], _Listing]


def conversion_kind(subdirs: Mapping[str, str]) -> OutputKind:
    """The conversion's kind: its ``output_files``, the card and ``subdirs`` (dir name → kind)."""

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
        if e.is_dir(follow_symlinks=False) and (own := listed.get(r)) is not None:  # its own kind
            sub = kinds[own]
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
    """Refuse to replace ``path`` unless specconv wrote it as ``kind`` (the one rule of ``--overwrite``,
    docs/cli.md). Reads only. Raises InvalidInputError (``output_exists``, exit 3)."""
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
    """The one check before writing an output of ``kind`` at ``path``; reads only.

    Raises:
        InvalidInputError: exit 3, ``output_is_input`` (``path`` is or holds ``drafter_dir``);
            ``output_exists``: not replaceable (with or without ``overwrite``), or exists without it.
    """
    path = Path(path)
    if drafter_dir is not None and (path.resolve() == Path(drafter_dir).resolve()
                                    or path.resolve() in Path(drafter_dir).resolve().parents):
        raise InvalidInputError(f"output {path} must not be the drafter dir or contain it", code="output_is_input")
    check_replaceable(path, kind, kinds)
    if not overwrite and (path.exists() or path.is_symlink()):
        raise InvalidInputError(f"output {path} exists; pass --overwrite to replace it", code="output_exists")
