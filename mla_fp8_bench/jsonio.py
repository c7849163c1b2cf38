"""JSON files written atomically (:func:`write_file_atomic`, under :func:`locked` for read-modify-write)
and read with errors that name the file (docs/robustness.md, P4, P10)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import math
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

#: Largest JSON file read (bytes): asv result files of the full grid are about 1 MB.
MAX_JSON_BYTES = 256 * 1024 * 1024
#: Deepest nesting of arrays/objects accepted in a JSON file (asv's files nest 4 deep).
MAX_JSON_DEPTH = 64
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(r"[\[\]{}]")


class OutputError(OSError, ValueError):
    """An output file cannot be written or is locked by another writer; the message names it (an OSError,
    and a ValueError for the CLI: one line, exit 2)."""

    def __str__(self) -> str:
        return str(self.args[-1]) if self.args else super().__str__()


def _json_depth(text: str) -> int:
    """Deepest nesting of ``[``/``{`` outside strings (no recursion)."""
    steps = (1 if m.group() in "[{" else -1 for m in _BRACKET.finditer(_STRING.sub("", text)))
    return max(itertools.accumulate(steps, initial=0))


def load_json(path: str | os.PathLike, what: str, error: type[Exception] = ValueError, hint: str = "") -> Any:
    """Parse the JSON file ``path``; any failure, also a file over :data:`MAX_JSON_BYTES` or nested deeper
    than :data:`MAX_JSON_DEPTH`, raises ``error`` naming ``what`` (``"run JSON"``) and ``path``; ``hint``
    ends the invalid-JSON message."""
    path = Path(path)
    try:
        if path.is_file() and path.stat().st_size > MAX_JSON_BYTES:
            raise error(f"{what} {path} is {path.stat().st_size} bytes: at most {MAX_JSON_BYTES} are read "
                        "(not a file this suite wrote)")
        text = path.read_text()
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{what} {path} is not text (byte {exc.start} is not UTF-8): not a JSON file") from None
    depth = _json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise error(f"{what} {path} nests arrays/objects {depth} deep: at most {MAX_JSON_DEPTH} (not a file this "
                    "suite wrote)")
    try:
        return json.loads(text)
    except RecursionError:
        raise error(f"{what} {path} nests too deep to read (not a file this suite wrote)") from None
    except json.JSONDecodeError as exc:
        raise error(f"{what} {path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
                    + (f"; {hint}" if hint else "")) from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise error(f"{what} {path} cannot be read as JSON: {exc}") from None


def json_number(x: Any) -> float | None:
    """A JSON number as a float (NaN and +-inf kept); None for anything else, also a bool and an integer
    beyond the float range."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    try:
        return float(x)
    except OverflowError:
        return None


def finite_number(x: Any) -> float | None:
    """:func:`json_number` when finite; None for NaN, +-inf and anything that is not a JSON number."""
    v = json_number(x)
    return v if v is not None and math.isfinite(v) else None


def check_output_path(path: str | os.PathLike | None, what: str = "output file") -> Path:
    """``path`` as a Path, once a temp file was created and removed beside it (parents created); ValueError
    naming it when it is empty, not a regular file, under a file, or its directory cannot be written."""
    p = output_target(path, what)
    if p.is_dir():
        raise ValueError(f"{what} {p} is a directory: give a file path inside it, e.g. {p / 'out.json'}")
    if p.exists() and not p.is_file():
        raise ValueError(f"{what} {p} exists and is not a regular file")
    anc = next((a for a in p.parents if a.exists()), None)
    if anc is not None and not anc.is_dir():
        raise ValueError(f"{what} {p} lies under {anc}, which is a file, not a directory")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tempfile.NamedTemporaryFile(prefix=_tmp_prefix(p), suffix=".probe", dir=p.parent).close()
    except OSError as exc:
        raise ValueError(f"{what} {p} cannot be written: {exc.strerror or exc} ({p.parent})") from None
    return p


def output_target(path: str | os.PathLike | None, what: str = "output file") -> Path:
    """The file a write to ``path`` creates or replaces: symlinks (also chains, also dangling) are followed,
    so a link stays a link. OutputError: ``path`` is blank, a name in it over ``NAME_MAX``, or it is over
    ``PATH_MAX``."""
    if path is None or str(path).strip() == "":
        raise OutputError(f"{what} path {str(path) if path is not None else ''!r} is empty: give a file name, "
                          "e.g. runs/out.json")
    p = Path(path)
    if len(os.fsencode(str(p.absolute()))) >= 4096:
        raise OutputError(errno.ENAMETOOLONG, f"{what} {str(p)[:80]}...: the path is over 4095 bytes (PATH_MAX)")
    try:
        name_max = os.pathconf(next((a for a in p.parents if a.is_dir()), Path(".")), "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    for part in (p.name, *(a.name for a in p.parents)):
        if (n := len(os.fsencode(part))) > name_max:
            raise OutputError(errno.ENAMETOOLONG, f"{what} {str(p)[:80]}...: the file name is {n} bytes: at most "
                              f"{name_max} on this file system")
    if not p.is_symlink():
        return p
    try:
        return Path(os.path.realpath(p, strict=True))
    except FileNotFoundError:
        return Path(os.path.realpath(p))  # a dangling link: its target is created
    except OSError as exc:
        raise OutputError(exc.errno, f"{what} {p} is a symlink that cannot be followed ({exc.strerror or exc}): "
                          "give a file path") from None


def _tmp_prefix(path: Path) -> str:
    return "." + path.name[:48] + "."


def _write_error(path: Path, exc: OSError) -> OutputError:
    why = exc.strerror or str(exc)
    if exc.errno == errno.EFBIG:
        why += " (the file-size limit, ulimit -f, is reached)"
    return OutputError(exc.errno, f"cannot write {path}: {why}; the previous file, if any, is unchanged")


def umask_mode(full: int = 0o666) -> int:
    """The mode a new file (0o666) or folder (``full`` 0o777) gets under the current umask."""
    old = os.umask(0)
    try:
        return full & ~old
    finally:
        os.umask(old)


@contextlib.contextmanager
def locked(path: str | os.PathLike, what: str = "file", *, wait: bool = True) -> Iterator[None]:
    """Hold the writers' lock of ``path`` (a file or folder): ``fcntl.flock`` of ``.<name>.lock`` beside it,
    which exists only while held. ``wait``: block for the other writer, else OutputError naming its pid
    (also when the lock file cannot be created)."""
    p = Path(path).absolute()
    lock = p.parent / f".{p.name[:200]}.lock"
    while True:
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            raise OutputError(exc.errno, f"cannot write {what} {p}: {exc.strerror or exc} ({lock})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise OutputError(errno.EBUSY, f"{what} {p} is being written by another process (pid {holder}): wait "
                              "for it to finish, or choose another path") from None
        with contextlib.suppress(OSError):
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                break
        os.close(fd)  # the holder before us removed that lock file: lock the current one
    try:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)  # removed while held, so no file is left behind; waiters re-check the inode
        os.close(fd)


def write_file_atomic(path: str | os.PathLike, write: Callable[[IO], None], *, binary: bool = False) -> None:
    """Create ``path`` by ``write(f)`` on a temp file beside it renamed into place: the previous file
    survives any failure and no temp file is left; a symlink is followed. OutputError naming the file: an
    empty path, or the file system refused the write."""
    path = output_target(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(path), suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _write_error(path, exc) from None
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, umask_mode())  # the usual mode; mkstemp alone leaves 0600
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, OutputError):
            raise _write_error(path, exc) from None
        raise


def write_json_atomic(data: Any, path: str | os.PathLike, *, indent: int = 1, sort_keys: bool = False) -> None:
    """``data`` as JSON to ``path`` by :func:`write_file_atomic`; torch dtypes/devices become strings,
    tensors lists; anything else unserialisable raises TypeError."""
    def write(f: IO) -> None:
        json.dump(data, f, indent=indent, sort_keys=sort_keys, default=_json_default, allow_nan=True)
        f.write("\n")

    write_file_atomic(path, write)


def write_json_or_rescue(data: Any, path: str | os.PathLike, what: str = "output") -> None:
    """:func:`write_json_atomic`, or when refused, to the temp folder, and OutputError names the rescue
    file (or why that failed too)."""
    try:
        write_json_atomic(data, path)
    except OutputError as exc:
        name = Path(str(path)).name[:100] or "out.json"
        rescue = Path(tempfile.gettempdir()) / f"mla-fp8-bench-rescued-{os.getpid()}-{name}"
        try:
            write_json_atomic(data, rescue)
            saved = f"; the {what} were saved to {rescue} instead"
        except OutputError as exc2:
            saved = f"; saving it to {rescue} failed too ({exc2})"
        raise OutputError(exc.errno, f"{exc}{saved}") from None


def _json_default(o: Any) -> Any:
    torch = sys.modules.get("torch")  # never import torch just to write JSON
    if torch is not None and isinstance(o, (torch.dtype, torch.device)):
        return str(o)
    if torch is not None and isinstance(o, torch.Tensor):
        return o.tolist()
    raise TypeError(f"not JSON-serialisable: {type(o).__name__}")
