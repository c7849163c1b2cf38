"""Terminal and CI-log output: tables never wrapped, one progress line per finished (backend, case) (the
CLI's and the asv grid's), one duration format."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from rich.console import Console

#: Width of a console off a terminal without ``COLUMNS``: no table wraps (unexpanded rich tables take
#: their natural width).
LOG_WIDTH = 100_000


def fmt_seconds(x: float | None) -> str:
    """Seconds with 4 significant digits in s / ms / us (``9.745 us``, ``10.24 ms``); ``-`` for None or NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.4g} s" if x >= 1 else f"{x * 1e3:.4g} ms" if x >= 1e-3 else f"{x * 1e6:.4g} us"


def make_console(file: TextIO | None = None) -> Console:
    """A rich console for ``file`` (default stdout): rich's own on a terminal; off one, ``COLUMNS`` wide
    when it is a width, else :data:`LOG_WIDTH`."""
    with contextlib.suppress(AttributeError, ValueError):
        if (file if file is not None else sys.stdout).isatty():
            return Console(file=file)
    cols = os.environ.get("COLUMNS", "")
    width = int(cols) if cols.isascii() and cols.isdigit() and 0 < int(cols) <= LOG_WIDTH else LOG_WIDTH
    return Console(file=file, width=width, force_terminal=False, highlight=False)


def case_line(done: int, total: int, backend: str, case: str, status: str, elapsed_s: float, total_s: float,
              reason: str = "") -> str:
    """``[done/total] backend case: status (elapsed s; total s so far)[: reason cut to 160 characters]``."""
    why = " ".join(str(reason).split())
    why = why if len(why) <= 160 else why[:157] + "..."
    return (f"[{done}/{total}] {backend} {case}: {status} ({elapsed_s:.1f} s; {total_s:.1f} s so far)"
            + (f": {why}" if why and status != "ok" else ""))


@contextlib.contextmanager
def case_progress(total: int, console: Console | None = None,
                  streams: tuple[TextIO, ...] = ()) -> Iterator[Callable[[Any], str]]:
    """Progress over ``total`` pairs: yields ``step(rec)``, which prints a finished record's
    :func:`case_line` to ``console``, else to each of ``streams`` (default stderr), and returns it."""
    t0 = last = time.perf_counter()
    done = 0

    def step(rec: Any) -> str:
        nonlocal done, last
        now, done = time.perf_counter(), done + 1
        line = case_line(done, total, rec.backend, rec.case, rec.status, now - last, now - t0,
                         getattr(rec, "reason", ""))
        last = now
        if console is not None:
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        for s in () if console is not None else streams or (sys.stderr,):
            with contextlib.suppress(OSError, ValueError):  # a closed or broken log must not stop the measurement
                print(line, file=s, flush=True)
        return line

    yield step


@contextlib.contextmanager
def signals_interrupt():
    """SIGTERM and SIGHUP raise ``KeyboardInterrupt`` inside the block; yields a list that receives the
    signal number."""
    got: list[int] = []

    def handler(signum, _frame):
        got.append(signum)
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    old = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            old[sig] = signal.signal(sig, handler)
    try:
        yield got
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
