"""Values a user types, checked before any work: one line naming the value and what is allowed. Integers
are ASCII digits (``int()`` would also take '+5', '1_000' and '\u0665'), numbers ASCII decimal or exponent
notation. ``positive_int``, ``positive_float``, ``ascii_int``, ``ascii_float``, ``int_in`` and ``safe_name``
are argparse ``type=`` callables (exit status 2)."""

from __future__ import annotations

import argparse
import math
import re

#: asv machine and tolerance-set names: one path component, so no separator, leading dot or ``..``.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
#: Names asv itself uses in ``~/.asv-machine.json`` or results/.
RESERVED_NAMES = frozenset({"version", "benchmarks.json", "machine.json", "html"})
INT_RE = re.compile(r"-?[0-9]+")  # '-' is read only so that a negative value is refused as out of range
FLOAT_RE = re.compile(r"[+-]?(([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|inf|infinity|nan)", re.IGNORECASE)
INT_FORM = "ASCII digits 0-9"
FLOAT_FORM = "ASCII (e.g. 2.5 or 1e-3)"
_SPACE = " \t\n\r\f\v"


def shown(text: object, limit: int = 60) -> str:
    """``repr(text)`` cut to about ``limit`` characters (a pasted megabyte stays one short line)."""
    r = repr(text)
    return r if len(r) <= limit else f"{r[:limit]}... ({len(str(text))} characters)"


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
    """Comma-separated option values (``action="append"``), each once in order; None when not given."""
    if values is None:
        return None
    items = [x.strip() for s in values for x in s.split(",") if x.strip()]
    if not items:
        raise ValueError(f"{option} {','.join(values)!r} names nothing: give comma-separated names, or leave "
                         f"{option} out for the default")
    return list(dict.fromkeys(items))


def read_int(text: object) -> int | None:
    """The integer ``text`` spells in ASCII digits (surrounding whitespace ignored), else None."""
    s = str(text).strip(_SPACE)
    try:
        return int(s) if INT_RE.fullmatch(s) else None
    except ValueError:  # past Python's digit limit
        return None


def read_float(text: object) -> float | None:
    """The number ``text`` spells (:data:`FLOAT_RE`, surrounding whitespace ignored), else None."""
    s = str(text).strip(_SPACE)
    return float(s) if FLOAT_RE.fullmatch(s) else None


def parse_int(text: object, what: str, lo: int, hi: int) -> int:
    """The integer ``text`` from ``lo`` to ``hi``; ValueError naming ``what``."""
    v = read_int(text)
    if v is None:
        raise ValueError(f"{what}={shown(text)} is not an integer: allowed {lo}..{hi}, written in {INT_FORM}")
    if not lo <= v <= hi:
        raise ValueError(f"{what}={v} is out of range: allowed {lo}..{hi}")
    return v


def parse_int_list(text: object, what: str, lo: int, hi: int, max_items: int) -> tuple[int, ...]:
    """The comma-separated integers of ``text`` (each by :func:`parse_int`, named ``<what>[i]``), at most
    ``max_items``; ValueError naming an empty or bad item."""
    form = f"{what} takes a comma-separated list of integers >= {lo} written in {INT_FORM}, e.g. 512,1024"
    parts = str(text).split(",")
    if empty := [i for i, p in enumerate(parts) if not p.strip(_SPACE)]:
        which = "it is empty" if len(parts) == 1 else f"{what}[{empty[0]}] is empty"
        raise ValueError(f"{what}={text!r} is not a comma-separated list of integers: {which}; {form}")
    if len(parts) > max_items:
        raise ValueError(f"{what} has {len(parts)} items: allowed 1..{max_items}")
    for i, p in enumerate(parts):
        if read_int(p) is None:
            raise ValueError(f"{what}[{i}]={shown(p)} is not an integer: {form}")
    return tuple(parse_int(p, f"{what}[{i}]", lo, hi) for i, p in enumerate(parts))


def parse_number(text: str, kind: type, what: str, minimum: float, strict: bool) -> float:
    """``text`` as ``kind`` (int or float), finite and ``>= minimum`` (``>`` when ``strict``); ValueError
    naming ``what``, the text and the allowed values."""
    bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
    val = read_int(text) if kind is int else read_float(text)
    if val is None:
        raise ValueError(f"{what}={shown(text)} is not an integer: must be an integer {bound}, written in {INT_FORM}"
                         if kind is int else f"{what}={shown(text)} is not a number: must be a number {bound}, "
                         f"written in {FLOAT_FORM}")
    if not math.isfinite(val):
        raise ValueError(f"{what}={shown(text)} is invalid: a finite number is needed")
    if val < minimum or (strict and val == minimum):
        raise ValueError(f"{what}={shown(text)} is invalid: must be {bound}")
    return val


def number(kind: type = int, lo: float | None = None, hi: int | None = None, strict: bool = False):
    """argparse type: a ``kind`` (int or float) written in ASCII; with ``lo`` finite and ``>= lo`` (``>`` when
    ``strict``; :func:`parse_number`), with ``hi`` at most ``hi``; unbounded, any value (checked where used)."""
    def parse(text: str):
        try:
            if lo is not None:
                v = kind(parse_number(text, kind, "value", lo, strict))
            elif (v := (read_int if kind is int else read_float)(text)) is None:
                raise ValueError(f"{text!r} is not " + (f"an integer: written in {INT_FORM}" if kind is int else
                                                         f"a number: written in {FLOAT_FORM}"))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).replace("value=", "")) from None
        if hi is not None and v > hi:
            raise argparse.ArgumentTypeError(f"{text!r} is out of range: allowed {lo}..{hi}")
        return v
    return parse


positive_int, positive_float = number(int, 1), number(float, 0.0, strict=True)
ascii_int, ascii_float = number(int), number(float)


def int_in(lo: int, hi: int):
    """argparse type: an integer from ``lo`` (at least 1) to ``hi``."""
    return number(int, lo, hi)


def safe_name(what: str):
    """argparse type: a name accepted by :func:`check_name`."""
    def parse(text: str) -> str:
        try:
            return check_name(text, what)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse
