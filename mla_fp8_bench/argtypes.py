"""Validation of user-supplied values before any work: one line naming the value and what is allowed.
``positive_int`` / ``positive_float`` / ``int_in`` / ``safe_name`` are argparse ``type=`` callables (exit
status 2); environment variables: :mod:`mla_fp8_bench.config`.
"""

from __future__ import annotations

import argparse
import math
import re

#: asv machine names and tolerance-set names: they become one path component under results/ or
#: tolerances/, so no separators, no leading dot and no ``..``.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
#: Names asv itself uses as keys of ``~/.asv-machine.json`` or as files/directories in results/.
RESERVED_NAMES = frozenset({"version", "benchmarks.json", "machine.json", "html"})


def check_name(value: str, what: str) -> str:
    """``value`` if a safe path component (:data:`NAME_RE`, no ``..``, not :data:`RESERVED_NAMES`), else ValueError."""
    if not isinstance(value, str) or not NAME_RE.fullmatch(value) or ".." in value:
        raise ValueError(f"{what} {value!r} is invalid: letters, digits, '.', '_', '+', '-' (1-64 characters, "
                         "first a letter or digit, no '..' or '/'): it names a file or directory")
    if value.lower() in RESERVED_NAMES:
        raise ValueError(f"{what} {value!r} is reserved by asv: choose another name (reserved: "
                         f"{', '.join(sorted(RESERVED_NAMES))})")
    return value


def split_list(values: list[str] | None, option: str) -> list[str] | None:
    """Comma-separated option values (``action="append"``), in order, each once; None when not given;
    ValueError when they name nothing (``-b ",,,"``)."""
    if values is None:
        return None
    items = [x.strip() for s in values for x in s.split(",") if x.strip()]
    if not items:
        raise ValueError(f"{option} {','.join(values)!r} names nothing: give comma-separated names, or leave "
                         f"{option} out for the default")
    return list(dict.fromkeys(items))


def parse_number(text: str, kind: type, what: str, minimum: float, strict: bool) -> float:
    """``kind(text)`` checked finite and ``>= minimum`` (``>`` when ``strict``); ValueError names ``what``
    and the allowed range."""
    bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
    try:
        val = kind(str(text).strip())
    except (TypeError, ValueError):
        noun = "an integer" if kind is int else "a number"
        raise ValueError(f"{what}={text!r} is not {noun}: must be {noun} {bound}") from None
    if isinstance(val, float) and not math.isfinite(val):
        raise ValueError(f"{what}={text!r} is invalid: a finite number is needed")
    if val < minimum or (strict and val == minimum):
        raise ValueError(f"{what}={text!r} is invalid: must be {bound}")
    return val


def _argtype(kind: type, minimum: float, strict: bool):
    def parse(text: str):
        try:
            return kind(parse_number(text, kind, "value", minimum, strict))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).replace("value=", "")) from None
    return parse


#: argparse types: an integer >= 1; a finite number > 0.
positive_int = _argtype(int, 1, strict=False)
positive_float = _argtype(float, 0.0, strict=True)


def int_in(lo: int, hi: int):
    """argparse type factory: an integer from ``lo`` (at least 1) to ``hi``."""
    def parse(text: str) -> int:
        v = positive_int(text)
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{text!r} is out of range: allowed {lo}..{hi}")
        return v
    return parse


def safe_name(what: str):
    """argparse type factory: a name accepted by :func:`check_name`."""
    def parse(text: str) -> str:
        try:
            return check_name(text, what)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse
