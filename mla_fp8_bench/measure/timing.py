"""Latency in seconds. Methods: ``graph`` (a sample is one replay of ``launches`` captured calls, timed by
device events, / ``launches``), ``events`` (the same launches eagerly, when capture fails), ``host`` (CPU:
``perf_counter`` per call) and ``host-sync`` (:func:`time_call`)."""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from mla_fp8_bench.measure.clocks import mark_samples, open_reader, plateau_reached


@dataclass
class TimingResult:
    samples_s: list[float]  # per-launch latency samples, seconds
    method: str  # "graph", "events", "host" or "host-sync"
    launches_per_sample: int  # launches averaged into one sample
    warmup_calls: int  # calls run before sampling
    flush_l2: bool = False  # whether L2 was flushed before each sample
    note: str = ""  # why a fallback happened, if one did
    extra: dict = field(default_factory=dict)  # :func:`time_device`'s warm-up and clock details

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples_s)

    @property
    def iqr_s(self) -> float:  # 0 for fewer than 4 samples
        q = statistics.quantiles(self.samples_s, n=4) if len(self.samples_s) >= 4 else (0.0, 0.0, 0.0)
        return q[2] - q[0]

    @property
    def cv(self) -> float:  # stdev / mean, 0 for fewer than 2 samples
        s = self.samples_s
        return statistics.stdev(s) / statistics.fmean(s) if len(s) >= 2 else 0.0


def _warmup(run: Callable[[], object], sync: Callable[[], None], max_calls: int = 20, budget_s: float = 2.0,
            rel_tol: float = 0.05) -> int:
    """Call ``run`` until two consecutive host-timed calls agree within ``rel_tol`` (>= 3 calls)."""
    prev, t_start = 0.0, time.perf_counter()
    for calls in range(1, max_calls + 1):
        t0 = time.perf_counter()
        run()
        sync()
        dt = time.perf_counter() - t0
        if calls >= 3 and (abs(dt - prev) <= rel_tol * max(prev, 1e-9) or time.perf_counter() - t_start > budget_s):
            break
        prev = dt
    return calls


def _events() -> tuple:
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def _chunk(work: Callable[[], object], n: int, events: tuple, stream, sync: Callable[[], None], reader=None,
           sm: list | None = None) -> float:
    """Device seconds of ``n`` back-to-back ``work()`` calls; with ``reader`` the SM clock read meanwhile
    is appended to ``sm``."""
    e0, e1 = events
    e0.record(stream)
    for _ in range(n):
        work()
    e1.record(stream)
    if reader is not None:
        sm.append(reader.read(full=False).sm_mhz)
    sync()
    return e0.elapsed_time(e1) / 1e3


def _capture(run: Callable[[], object], launches: int, stream, sync: Callable[[], None], device) -> tuple:
    """``(graph of launches back-to-back calls of run (warmed on a side stream), "")``, or ``(None, the note
    of the events fallback)`` when capture fails."""
    try:
        side = torch.cuda.Stream(stream.device)
        side.wait_stream(stream)
        with torch.cuda.stream(side):
            run()
        stream.wait_stream(side)
        sync()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(launches):
                run()
        graph.replay()
        sync()
        return graph, ""
    except Exception as exc:  # noqa: BLE001 - any capture failure falls back to events
        with contextlib.suppress(Exception):  # the capture error is the one to report
            torch.cuda.synchronize(device)
        return None, f"graph capture failed ({type(exc).__name__}: {str(exc).splitlines()[0][:120]}); used events"


def _chunks_until(work: Callable[[], object], n: int, stream, sync: Callable[[], None], min_s: float, max_s: float,
                  steady: Callable[[list, list], bool], reader=None) -> tuple[float, int, bool, list]:
    """Chunks of ``n`` calls until ``min_s`` device seconds ran and ``steady(per-launch times, SM clocks)``,
    or ``max_s`` ran: ``(device seconds, calls, steady reached, SM clocks)``."""
    per: list[float] = []
    sm: list[float | None] = []
    total, calls, events = 0.0, 0, _events()
    while total < max_s:
        dt = _chunk(work, n, events, stream, sync, reader, sm)
        total, calls = total + dt, calls + n
        per.append(dt / n)
        if total >= min_s and steady(per, sm):
            return total, calls, True, sm
    return total, calls, False, sm


def _settle(sample: Callable[[], None], per_sample_s: float, stream, sync: Callable[[], None], min_s: float,
            max_s: float, tol: float, chunk_s: float = 0.025, reader=None) -> dict:
    """Chunks of about ``chunk_s`` until ``min_s`` ran, the last three per-launch times agree within ``tol``
    and the SM clock plateaus. ``{"replays", "device_s", "settled", "sm_mhz": [clock after each chunk]}``."""
    if per_sample_s >= 4 * chunk_s or not min_s > 0:  # none asked for; long samples are their own warm-up
        return {"replays": 0, "device_s": 0.0, "settled": False, "sm_mhz": []}
    n = int(min(10_000, max(1, round(chunk_s / max(per_sample_s, 1e-9)))))

    def steady(per: list, sm: list) -> bool:
        last = per[-3:]
        return len(last) == 3 and (max(last) - min(last)) / max(min(last), 1e-12) <= tol and plateau_reached(sm)

    total, calls, settled, sm = _chunks_until(sample, n, stream, sync, min_s, max_s, steady, reader)
    return {"replays": calls, "device_s": total, "settled": settled, "sm_mhz": sm}


def heat_up(device: torch.device, reader=None, min_s: float = 0.5, max_s: float = 3.0) -> dict:
    """Bring an idle GPU to its sustained-load state: chunks of 300 bf16 4096^3 GEMMs (about 55 ms), at least
    ``min_s`` and until four SM clock readings lie within 15 MHz, at most ``max_s`` device seconds."""
    gemm = functools.partial(torch.matmul, *(torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
                                             for _ in range(2)))
    total, _calls, plateau, sm = _chunks_until(gemm, 300, torch.cuda.current_stream(device),
                                               lambda: torch.cuda.synchronize(device), min_s, max_s,
                                               lambda _per, sm: plateau_reached(sm, window=4), reader)
    return {"device_s": total, "sm_mhz": sm, "plateau": plateau}


_PROCESS_STATE: dict = {}


def process_clock_state(device: torch.device, heat_up_gpu: bool = True) -> dict:
    """Once per process: ``{"reader", "policy", "heat_up"}`` (no heat-up unless ``heat_up_gpu``)."""
    key = str(device)
    if key not in _PROCESS_STATE:
        reader = open_reader(device.index or 0, "rocm" if getattr(torch.version, "hip", None) else "cuda")
        st = _PROCESS_STATE[key] = {"reader": reader, "policy": reader.policy(), "heat_up": None}
        if heat_up_gpu:
            st["heat_up"] = heat_up(device, reader if reader.available else None)
    return _PROCESS_STATE[key]


def _sample_loop(one_sample: Callable[[], None], samples: int, stream, flush_buf, time_budget_s: float,
                 reader) -> tuple[list[tuple], list]:
    """Up to ``samples`` event-bracketed samples (at least 5 once ``time_budget_s`` is spent), one in flight
    while the host waits for the previous one and reads the clock, so the GPU never idles between samples."""
    pairs: list[tuple] = []
    readings: list = []
    t_budget, mid = time.perf_counter() + time_budget_s, samples // 2
    for i in range(samples):
        if flush_buf is not None:
            flush_buf.zero_()
        e0, e1 = _events()
        e0.record(stream)
        one_sample()
        e1.record(stream)
        pairs.append((e0, e1))
        if reader is not None:
            if i > 0:
                pairs[i - 1][1].synchronize()
            readings.append(reader.read(full=i in (0, mid, samples - 1)))
        if i >= 4 and time.perf_counter() > t_budget:
            break
    return pairs, readings


def time_device(run: Callable[[], object], device: torch.device, *, graph_capturable: bool = True,
                samples: int = 30, target_sample_s: float = 2e-3, max_launches: int = 200,
                flush_l2: bool = False, time_budget_s: float = 20.0, warmup_s: float = 0.15,
                warmup_max_s: float = 1.0, warmup_tol: float = 0.005, min_window_s: float = 0.1,
                clocks: bool = True) -> TimingResult:
    """Kernel-only seconds per launch of ``run`` on a ``cuda:N`` device: warm-up, a one-launch probe, a graph
    of ``launches`` calls (events if capture fails), the clock-aware settle, then at least ``samples``
    samples (up to 4x to span ``min_window_s``; never under 5 once ``time_budget_s`` runs out) of about
    ``target_sample_s`` each (one launch with ``flush_l2``). ValueError for a device not a GPU."""
    if device.type != "cuda":
        raise ValueError(f"time_device needs a cuda/rocm device, got {device}")
    sync = lambda: torch.cuda.synchronize(device)  # noqa: E731
    stream = torch.cuda.current_stream(device)
    reader = process_clock_state(device)["reader"] if clocks else None
    reader = reader if reader is not None and reader.available else None
    warm = _warmup(run, sync)
    note, probe = "", None  # one launch's device time: a 4-launch graph replayed 3 times (no host overhead)
    if graph_capturable:
        probe, note = _capture(run, 4, stream, sync, device)
        graph_capturable = probe is not None
    one = max(_chunk(probe.replay, 3, _events(), stream, sync) / (3 * 4) if probe is not None
              else _chunk(run, 3, _events(), stream, sync) / 3, 1e-7)
    probe = None
    launches = 1 if flush_l2 else int(min(max_launches, max(1, round(target_sample_s / one))))
    flush_buf = None
    if flush_l2:  # twice the L2 (64 MiB where torch does not report it) of fp32, zeroed before each sample
        l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 64 * 2**20)
        flush_buf = torch.empty(2 * l2 // 4, dtype=torch.float32, device=device)
    graph = None
    if graph_capturable:
        graph, note = _capture(run, launches, stream, sync, device)

    def one_sample() -> None:
        if graph is not None:
            graph.replay()
        else:
            for _ in range(launches):
                run()

    settle = _settle(one_sample, one * launches, stream, sync, warmup_s, warmup_max_s, warmup_tol, reader=reader)
    n = min(4 * samples, max(samples, int(min_window_s / max(one * launches, 1e-9)) + 1))
    pairs, readings = _sample_loop(one_sample, n, stream, flush_buf, time_budget_s, reader)
    sync()
    out = [e0.elapsed_time(e1) / 1e3 / launches for e0, e1 in pairs]
    method, graph = "events" if graph is None else "graph", None  # free the graph pool before the next case
    extra = {"est_launch_s": one, "warmup_replays": settle["replays"], "warmup_device_s": settle["device_s"],
             "warmup_settled": settle["settled"], "warmup_sm_mhz": settle["sm_mhz"]}
    if reader is not None:
        extra["clocks"] = mark_samples(readings)
    return TimingResult(out, method, launches, warm, flush_l2, note, extra=extra)


def _host_samples(run: Callable[[], object], sync: Callable[[], None], samples: int, min_samples: int,
                  time_budget_s: float) -> list[float]:
    """Seconds of up to ``samples`` ``run(); sync()`` calls, at least ``min_samples`` once ``time_budget_s``
    is spent."""
    out: list[float] = []
    t_budget = time.perf_counter() + time_budget_s
    for _ in range(samples):
        t0 = time.perf_counter()
        run()
        sync()
        out.append(time.perf_counter() - t0)
        if len(out) >= min_samples and time.perf_counter() > t_budget:
            break
    return out


def time_call(run: Callable[[], object], device: torch.device, *, samples: int = 20,
              time_budget_s: float = 5.0) -> TimingResult:
    """Host-inclusive latency of one call (``run(); synchronize()``), as a user of the API sees it."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    warm = _warmup(run, sync, max_calls=5)
    return TimingResult(_host_samples(run, sync, samples, 3, time_budget_s), "host-sync", 1, warm)


def measure_latency(run: Callable[[], object], device: torch.device, *, graph_capturable: bool = False,
                    **kw) -> TimingResult:
    """Kernel-only latency on GPUs (:func:`time_device`); on CPU ``perf_counter`` per call after one warm-up
    call (``warmup``), ``samples`` (15) calls, at least ``min_samples`` (3) once ``time_budget_s`` (10) is spent."""
    if device.type == "cuda":
        return time_device(run, device, graph_capturable=graph_capturable, **kw)
    warmup = kw.get("warmup", True)
    if warmup:
        run()
    out = _host_samples(run, lambda: None, kw.get("samples", 15), kw.get("min_samples", 3),
                        kw.get("time_budget_s", 10.0))
    return TimingResult(out, "host", 1, int(warmup))


def clock_fields(tr: TimingResult) -> dict:
    """Record fields of ``tr``'s clock state (empty without readings): ``latency_sm_cycles`` (median of latency
    x the SM clock read during each sample, as nvbench-compare-robust derives it) and its samples, median SM
    clock, temperature, power, the :func:`clocks.mark_samples` lists, ``clock_locked``, ``warmup_settled``."""
    c = tr.extra.get("clocks")
    if not c:
        return {}
    st = next(iter(_PROCESS_STATE.values()), {})
    cycles = [t * f * 1e6 for t, f in zip(tr.samples_s, c["sm_mhz"]) if f is not None]
    return {"latency_sm_cycles": statistics.median(cycles) if cycles else None, "latency_sm_cycles_samples": cycles,
            "sm_clock_mhz": c["sm_mhz_median"], "gpu_temp_c": c["temp_c_median"], "gpu_power_w": c["power_w_median"],
            "sm_clock_samples_mhz": c["sm_mhz"], "clock_throttled_samples": c["throttled"],
            "clock_off_plateau_samples": c["off_plateau"], "clock_reasons": c["reasons"],
            "clock_locked": (st.get("policy") or {}).get("locked"), "warmup_settled": tr.extra.get("warmup_settled")}
