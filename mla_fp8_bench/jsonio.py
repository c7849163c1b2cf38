"""Files read only when they are regular files, written atomically (a temp file renamed into place), and
locked for read-modify-write; every failure is one line naming the file, the old file left intact."""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any


class OutputError(OSError, ValueError):
    """An output cannot be written or is locked by another writer (a ValueError for the CLI: exit 2)."""


def read_text(path: str | os.PathLike, what: str, error: type[Exception] = ValueError) -> str:
    """The text of ``path`` if a regular file (a FIFO or device is refused, never waited on); else ``error``
    naming ``what`` and the file."""
    why = None
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            if stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return f.read().decode()
            why = "it is not a regular file"
    except OSError as exc:
        why = exc.strerror or str(exc)
    except UnicodeDecodeError as exc:
        why = f"it is not UTF-8 text (byte {exc.start})"
    raise error(f"cannot read {what} {path}: {why}")


def load_json(path: str | os.PathLike, what: str, error: type[Exception] = ValueError, hint: str = "") -> Any:
    """The JSON document of ``path`` (:func:`read_text`); ``error`` naming ``what`` and the file on any
    failure, ``hint`` ending the invalid-JSON message."""
    text = read_text(path, what, error)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{what} {path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
                    + (f"; {hint}" if hint else "")) from None
    except (ValueError, RecursionError) as exc:  # an integer past the digit limit, nesting past the stack
        raise error(f"{what} {path} cannot be read as JSON: {str(exc) or type(exc).__name__}") from None


def json_number(x: Any) -> float | None:
    """A JSON number as a float (NaN and +-inf kept); None for a bool, a non-number or an int past float."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    try:
        return float(x)
    except OverflowError:
        return None


def finite_number(x: Any) -> float | None:
    """:func:`json_number` when finite, else None."""
    v = json_number(x)
    return v if v is not None and math.isfinite(v) else None


def output_target(path: str | os.PathLike | None, what: str = "output file") -> Path:
    """The file a write to ``path`` replaces: a symlink is followed (even dangling), so it stays a link;
    OutputError for a blank path or a symlink loop."""
    if path is None or not str(path).strip():
        raise OutputError(f"{what} path {str(path or '')!r} is empty: give a file name, e.g. runs/out.json")
    p = Path(path)
    if not os.path.islink(p):  # False also when the path cannot be examined: the write then names why
        return p
    try:
        return Path(os.path.realpath(p, strict=True))
    except FileNotFoundError:
        return Path(os.path.realpath(p))
    except OSError as exc:
        raise OutputError(f"{what} {p} is a symlink that cannot be followed ({exc.strerror or exc}): give a "
                          "file path") from None


def check_output_path(path: str | os.PathLike | None, what: str = "output file") -> Path:
    """``path`` (:func:`output_target`) once a temp file could be made beside it (parents created), before
    any work; ValueError naming it: a directory, not a regular file, or not writable."""
    p = output_target(path, what)
    try:
        if p.is_dir():
            raise ValueError(f"{what} {p} is a directory: give a file path inside it, e.g. {p / 'out.json'}")
        if p.exists() and not p.is_file():
            raise ValueError(f"{what} {p} exists and is not a regular file")
        if not (anc := next(a for a in p.absolute().parents if a.exists())).is_dir():
            raise ValueError(f"{what} {p} lies under {anc}, which is a file, not a directory")
        p.parent.mkdir(parents=True, exist_ok=True)
        tempfile.NamedTemporaryFile(prefix=_tmp_prefix(p), suffix=".probe", dir=p.parent).close()
    except OSError as exc:
        raise OutputError(f"{what} {p} cannot be written: {exc.strerror or exc}") from None
    return p


def _tmp_prefix(path: Path) -> str:
    return "." + path.name[:48] + "."


@contextlib.contextmanager
def locked(path: str | os.PathLike, what: str = "file", *, wait: bool = True) -> Iterator[None]:
    """Hold the writers' lock of ``path``: ``flock`` of ``.<name>.lock`` beside it, which exists only while
    held. ``wait``: block for the other writer, else OutputError naming its pid."""
    p = Path(path).absolute()
    lock = p.parent / f".{p.name[:200]}.lock"
    while True:
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            raise OutputError(f"cannot write {what} {p}: {exc.strerror or exc} ({lock})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise OutputError(f"{what} {p} is being written by another process (pid {holder}): wait for it to "
                              "finish, or choose another path") from None
        with contextlib.suppress(OSError):
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                break  # else the holder before us removed that lock file: lock the current one
        os.close(fd)
    try:
        with contextlib.suppress(OSError):  # the pid is for the message of a refused writer only
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)  # removed while held; a waiter re-checks the inode
        os.close(fd)


def write_file_atomic(path: str | os.PathLike, write: Callable[[IO], None], *, binary: bool = False) -> None:
    """``path`` by ``write(f)`` on a temp file beside it, renamed into place: the old file survives any
    failure, no temp file is left; OutputError names the file."""
    path = output_target(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(path), suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.umask(umask := os.umask(0))
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp alone leaves 0600
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, OutputError):
            raise OutputError(f"cannot write {path}: {exc.strerror or exc}; the previous file, if any, is "
                              "unchanged") from None
        raise


def write_json_atomic(data: Any, path: str | os.PathLike, *, indent: int | None = 1, sort_keys: bool = False) -> None:
    """``data`` as JSON to ``path`` by :func:`write_file_atomic`; torch dtypes/devices as strings, tensors
    as lists."""
    def write(f: IO) -> None:
        json.dump(data, f, indent=indent, sort_keys=sort_keys, default=_json_default, allow_nan=True)
        f.write("\n")

    write_file_atomic(path, write)


def write_json_or_rescue(data: Any, path: str | os.PathLike, what: str = "output") -> None:
    """:func:`write_json_atomic`, or when refused, into the temp folder; OutputError names the rescue file."""
    try:
        write_json_atomic(data, path)
    except OutputError as exc:
        rescue = Path(tempfile.gettempdir()) / f"mla-fp8-bench-rescued-{os.getpid()}-{Path(str(path)).name[:100]}"
        try:
            write_json_atomic(data, rescue)
            saved = f"; the {what} were saved to {rescue} instead"
        except OutputError as exc2:
            saved = f"; saving it to {rescue} failed too ({exc2})"
        raise OutputError(f"{exc}{saved}") from None


def _json_default(o: Any) -> Any:
    torch = sys.modules.get("torch")  # never import torch just to write JSON
    if torch is not None and isinstance(o, (torch.dtype, torch.device)):
        return str(o)
    if torch is not None and isinstance(o, torch.Tensor):
        return o.tolist()
    raise TypeError(f"not JSON-serialisable: {type(o).__name__}")
