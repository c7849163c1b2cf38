"""JSON files written atomically and read with errors that name the file.

Every writer in the suite (run JSONs, tolerances, merged asv results) goes through
:func:`write_file_atomic`: a temp file in the target's folder, then ``os.replace``, so an interrupted
write never leaves a truncated file, and the file gets the usual umask-derived mode (``mkstemp`` alone
would leave it 0600).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def load_json(path: str | os.PathLike, what: str, error: type[Exception] = ValueError, hint: str = "") -> Any:
    """Parse the JSON file ``path``; any failure raises ``error`` naming ``what`` and ``path``.

    Args:
        path: the file.
        what: what the file should be (``"run JSON"``, ``"asv result file"``), used in messages.
        error: exception class to raise (the caller's own error type).
        hint: appended to the invalid-JSON message (e.g. how to regenerate the file).
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{what} {path} is not text (byte {exc.start} is not UTF-8): not a JSON file") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{what} {path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
                    + (f"; {hint}" if hint else "")) from None


def check_output_path(path: str | os.PathLike | None, what: str = "output file") -> Path:
    """Check, before any work, that :func:`write_file_atomic` can create ``path``; return it as a Path.

    Missing parent directories are created (the write would create them too); a temp file is created
    and removed in the target directory, so a read-only file system or missing permission shows here.

    Raises:
        ValueError: naming ``path`` when it is empty, is a directory or another non-regular file, lies
            under a regular file, or its directory cannot be created or written.
    """
    if path is None or str(path).strip() == "":
        raise ValueError(f"{what} path {str(path)!r} is empty: give a file name, e.g. runs/out.json")
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{what} {p} is a directory: give a file path inside it, e.g. {p / 'out.json'}")
    if p.exists() and not p.is_file():
        raise ValueError(f"{what} {p} exists and is not a regular file")
    for anc in p.parents:
        if anc.exists():
            if not anc.is_dir():
                raise ValueError(f"{what} {p} lies under {anc}, which is a file, not a directory")
            break
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=p.name, suffix=".probe", dir=p.parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(f"{what} {p} cannot be written: {exc.strerror or exc} ({p.parent})") from None
    return p


def _umask_mode() -> int:
    old = os.umask(0)
    try:
        return 0o666 & ~old
    finally:
        os.umask(old)


def write_file_atomic(path: str | os.PathLike, write: Callable[[IO], None], *, binary: bool = False) -> None:
    """Create ``path`` by calling ``write(f)`` on a temp file beside it, then renaming it into place.

    The previous file (if any) survives any failure or interrupt inside ``write``; no temp file is left.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
        os.chmod(tmp, _umask_mode())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json_atomic(data: Any, path: str | os.PathLike, *, indent: int = 1, sort_keys: bool = False) -> None:
    """Write ``data`` as JSON to ``path`` atomically (see :func:`write_file_atomic`).

    torch dtypes/devices become strings and tensors lists; anything else unserialisable raises TypeError.
    """
    def write(f: IO) -> None:
        json.dump(data, f, indent=indent, sort_keys=sort_keys, default=_json_default, allow_nan=True)
        f.write("\n")

    write_file_atomic(path, write)


def _json_default(o: Any) -> Any:
    torch = sys.modules.get("torch")  # never import torch just to write JSON
    if torch is not None and isinstance(o, (torch.dtype, torch.device)):
        return str(o)
    if torch is not None and isinstance(o, torch.Tensor):
        return o.tolist()
    raise TypeError(f"not JSON-serialisable: {type(o).__name__}")
