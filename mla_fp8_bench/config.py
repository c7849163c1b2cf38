"""The run configuration: every knob of a measurement in one frozen object, built from the command line
(``cli.py``) or the environment (:meth:`RunConfig.from_env`: ``MLA_FP8_BENCH_<FIELD>`` sets a field, e.g.
``_TIME_BUDGET``, ``_AITER_ANY_DEVICE=1``); the one module that reads ``MLA_FP8_BENCH_*``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from mla_fp8_bench.aiter_ps.facts import MAX_CU_NUM
from mla_fp8_bench.argtypes import parse_number, shown
from mla_fp8_bench.problem.cases import MAX_TOTAL_TOKENS

PREFIX = "MLA_FP8_BENCH_"
#: MI355X multiProcessorCount: the CU count the emulated plan is made for by default.
DEFAULT_EMU_CU_NUM = 256
#: Default token cap of the emulation per device type (0 = none): 437 ms per call at S=4096 on an H200
#: (studies/h200-measurements.md, section 5.5); beyond it the emulation would dominate a run.
DEFAULT_EMU_MAX_TOKENS = {"cpu": 0, "cuda": 4096}
#: Most latency samples per (backend, case) (a list of them is kept in every record).
MAX_SAMPLES = 1_000_000
#: Most latency rounds a run (``_ROUNDS``) or ``ab`` (``--rounds``) accepts.
MAX_ROUNDS = 100


@dataclass(frozen=True)
class RunConfig:
    """What one run measures and how; ``None`` / ``()`` where the caller's default applies."""

    device: str = "auto"  # auto, cpu, cuda or cuda:N
    max_tokens: int | None = None  # the asv grid's token cap (None: asv_support.GRID_CAPS)
    backends: tuple[str, ...] = ()  # asv params to measure (empty: all)
    cases: tuple[str, ...] = ()
    samples: int | None = None  # latency samples per param
    time_budget_s: float | None = None  # seconds of latency sampling per param
    rounds: int | None = None  # latency rounds
    emu_cu_num: int = DEFAULT_EMU_CU_NUM  # the emulated plan's CU count (256 = MI355X)
    emu_max_tokens: int | None = None  # the emulation's token cap (None: DEFAULT_EMU_MAX_TOKENS; 0: none)
    emu_aiter_version: tuple[int, int, int] | None = None  # the AITER version aiter-emulated models (None: newest)
    aiter_any_device: bool = False  # aiter may drive a non-gfx950 package (records labelled an emulation)
    expect_commit: str = ""  # the commit an -E existing asv run is filed under ("" unset)
    progress: str = ""  # a file the asv grid appends its progress lines to ("" none), e.g. /dev/tty

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, grid: tuple[tuple[str, ...], tuple[str, ...]]
                 | None = None) -> RunConfig:
        """The ``MLA_FP8_BENCH_*`` knobs of ``environ`` (default ``os.environ``); ``grid``: the (backends,
        cases) ``_BACKENDS`` / ``_CASES`` may name (None: any). ValueError: one line naming the variable."""
        env = os.environ if environ is None else environ
        get = lambda name: env.get(PREFIX + name, "")  # noqa: E731
        return cls(
            device=check_device(get("DEVICE").strip() or "auto", f"{PREFIX}DEVICE"),
            max_tokens=_int(get("MAX_TOKENS"), "MAX_TOKENS", 1, MAX_TOTAL_TOKENS),
            backends=_names(get("BACKENDS"), "BACKENDS", grid and grid[0], "backends"),
            cases=_names(get("CASES"), "CASES", grid and grid[1], "case ids"),
            samples=_int(get("SAMPLES"), "SAMPLES", 1, MAX_SAMPLES),
            time_budget_s=float(parse_number(t, float, PREFIX + "TIME_BUDGET", 0.0, strict=True))
            if (t := get("TIME_BUDGET")).strip() else None,
            rounds=_int(get("ROUNDS"), "ROUNDS", 1, MAX_ROUNDS, f"an integer from 1 to {MAX_ROUNDS}"),
            emu_cu_num=_int(get("EMU_CU_NUM"), "EMU_CU_NUM", 1, MAX_CU_NUM, f"an integer from 1 to {MAX_CU_NUM} "
                            "(256 = MI355X)") or DEFAULT_EMU_CU_NUM,
            emu_max_tokens=_int(get("EMU_MAX_TOKENS"), "EMU_MAX_TOKENS", 0, None, "an integer >= 0 (0 = no cap)"),
            emu_aiter_version=check_emu_aiter_version(get("EMU_AITER_VERSION"), f"{PREFIX}EMU_AITER_VERSION"),
            aiter_any_device=_any_device(get("AITER_ANY_DEVICE")),
            expect_commit=get("EXPECT_COMMIT").strip(),
            progress=get("PROGRESS").strip())

    def emulation_token_cap(self, device_type: str) -> int:
        """The emulation's token cap on ``device_type`` (0 = none)."""
        return DEFAULT_EMU_MAX_TOKENS.get(device_type, 0) if self.emu_max_tokens is None else self.emu_max_tokens


def _int(raw: str, name: str, minimum: int, maximum: int | None = None, allowed: str | None = None) -> int | None:
    """The integer in ``raw`` (None when blank), from ``minimum`` to ``maximum``; ValueError naming the
    variable, worded ``<VAR>=<raw> is invalid: <allowed>`` when ``allowed`` is given."""
    if not raw.strip():
        return None
    try:
        v = int(parse_number(raw, int, PREFIX + name, minimum, strict=False))
        if maximum is None or v <= maximum:
            return v
        raise ValueError(f"{PREFIX}{name}={shown(raw)} is invalid: at most {maximum}")
    except ValueError:
        if allowed is None:
            raise
        raise ValueError(f"{PREFIX}{name}={shown(raw)} is invalid: {allowed}") from None


def _names(raw: str, name: str, allowed: tuple[str, ...] | None, what: str) -> tuple[str, ...]:
    """The comma-separated names of ``raw`` (each once, in order); ``()`` when unset."""
    if not raw.strip():
        return ()
    items = tuple(dict.fromkeys(x.strip() for x in raw.split(",") if x.strip()))
    if not items:
        raise ValueError(f"{PREFIX}{name}={raw!r} names nothing: give comma-separated {what}, or unset it for all")
    if unknown := [x for x in items if allowed is not None and x not in allowed]:
        label, tail = ("unknown backends", "") if what == "backends" else ("cases", " outside the asv grid")
        raise ValueError(f"{PREFIX}{name} names {label} {unknown}{tail}: allowed {', '.join(allowed)}")
    return items


def check_device(device: str, what: str) -> str:
    """``device`` if ``auto`` or a device torch resolves here, else ValueError naming ``what``."""
    if device != "auto":
        from mla_fp8_bench.measure.devices import normalize_device

        try:
            normalize_device(device)
        except ValueError as exc:
            raise ValueError(f"{what}={device!r}: {exc}") from None
    return device


def check_emu_aiter_version(raw: str, what: str) -> tuple[int, int, int] | None:
    """The AITER version ``aiter-emulated`` models (None for ``""``: the newest modelled)."""
    if not raw.strip():
        return None
    from mla_fp8_bench.aiter_ps.facts import modelled_version

    return modelled_version(raw, what)


def _any_device(raw: str) -> bool:
    if raw not in ("", "0", "1"):
        raise ValueError(f"{PREFIX}AITER_ANY_DEVICE={raw!r} is invalid: 1 (drive a non-gfx950 aiter) or 0/unset")
    return raw == "1"
