"""Latency rounds: the (backend, case) grid timed again, each round a latency-only pass in a fresh process
forked by a :class:`RoundServer`; the figure compared is the median over rounds (round 0: the run's own)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from mla_fp8_bench.config import RunConfig

#: Case orders of successive rounds (:func:`round_order`).
ORDERS = ("sorted", "reversed", "shuffled")
#: Record fields a round carries per (backend, case).
ROUND_FIELDS = ("latency_s", "latency_sm_cycles", "sm_clock_mhz", "gpu_power_w", "off_plateau_fraction")


def round_order(i: int) -> str:
    """The order of round ``i`` (0-based): sorted, reversed, shuffled, sorted, ..."""
    if i < 0:
        raise ValueError(f"round index {i} is invalid: an integer >= 0")
    return ORDERS[i % len(ORDERS)]


def case_work(case_id: str) -> float:
    """FLOPs of a case id; ``inf`` for an id that does not parse (its pair fails in its own row, last)."""
    from mla_fp8_bench.problem.cases import CaseError, parse_case_id
    from mla_fp8_bench.problem.flops import case_flops

    try:
        return case_flops(parse_case_id(case_id))
    except (CaseError, ValueError):
        return float("inf")


def ordered(pairs: Sequence[tuple[str, str]], order: str, seed: int = 0) -> list[tuple[str, str]]:
    """``pairs`` (backend, case) in measuring order: cases by :func:`case_work`, then id; within a case the
    backends as given (``sorted``), ``reversed`` or ``shuffled`` (``seed``)."""
    if order not in ORDERS:
        raise ValueError(f"order {order!r} is unknown: allowed {', '.join(ORDERS)}")
    rng, by_case = random.Random(seed), {}
    for b, c in pairs:
        by_case.setdefault(c, []).append(b)
    out: list[tuple[str, str]] = []
    for c in sorted(by_case, key=lambda c: (case_work(c), c)):
        bs = by_case[c][::-1] if order == "reversed" else by_case[c]
        if order == "shuffled":
            rng.shuffle(bs)
        out.extend((b, c) for b in bs)
    return out


def spread(values: Sequence[float]) -> float:
    """Relative spread of round values: ``(max - min) / median`` (0 for one value)."""
    if not values:
        raise ValueError("spread of no values")
    med = statistics.median(values)
    if len(values) > 1 and not med > 0:
        raise ValueError(f"spread needs a positive median, got {med}")
    return (max(values) - min(values)) / med if len(values) > 1 else 0.0


def measure_round(backends: Sequence[str], cases: Sequence[str], order: str = "sorted", seed: int = 0,
                  device: str = "auto", progress: Callable[[str], None] | None = None,
                  config: RunConfig | None = None) -> dict[str, Any]:
    """One latency-only pass (``measure_latency``'s defaults) over (backend, case) in ``order`` in this process:
    ``{"order", "seed", "pid", "wall_s", "setup_s", "device", ..., "rows": [{"backend", "case", "phases_s",
    ...ROUND_FIELDS}]}``; a pair that cannot run is a row with ``error``."""
    import torch

    from mla_fp8_bench.backends import get_backend
    from mla_fp8_bench.measure.devices import platform_info
    from mla_fp8_bench.measure.timing import _PROCESS_STATE, clock_fields, measure_latency
    from mla_fp8_bench.problem.cases import parse_case_id
    from mla_fp8_bench.problem.inputs import make_inputs

    t0 = time.perf_counter()
    pinfo = platform_info(device)
    bks: dict[str, Any] = {}
    for b in backends:  # a backend that cannot load or tell its availability fails its own rows only
        try:
            bk = get_backend(b, config)
            bks[b] = bk if (avail := bk.availability(pinfo)) else f"unavailable: {avail.reason}"
        except Exception as exc:  # noqa: BLE001
            bks[b] = f"backend failed to load: {type(exc).__name__}: {str(exc)[:200]}"
    setup_s = time.perf_counter() - t0
    rows: list[dict[str, Any]] = []
    inputs: dict[str, Any] = {}
    for b, c in ordered([(b, c) for c in cases for b in backends], order, seed):
        row: dict[str, Any] = {"backend": b, "case": c, "phases_s": {}}
        prep = None
        try:
            if isinstance(bks[b], str):
                raise RuntimeError(bks[b])
            case = parse_case_id(c)
            if not (sup := bks[b].supports(case, pinfo)):
                raise RuntimeError(f"unsupported: {sup.reason}")
            t1 = time.perf_counter()
            if c not in inputs:
                inputs.clear()
                if pinfo.device.type == "cuda":
                    torch.cuda.empty_cache()
                inputs[c] = make_inputs(case, pinfo.device, pinfo.fp8_dtype)
            t2 = time.perf_counter()
            prep = bks[b].prepare_case(inputs[c])
            t3 = time.perf_counter()
            tr = measure_latency(prep.run, pinfo.device, graph_capturable=prep.graph_capturable,
                                 **({} if pinfo.device.type == "cuda" else {"warmup": False}))
            row["phases_s"].update(inputs=t2 - t1, prepare=t3 - t2, timing=time.perf_counter() - t3)
            clock, n = clock_fields(tr), len(tr.samples_s)
            off = clock.get("clock_off_plateau_samples")
            row.update(latency_s=tr.median_s, **{k: clock.get(k) for k in ROUND_FIELDS[1:4]},
                       off_plateau_fraction=len(off) / n if off is not None and n else None, samples=n,
                       method=tr.method, launches_per_sample=tr.launches_per_sample)
        except Exception as exc:  # noqa: BLE001 - one failing pair never loses the others
            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        finally:
            if prep is not None and prep.cleanup is not None:
                with contextlib.suppress(Exception):
                    prep.cleanup()
        rows.append(row)
        if progress is not None:
            progress(f"{b} {c}: " + (f"{row['latency_s'] * 1e6:.2f} us" if "latency_s" in row else row["error"]))
    st = next(iter(_PROCESS_STATE.values()), {})
    return {"order": order, "seed": seed, "pid": os.getpid(), "wall_s": time.perf_counter() - t0,
            "setup_s": setup_s, "device": pinfo.name, "vendor": pinfo.vendor, "clock_policy": st.get("policy"),
            "heat_up": st.get("heat_up"), "rows": rows}


def suite_env(prepend: Sequence[str] = (), base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default ``os.environ``) with ``prepend`` and this suite's root first on ``PYTHONPATH``, so a
    round worker of another interpreter, or of an asv benchmark process, imports the same suite."""
    env = dict(os.environ) if base is None else dict(base)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parts = [*prepend, root, *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    return env


def _failed(error: str) -> dict[str, Any]:
    return {"error": error, "rows": []}


def run_rounds(backends: Sequence[str], cases: Sequence[str], rounds: int, *, env: dict[str, str] | None = None,
               device: str = "auto", seed: int = 0, timeout: float = 600.0,
               log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Rounds 1 .. ``rounds`` (:func:`round_order` of their index), each in a fresh child of one
    :class:`RoundServer`; a round that fails or outlasts ``timeout`` s is a document with ``error`` (an ended
    server is replaced)."""
    docs: list[dict[str, Any]] = []
    if rounds <= 0:
        return docs
    start = lambda: RoundServer(sys.executable, suite_env(base=env), preload=backends)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="mla_fp8_rounds_") as tmp:
        srv = start()
        try:
            for i in range(1, rounds + 1):
                if srv.proc.poll() is not None:  # a timed-out or crashed server: the next round gets a new one
                    srv.close()
                    srv = start()
                doc = srv.round(backends, cases, round_order(i), seed + i, os.path.join(tmp, f"round{i}.json"),
                                device, timeout=timeout)
                docs.append({**doc, "round": i})
                if log is not None:
                    ok = sum(1 for r in doc["rows"] if "latency_s" in r)
                    log(f"round {i} ({round_order(i)}): " + (doc.get("error") or
                        f"{ok}/{len(doc['rows'])} pairs in {doc['process_wall_s']:.1f} s"))
        except BaseException:  # interrupted: no round child may write into tmp after it is removed
            srv.kill()
            raise
        finally:
            srv.close()
    return docs


def _measured(row: dict[str, Any]) -> bool:
    """A row that carries a latency: a number (an impossible one is kept, so the gate reports it)."""
    lat = row.get("latency_s")
    return isinstance(lat, (int, float)) and not isinstance(lat, bool)


def merge_rounds(records: list[dict[str, Any]], rounds: Sequence[dict[str, Any]]) -> None:
    """Fold ``rounds`` into the ok records that carry a latency, in place: ``latency_rounds_s`` (the record's
    own latency as round 0, then each round's), ``latency_sm_cycles_rounds``, ``sm_clock_rounds_mhz``,
    ``gpu_power_rounds_w``, ``latency_round_orders``, ``latency_round0_s``; the plain fields become medians
    over rounds, ``latency_round_spread`` their :func:`spread`, and ``tflops`` / ``gb_s`` follow."""
    by: dict[tuple[str, str], list[tuple[str, dict[str, Any]]]] = {}
    for doc in rounds:
        for row in filter(_measured, doc.get("rows", [])):
            by.setdefault((row["backend"], row["case"]), []).append((doc.get("order", "?"), row))
    for rec in records:
        if rec.get("status") != "ok" or not _measured(rec):
            continue
        extra = by.get((rec["backend"], rec["case"]), [])
        rows = [rec] + [r for _o, r in extra]  # the record's own values are round 0
        rec["latency_round0_s"] = rec["latency_s"]
        rec["latency_round_orders"] = [rec.get("latency_round0_order", "sorted")] + [o for o, _r in extra]
        rec["latency_rounds_s"] = [float(r["latency_s"]) for r in rows]
        for key, out in (("latency_sm_cycles", "latency_sm_cycles_rounds"), ("sm_clock_mhz", "sm_clock_rounds_mhz"),
                         ("gpu_power_w", "gpu_power_rounds_w")):
            if vals := [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]:
                rec[out], rec[key] = vals, statistics.median(vals)
        rec["latency_s"] = statistics.median(rec["latency_rounds_s"])
        rec["latency_round_spread"] = spread(rec["latency_rounds_s"])
        for key, out, unit in (("flops", "tflops", 1e12), ("bytes", "gb_s", 1e9)):
            if rec["latency_s"] > 0 and rec.get(key):
                rec[out] = rec[key] / rec["latency_s"] / unit


def records_from_rounds(rounds: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ok run records from latency-only rounds alone, one per (backend, case) measured in any round, with
    the fields :func:`merge_rounds` gives."""
    first: dict[tuple[str, str], dict[str, Any]] = {}
    rest: list[dict[str, Any]] = []
    for doc in rounds:
        left = []
        for row in doc.get("rows", []):
            key = (row["backend"], row["case"])
            if key not in first and _measured(row):
                first[key] = {"backend": key[0], "case": key[1], "status": "ok", "reason": "",
                              "timing_scope": "kernel", "latency_round0_order": doc.get("order", "?"),
                              **{k: row.get(k) for k in ROUND_FIELDS}}
            else:
                left.append(row)
        rest.append({"order": doc.get("order", "?"), "rows": left})
    records = list(first.values())
    merge_rounds(records, rest)
    return records


def fold_rounds(records: list[dict[str, Any]], rounds: int, device: str, env: dict[str, str] | None = None,
                log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Rounds 1 .. ``rounds - 1`` of the kernel-timed records' pairs (their own timing is round 0), folded
    into ``records``; returns ``{"rounds", "wall_s", "extra": [{"round", "order", "wall_s", "error"}]}``
    (or ``{"rounds": 1, "extra": []}``)."""
    from mla_fp8_bench.measure.metric_table import record_is_emulation

    kernel = [r for r in records if r.get("status") == "ok" and r.get("latency_s") and not record_is_emulation(r)]
    if rounds <= 1 or not kernel:
        return {"rounds": 1, "extra": []}
    t0 = time.perf_counter()
    docs = run_rounds(list(dict.fromkeys(r["backend"] for r in kernel)), list(dict.fromkeys(r["case"] for r in kernel)),
                      rounds - 1, device=device, env=env, log=log)
    merge_rounds(records, docs)
    return {"rounds": rounds, "wall_s": time.perf_counter() - t0,
            "extra": [{"round": d.get("round"), "order": d.get("order"), "wall_s": d.get("process_wall_s"),
                       "error": d.get("error")} for d in docs]}


def serve(preload: Sequence[str] = ()) -> int:
    """A round server: import torch and the ``preload`` backends once, then per JSON line on stdin
    (``{"backends", "cases", "order", "seed", "device", "json"}``) fork a child that writes the round
    document to ``json``; answers ``{"rc": exit status}`` on stdout; EOF or ``quit`` ends it. Nothing
    initialises CUDA/HIP before the fork."""
    import torch  # noqa: F401 - the import is the point: children inherit it

    from mla_fp8_bench.backends import get_backend
    from mla_fp8_bench.jsonio import write_json_atomic

    for b in preload:
        with contextlib.suppress(Exception):  # a backend that cannot load fails in the child, with its reason
            get_backend(b)
    for line in map(str.strip, sys.stdin):
        if line == "quit":
            break
        if not line:
            continue
        req = json.loads(line)
        sys.stdout.flush()
        if (pid := os.fork()) == 0:  # child: progress to stderr, the answer channel stays clean
            rc = 1
            try:
                os.dup2(2, 1)
                write_json_atomic(measure_round(req["backends"], req["cases"], req["order"], int(req["seed"]),
                                                req["device"], lambda s: print(s, file=sys.stderr, flush=True),
                                                RunConfig.from_env()), req["json"])
                rc = 0
            except BaseException as exc:  # noqa: BLE001 - the child must never return into the server loop
                print(f"round child failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            finally:
                sys.stderr.flush()
                os._exit(rc)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}), flush=True)
    return 0


class RoundServer:
    """A running :func:`serve` process of one interpreter and environment; :meth:`round` asks it for one."""

    def __init__(self, python: str, env: dict[str, str] | None, preload: Sequence[str] = ()):
        cmd = [python, "-m", "mla_fp8_bench.harness.rounds", "--serve", ",".join(preload)]
        self._err = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: a full pipe would block the children
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err,
                                     text=True, bufsize=1, start_new_session=True)

    def _stderr_tail(self, since: int, n: int = 300) -> str:
        fd = self._err.fileno()
        return os.pread(fd, max(os.fstat(fd).st_size - since, 0), since).decode(errors="replace")[-n:].strip()

    def round(self, backends: Sequence[str], cases: Sequence[str], order: str, seed: int, out: str,
              device: str = "auto", timeout: float | None = None) -> dict[str, Any]:
        """One round in a fresh child: the round document, or ``{"error", "rows": []}``; a round that
        outlasts ``timeout`` seconds ends the server."""
        t0 = time.perf_counter()
        req = {"backends": list(backends), "cases": list(cases), "order": order, "seed": seed, "device": device,
               "json": out}
        try:
            since = os.fstat(self._err.fileno()).st_size  # this round's messages only
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            if timeout is not None and not select.select([self.proc.stdout], [], [], timeout)[0]:
                self.kill()
                return _failed(f"round timed out after {timeout:.0f} s")
            answer = self.proc.stdout.readline()
        except (BrokenPipeError, OSError, ValueError) as exc:
            return _failed(f"round server is gone: {exc}")
        if not answer:
            return _failed(f"round server exited {self.proc.wait()}: {self._stderr_tail(since, 400)}")
        try:
            rc = json.loads(answer).get("rc")
        except (ValueError, AttributeError):
            self.kill()
            return _failed(f"round server answered {answer.strip()[:100]!r}, not a round server's answer: "
                           f"{self._stderr_tail(since)}")
        if rc != 0 or not os.path.isfile(out):
            return _failed(f"round child exited {rc}: {self._stderr_tail(since)}")
        with open(out) as f:
            return {**json.load(f), "process_wall_s": time.perf_counter() - t0}

    def kill(self) -> None:
        """End the server and its running child now."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def close(self) -> None:
        try:
            if self.proc.stdin:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except Exception:  # noqa: BLE001 - a hung server is killed
            self.kill()
        finally:
            self._err.close()


if __name__ == "__main__":  # python -m mla_fp8_bench.harness.rounds --serve BACKEND,...: the RoundServer's process
    if sys.argv[1:2] != ["--serve"]:
        sys.exit("usage: python -m mla_fp8_bench.harness.rounds --serve [BACKEND,...] (a RoundServer's process)")
    sys.exit(serve([x for x in (sys.argv[2] if len(sys.argv) > 2 else "").split(",") if x]))
