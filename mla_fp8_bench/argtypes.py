"""Validation of user-supplied values before any work: one line naming the value and what is allowed.
``positive_int`` / ``positive_float`` / ``ascii_int`` / ``ascii_float`` / ``int_in`` / ``safe_name`` are argparse
``type=`` callables (exit status 2); environment variables: :mod:`mla_fp8_bench.config`. Integers are read by
:func:`read_int` (ASCII digits only), numbers by :func:`read_float` (ASCII only).
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
#: An integer as typed: ASCII digits; a leading '-' is read only so that a negative value is refused as out
#: of range. ``int()`` would also take '+5', '1_000' and other scripts' digits ('\u0665' is 5).
INT_RE = re.compile(r"-?[0-9]+")
ASCII_SPACE = " \t\n\r\f\v"
#: The form an integer must take, for messages.
INT_FORM = "ASCII digits 0-9"
#: A number as typed: ASCII decimal or exponent notation, or inf / nan (refused where a finite one is needed).
#: ``float()`` would also take '1_0' and other scripts' digits.
FLOAT_RE = re.compile(r"[+-]?(([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|inf|infinity|nan)", re.IGNORECASE)


def shown(text: object, limit: int = 60) -> str:
    """``repr(text)`` for a message, cut to about ``limit`` characters (a pasted megabyte stays one short line)."""
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
    """Comma-separated option values (``action="append"``), in order, each once; None when not given;
    ValueError when they name nothing (``-b ",,,"``)."""
    if values is None:
        return None
    items = [x.strip() for s in values for x in s.split(",") if x.strip()]
    if not items:
        raise ValueError(f"{option} {','.join(values)!r} names nothing: give comma-separated names, or leave "
                         f"{option} out for the default")
    return list(dict.fromkeys(items))


def read_int(text: object) -> int | None:
    """The integer ``text`` spells (:data:`INT_RE`, surrounding ASCII whitespace ignored), else None
    ('+5', '٥', '²', '1_000', '5x', '', and numbers past Python's int-string digit limit)."""
    s = str(text).strip(ASCII_SPACE)
    if not INT_RE.fullmatch(s):
        return None
    try:
        return int(s)
    except ValueError:  # past Python's int-string digit limit
        return None


def _past_digit_limit(text: object, what: str, why: str) -> None:
    """ValueError ``<what>=<first digits>... (<n> digits) is <why>`` when ``text`` is ASCII digits that
    :func:`read_int` cannot read (past Python's int-string digit limit)."""
    digits = str(text).strip(ASCII_SPACE)
    if INT_RE.fullmatch(digits) and read_int(digits) is None:
        raise ValueError(f"{what}={digits[:20]}... ({len(digits)} digits) is {why}")


def read_float(text: object) -> float | None:
    """The number ``text`` spells (:data:`FLOAT_RE`, surrounding ASCII whitespace ignored), else None."""
    s = str(text).strip(ASCII_SPACE)
    return float(s) if FLOAT_RE.fullmatch(s) else None


def parse_int(text: object, what: str, lo: int, hi: int) -> int:
    """The integer ``text`` (:func:`read_int`) from ``lo`` to ``hi``.

    Raises:
        ValueError: one line, ``<what>='<text>' is not an integer: ...`` or ``<what>=<v> is out of range:
        allowed <lo>..<hi>``.
    """
    v = read_int(text)
    if v is None:
        _past_digit_limit(text, what, f"out of range: allowed {lo}..{hi}")
        raise ValueError(f"{what}={shown(text)} is not an integer: allowed {lo}..{hi}, written in {INT_FORM}")
    if not lo <= v <= hi:
        raise ValueError(f"{what}={v} is out of range: allowed {lo}..{hi}")
    return v


def parse_int_list(text: object, what: str, lo: int, hi: int, max_items: int) -> tuple[int, ...]:
    """The comma-separated integers of ``text`` (each read by :func:`parse_int`, named ``<what>[i]``), in order.

    Raises:
        ValueError: one line naming the empty or bad item, or the count above ``max_items``, and the allowed form.
    """
    form = f"{what} takes a comma-separated list of integers >= {lo} written in {INT_FORM}, e.g. 512,1024"
    parts = str(text).split(",")
    empty = [i for i, p in enumerate(parts) if not p.strip(ASCII_SPACE)]
    if empty:
        which = "it is empty" if len(parts) == 1 else f"{what}[{empty[0]}] is empty"
        raise ValueError(f"{what}={text!r} is not a comma-separated list of integers: {which}; {form}")
    if len(parts) > max_items:
        raise ValueError(f"{what} has {len(parts)} items: allowed 1..{max_items}")
    out = []
    for i, p in enumerate(parts):
        if not INT_RE.fullmatch(p.strip(ASCII_SPACE)):
            raise ValueError(f"{what}[{i}]={shown(p)} is not an integer: {form}")
        out.append(parse_int(p, f"{what}[{i}]", lo, hi))
    return tuple(out)


def parse_number(text: str, kind: type, what: str, minimum: float, strict: bool) -> float:
    """``kind(text)`` (an int by :func:`read_int`) checked finite and ``>= minimum`` (``>`` when ``strict``).

    Raises:
        ValueError: one line naming ``what``, the text and the allowed values.
    """
    bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
    if kind is int:
        val = read_int(text)
        if val is None:
            _past_digit_limit(text, what, "invalid: too large")
            raise ValueError(f"{what}={shown(text)} is not an integer: must be an integer {bound}, written in "
                             f"{INT_FORM}")
    else:
        val = read_float(text)
        if val is None:
            raise ValueError(f"{what}={shown(text)} is not a number: must be a number {bound}, written in ASCII "
                             "(e.g. 2.5 or 1e-3)")
    if isinstance(val, float) and not math.isfinite(val):
        raise ValueError(f"{what}={shown(text)} is invalid: a finite number is needed")
    if val < minimum or (strict and val == minimum):
        raise ValueError(f"{what}={shown(text)} is invalid: must be {bound}")
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


def ascii_int(text: str) -> int:
    """argparse type: any integer written in :data:`INT_FORM` (its range is checked where it is used)."""
    v = read_int(text)
    if v is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer: written in {INT_FORM}")
    return v


def ascii_float(text: str) -> float:
    """argparse type: any number written as :data:`FLOAT_RE` allows (its range is checked where it is used)."""
    v = read_float(text)
    if v is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number: written in ASCII (e.g. 2.5 or 1e-3)")
    return v


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
