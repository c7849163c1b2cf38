"""PR gate: compare HEAD with BASE on accuracy (against calibrated tolerances) and latency (with statistics).

``mla-fp8-bench gate BASE HEAD [--results-dir results] [--machine NAME] [--factor 1.05] [--tolerances FILE]``

BASE and HEAD are each either a run JSON (``mla-fp8-bench run --json``), an asv result file, or a
commit hash (prefix) whose asv results are read from ``<results-dir>/<machine>/``. Exit status:

* **0** - nothing regressed;
* **1** - a regression: an accuracy metric exceeds its calibrated tolerance, or grew by more than
  ``--acc-factor`` (default 2.0, the calibration margin) over BASE, or became non-finite; a latency
  grew by more than ``--factor`` *and* the growth is statistically significant; a resource count
  (workspace bytes, partial slots) grew by more than ``--factor``; a parameter that was OK on BASE
  failed on HEAD;
* **2** - usage errors (missing file, unknown or ambiguous commit, bad factor, corrupt tolerance file).

**Latency statistics: one-sided Mann-Whitney U test** on the raw samples (H1: HEAD's samples are
stochastically larger than BASE's), significant at ``p < --alpha`` (default 0.01), combined with the
ratio of medians ``> --factor``. The test is rank-based (no normality assumption; robust to the
occasional slow outlier sample of GPU timing). The p-value is exact (enumerated permutation
distribution) when there are no ties and both sides have at most 12 samples, else the normal
approximation with tie and continuity corrections. Too few samples to ever reach ``alpha`` (e.g.
3 vs 3: the smallest exact p is 0.05) cannot be significant, and the row says so. When a side has
no samples - asv stores samples only with ``asv run --record-samples`` - the gate falls back to
asv's own criterion: non-overlapping 99 % confidence intervals (``stats_ci_99_a/b``); with neither,
the ratio alone decides (marked "no stats").

Skips are listed; failures on HEAD that were OK on BASE fail the gate; benchmark version changes
(asv ``version``) are listed as not comparable.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mla_fp8_bench.jsonio import load_json

EXIT_OK, EXIT_REGRESSION, EXIT_USAGE = 0, 1, 2
DEFAULT_FACTOR = 1.05
DEFAULT_ACC_FACTOR = 2.0
DEFAULT_ALPHA = 0.01

#: asv benchmark method -> (record metric, kind). kind: accuracy | latency | resource | info
ASV_METRICS = {
    "track_latency": ("latency_s", "latency"),
    "track_call_latency": ("call_latency_s", "latency"),
    "track_max_abs_error": ("max_abs_error_fp8_ref", "accuracy"),
    "track_max_abs_error_bf16_ref": ("max_abs_error_bf16_ref", "accuracy"),
    "track_rel_l2_error": ("rel_l2_error_fp8_ref", "accuracy"),
    "track_mismatch_fraction": ("mismatch_fraction", "accuracy"),
    "track_nondeterminism": ("nondeterminism_max_abs", "accuracy"),
    "track_seconds_per_pflop": ("seconds_per_pflop", "info"),
    "track_planner_time": ("planner_s", "latency"),
    "track_workspace_bytes": ("workspace_bytes", "resource"),
    "track_num_partials": ("num_partials", "resource"),
}
#: run-JSON record metric -> kind (latency metrics carry samples under ``latency_samples_s``).
RUN_METRICS = {
    "latency_s": "latency",
    "max_abs_error_fp8_ref": "accuracy", "mean_abs_error_fp8_ref": "accuracy", "rel_l2_error_fp8_ref": "accuracy",
    "max_abs_error_bf16_ref": "accuracy", "mean_abs_error_bf16_ref": "accuracy", "rel_l2_error_bf16_ref": "accuracy",
    "mismatch_fraction": "accuracy", "nondeterminism_max_abs": "accuracy", "lse_rel_error_fp8_ref": "accuracy",
    "workspace_bytes": "resource", "num_partials": "resource",
}
#: Growth below this absolute change is never an accuracy regression (deterministic values that move
#: within rounding noise of 0).
ACC_ABS_FLOOR = 1e-6


class GateUsageError(ValueError):
    """Bad gate input; the CLI prints the message and exits 2."""


# ------------------------------------------------------------------------------------------ statistics
def _exact_mwu_upper(u: float, n1: int, n2: int) -> float:
    """P(U >= u) under H0 for sample sizes n1 (HEAD) and n2 (BASE), no ties (exact enumeration)."""
    # counts[k] = number of rank arrangements with U == k (Gaussian binomial coefficient, DP)
    maxu = n1 * n2
    # dp over (i heads placed, j bases placed): polynomial in U
    dp = [[None] * (n2 + 1) for _ in range(n1 + 1)]
    dp[0][0] = np.zeros(maxu + 1, dtype=np.float64)
    dp[0][0][0] = 1.0
    for i in range(n1 + 1):
        for j in range(n2 + 1):
            if i == 0 and j == 0:
                continue
            acc = np.zeros(maxu + 1, dtype=np.float64)
            if i > 0 and dp[i - 1][j] is not None:
                # the largest element is a HEAD sample: it beats all j BASE samples
                acc[j:] += dp[i - 1][j][: maxu + 1 - j]
            if j > 0 and dp[i][j - 1] is not None:
                acc += dp[i][j - 1]
            dp[i][j] = acc
    counts = dp[n1][n2]
    k = int(math.ceil(u - 1e-9))
    return float(counts[k:].sum() / counts.sum())


def mann_whitney_greater(head: list[float] | np.ndarray, base: list[float] | np.ndarray) -> tuple[float, float]:
    """One-sided Mann-Whitney U test that ``head`` is stochastically larger than ``base``.

    Returns:
        ``(U, p)``: U counts pairs (h, b) with h > b (ties count 1/2); p is exact when there are no
        ties and both sizes are <= 12, else the normal approximation with tie and continuity
        corrections.

    Raises:
        ValueError: an empty sample.
    """
    h = np.asarray(head, dtype=np.float64)
    b = np.asarray(base, dtype=np.float64)
    n1, n2 = h.size, b.size
    if n1 == 0 or n2 == 0:
        raise ValueError("Mann-Whitney U needs at least one sample on each side")
    u = float((h[:, None] > b[None, :]).sum() + 0.5 * (h[:, None] == b[None, :]).sum())
    allv = np.concatenate([h, b])
    _, counts = np.unique(allv, return_counts=True)
    ties = bool((counts > 1).any())
    if not ties and n1 <= 12 and n2 <= 12:
        return u, _exact_mwu_upper(u, n1, n2)
    n = n1 + n2
    mu = n1 * n2 / 2.0
    tie_term = float((counts ** 3 - counts).sum()) / (n * (n - 1)) if n > 1 else 0.0
    var = n1 * n2 / 12.0 * ((n + 1) - tie_term)
    if var <= 0:
        return u, 1.0 if u <= mu else 0.0
    z = (u - mu - 0.5) / math.sqrt(var)
    return u, 0.5 * math.erfc(z / math.sqrt(2.0))


def min_attainable_p(n1: int, n2: int) -> float:
    """Smallest one-sided p the exact test can give: 1 / C(n1+n2, n1)."""
    return 1.0 / math.comb(n1 + n2, n1)


@dataclass
class LatencyVerdict:
    ratio: float
    significant: bool
    regressed: bool
    method: str  # "mann-whitney p=..." / "ci-99" / "no stats" / "too few samples"
    p: float | None = None


def latency_verdict(base: Measure, head: Measure, factor: float = DEFAULT_FACTOR,
                    alpha: float = DEFAULT_ALPHA) -> LatencyVerdict:
    """The gate's latency rule: ratio of medians (or values) > factor AND significant."""
    bv, hv = base.center(), head.center()
    ratio = hv / bv if bv and bv > 0 else math.inf
    if base.samples and head.samples and len(base.samples) >= 2 and len(head.samples) >= 2:
        n1, n2 = len(head.samples), len(base.samples)
        _u, p = mann_whitney_greater(head.samples, base.samples)
        if min_attainable_p(n1, n2) >= alpha:
            return LatencyVerdict(ratio, False, False, f"too few samples ({n2} vs {n1}) for p < {alpha}", p)
        sig = p < alpha
        return LatencyVerdict(ratio, sig, sig and ratio > factor, f"mann-whitney p={p:.2g}", p)
    if base.ci and head.ci:
        sig = head.ci[0] > base.ci[1]
        return LatencyVerdict(ratio, sig, sig and ratio > factor, "ci-99 " + ("disjoint" if sig else "overlap"))
    return LatencyVerdict(ratio, True, ratio > factor, "no stats")


# ------------------------------------------------------------------------------------------ data model
@dataclass
class Measure:
    """One metric of one (backend, case) on one side."""

    status: str  # ok | skipped | failed
    value: float | None = None
    samples: list[float] | None = None
    ci: tuple[float, float] | None = None
    version: str | None = None
    reason: str = ""

    def center(self) -> float | None:
        if self.samples:
            return float(np.median(self.samples))
        return self.value


@dataclass
class Side:
    """All measures of one side (BASE or HEAD): ``{(backend, case, metric): Measure}``."""

    label: str
    kinds: dict[str, str] = field(default_factory=dict)  # metric -> kind
    data: dict[tuple[str, str, str], Measure] = field(default_factory=dict)


def _num(x: Any) -> float | None:
    if x is None:
        return None
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def side_from_run_json(doc: dict[str, Any], label: str) -> Side:
    """A side from ``mla-fp8-bench run --json`` output."""
    side = Side(label)
    recs = doc.get("records")
    if not isinstance(recs, list):
        raise GateUsageError(f"{label}: not a run JSON (no 'records' list)")
    for r in recs:
        b, c, st = str(r.get("backend")), str(r.get("case")), r.get("status")
        for m, kind in RUN_METRICS.items():
            side.kinds[m] = kind
            key = (b, c, m)
            if st == "skipped":
                side.data[key] = Measure("skipped", reason=str(r.get("reason", "")))
            elif st != "ok":
                side.data[key] = Measure("failed", reason=str(r.get("reason", "")))
            else:
                v = _num(r.get(m))
                if v is None:
                    continue  # metric not measured for this backend (e.g. no timing)
                samples = r.get("latency_samples_s") if m == "latency_s" else None
                side.data[key] = Measure("ok", v, [float(x) for x in samples] if samples else None)
    return side


def _param_values(params: list[list[str]]) -> list[tuple[str, ...]]:
    import itertools

    def lit(s: str) -> str:
        try:
            return str(ast.literal_eval(s))
        except (ValueError, SyntaxError):
            return s

    return [tuple(lit(x) for x in combo) for combo in itertools.product(*params)] if params else [()]


def side_from_asv_result(doc: dict[str, Any], label: str) -> Side:
    """A side from an asv (0.6.x, api version 2) result file.

    Format: ``results[benchmark] = [result, params, version, started_at, duration, stats_ci_99_a,
    stats_ci_99_b, stats_q_25, stats_q_75, stats_number, stats_repeat, samples, profile]`` (columns
    named in ``result_columns``, trailing Nones dropped); ``result``/``stats_*``/``samples`` are lists
    over ``itertools.product(*params)``; a failed combination is ``null``, a skipped one ``NaN``.
    """
    side = Side(label)
    cols = doc.get("result_columns")
    res = doc.get("results")
    if not isinstance(cols, list) or not isinstance(res, dict):
        raise GateUsageError(f"{label}: not an asv result file (no result_columns/results)")
    for name, row in res.items():
        d = dict(zip(cols, row))
        method = name.rsplit(".", 1)[-1]
        metric, kind = ASV_METRICS.get(method, (method, _guess_kind(method)))
        side.kinds[metric] = kind
        params = d.get("params") or []
        combos = _param_values(params)
        results = d.get("result")
        if not isinstance(results, list):
            results = [results] * len(combos)
        ci_a, ci_b, samples = d.get("stats_ci_99_a"), d.get("stats_ci_99_b"), d.get("samples")
        for i, combo in enumerate(combos):
            backend = combo[0] if len(combo) >= 1 else ""
            case = ", ".join(combo[1:]) if len(combo) >= 2 else (name.rsplit(".", 2)[-2] if not combo else "")
            key = (backend, case, metric if not (len(combos) == 1 and not combo) else name)
            v = results[i] if i < len(results) else None
            if v is None:
                side.data[key] = Measure("failed", version=d.get("version"))
                continue
            v = float(v)
            if math.isnan(v):
                side.data[key] = Measure("skipped", version=d.get("version"))
                continue
            ci = None
            if isinstance(ci_a, list) and isinstance(ci_b, list) and i < len(ci_a) and i < len(ci_b) \
                    and ci_a[i] is not None and ci_b[i] is not None:
                ci = (float(ci_a[i]), float(ci_b[i]))
            smp = samples[i] if isinstance(samples, list) and i < len(samples) else None
            side.data[key] = Measure("ok", v, [float(x) for x in smp] if smp else None, ci, d.get("version"))
    return side


def _guess_kind(method: str) -> str:
    if any(w in method for w in ("error", "mismatch", "nondeterminism", "nonfinite")):
        return "accuracy"
    if "latency" in method or method.startswith("time_"):
        return "latency"
    return "info"


# ------------------------------------------------------------------------------------------ loading
def _load_json(path: str, label: str) -> dict[str, Any]:
    return load_json(path, label, GateUsageError)


def _side_from_doc(doc: dict[str, Any], label: str) -> Side:
    if "result_columns" in doc:
        return side_from_asv_result(doc, label)
    if "records" in doc:
        return side_from_run_json(doc, label)
    raise GateUsageError(f"{label}: neither a run JSON ('records') nor an asv result file ('result_columns')")


def resolve_machine(results_dir: str, machine: str | None) -> str:
    """The machine directory to read: ``--machine`` or the only one present."""
    root = Path(results_dir)
    if not root.is_dir():
        raise GateUsageError(f"results directory {results_dir} does not exist")
    machines = sorted(p.name for p in root.iterdir() if p.is_dir())
    if machine:
        if machine not in machines:
            raise GateUsageError(f"machine {machine!r} has no results in {results_dir}: found "
                                 f"{', '.join(machines) or 'none'}")
        return machine
    if len(machines) == 1:
        return machines[0]
    raise GateUsageError(f"{results_dir} holds results of {len(machines)} machines ({', '.join(machines) or 'none'}): "
                         "pass --machine")


def _check_prefix(prefix: str) -> None:
    if len(prefix) < 4 or not all(c in "0123456789abcdefABCDEF" for c in prefix):
        raise GateUsageError(f"{prefix!r} is neither an existing file nor a commit hash prefix (>= 4 hex digits)")


def find_asv_result(results_dir: str, machine: str, prefix: str, env: str | None = None) -> str:
    """The result file of commit ``prefix`` on ``machine`` (optionally filtered by env name substring).

    Raises:
        GateUsageError: no such commit, an ambiguous prefix, or several environments without ``--env``.
    """
    _check_prefix(prefix)
    mdir = Path(results_dir) / machine
    hits: dict[str, list[tuple[str, str]]] = {}
    for p in sorted(mdir.glob("*.json")):
        if p.name == "machine.json":
            continue
        if not p.name[:min(8, len(prefix))].lower() == prefix[:8].lower():
            continue
        try:
            with open(p) as f:
                d = json.load(f)
        except (OSError, json.JSONDecodeError):
            continue
        ch = str(d.get("commit_hash", ""))
        if ch.lower().startswith(prefix.lower()):
            hits.setdefault(ch, []).append((str(p), str(d.get("env_name", ""))))
    if not hits:
        raise GateUsageError(f"commit {prefix} has no asv results in {mdir}")
    if len(hits) > 1:
        raise GateUsageError(f"commit prefix {prefix} is ambiguous in {mdir}: {', '.join(sorted(h[:12] for h in hits))}")
    files = next(iter(hits.values()))
    if env:
        files = [f for f in files if env in f[1]]
        if not files:
            raise GateUsageError(f"commit {prefix}: no result file whose environment contains {env!r}")
    if len(files) > 1:
        raise GateUsageError(f"commit {prefix} has results of {len(files)} environments "
                             f"({', '.join(e for _, e in files)}): pass --env")
    return files[0][0]


def load_side(spec: str, label: str, results_dir: str, machine: str | None, env: str | None) -> tuple[Side, str]:
    """(Side, where it came from) for a file path or a commit prefix."""
    if os.path.isfile(spec):
        return _side_from_doc(_load_json(spec, label), f"{label} {spec}"), spec
    _check_prefix(spec)
    path = find_asv_result(results_dir, resolve_machine(results_dir, machine), spec, env)
    return _side_from_doc(_load_json(path, label), f"{label} {spec}"), path


# ------------------------------------------------------------------------------------------ comparing
@dataclass
class Row:
    backend: str
    case: str
    metric: str
    kind: str
    base: str
    head: str
    ratio: float | None
    verdict: str  # REGRESSION | FAILED | ok | improved | skipped | not comparable | new | removed | info
    detail: str = ""

    @property
    def gating(self) -> bool:
        return self.verdict in ("REGRESSION", "FAILED")


def _fmt(m: Measure | None, kind: str) -> str:
    if m is None:
        return "-"
    if m.status != "ok":
        return m.status
    v = m.center()
    if v is None:
        return "-"
    if kind == "latency":
        return _fmt_s(v) + (f" (n={len(m.samples)})" if m.samples else "")
    return f"{v:.4g}"


def _fmt_s(x: float) -> str:
    if x >= 1:
        return f"{x:.3f} s"
    if x >= 1e-3:
        return f"{x * 1e3:.3f} ms"
    return f"{x * 1e6:.2f} us"


def compare(base: Side, head: Side, *, factor: float = DEFAULT_FACTOR, acc_factor: float = DEFAULT_ACC_FACTOR,
            alpha: float = DEFAULT_ALPHA, tolerances=None) -> list[Row]:
    """Every (backend, case, metric) of either side with its verdict (see module docstring)."""
    from mla_fp8_bench.analysis.calibrate import family_of

    rows: list[Row] = []
    keys = sorted(set(base.data) | set(head.data))
    for key in keys:
        b, c, m = key
        kind = head.kinds.get(m) or base.kinds.get(m) or "info"
        bm, hm = base.data.get(key), head.data.get(key)
        row = Row(b, c, m, kind, _fmt(bm, kind), _fmt(hm, kind), None, "ok")
        rows.append(row)
        if hm is None:
            row.verdict = "removed"
            continue
        if hm.status == "failed":
            if bm is not None and bm.status == "ok":
                row.verdict, row.detail = "FAILED", f"failed on HEAD, OK on BASE {hm.reason}".strip()
            else:
                row.verdict, row.detail = "failed", ("still failing" if bm is not None else "new, failed")
            continue
        if hm.status == "skipped":
            row.verdict, row.detail = "skipped", hm.reason
            continue
        # HEAD ok
        tol_detail = ""
        if kind == "accuracy" and tolerances is not None:
            lim, how = tolerances.lookup(b, family_of({"backend": b, "case": c}))
            if lim is not None and m in lim:
                v = hm.center()
                tol_detail = f"tol {lim[m]:.4g} ({how.split(' (')[0]})"
                if v is None or not math.isfinite(v) or v > lim[m]:
                    row.verdict = "REGRESSION"
                    row.ratio = (v / bm.center()) if (bm and bm.status == "ok" and bm.center()) else None
                    row.detail = f"exceeds tolerance: {v:.4g} > {lim[m]:.4g} ({how})" + (
                        "; already over at BASE" if bm and bm.status == "ok" and (bm.center() or 0) > lim[m] else "")
                    continue
        if kind == "accuracy" and (hm.center() is None or not math.isfinite(hm.center())):
            row.verdict, row.detail = "REGRESSION", "non-finite on HEAD"
            continue
        if bm is None or bm.status != "ok":
            row.verdict = "new" if bm is None else "fixed" if bm.status == "failed" else "was skipped"
            row.detail = tol_detail
            continue
        if bm.version is not None and hm.version is not None and bm.version != hm.version:
            row.verdict, row.detail = "not comparable", "benchmark version changed"
            continue
        bv, hv = bm.center(), hm.center()
        if kind == "latency":
            lv = latency_verdict(bm, hm, factor, alpha)
            row.ratio = lv.ratio
            row.detail = lv.method
            if lv.regressed:
                row.verdict = "REGRESSION"
                row.detail = f"{lv.ratio:.3f}x > {factor} and significant ({lv.method})"
            elif lv.ratio < 1 / factor and _sig_faster(bm, hm, alpha):
                row.verdict, row.detail = "improved", f"{lv.ratio:.3f}x, significantly faster"
            continue
        row.ratio = (hv / bv) if bv else (math.inf if hv else 1.0)
        if kind == "accuracy":
            if hv > bv * acc_factor and hv - bv > ACC_ABS_FLOOR:
                row.verdict, row.detail = "REGRESSION", f"grew {row.ratio:.2f}x > {acc_factor}x over BASE" + (
                    f"; {tol_detail}" if tol_detail else "")
            else:
                row.detail = tol_detail
                if hv < bv / acc_factor:
                    row.verdict = "improved"
        elif kind == "resource":
            if hv > bv * factor:
                row.verdict, row.detail = "REGRESSION", f"grew {row.ratio:.3f}x > {factor}x"
            elif hv < bv / factor:
                row.verdict = "improved"
        else:
            row.verdict = "info"
    return rows


def _sig_faster(bm: Measure, hm: Measure, alpha: float) -> bool:
    if bm.samples and hm.samples and len(bm.samples) >= 2 and len(hm.samples) >= 2:
        return mann_whitney_greater(bm.samples, hm.samples)[1] < alpha
    if bm.ci and hm.ci:
        return bm.ci[0] > hm.ci[1]
    return True


# ------------------------------------------------------------------------------------------ CLI
_STYLE = {"REGRESSION": "bold red", "FAILED": "bold red", "improved": "green", "skipped": "dim",
          "not comparable": "yellow", "failed": "yellow", "new": "cyan"}


def cmd_gate(args: argparse.Namespace, console) -> int:
    from rich.table import Table

    if not (math.isfinite(args.factor) and args.factor >= 1.0):
        raise GateUsageError(f"--factor {args.factor} is invalid: a ratio >= 1.0 (e.g. 1.05)")
    if not (math.isfinite(args.acc_factor) and args.acc_factor >= 1.0):
        raise GateUsageError(f"--acc-factor {args.acc_factor} is invalid: a ratio >= 1.0")
    if not 0 < args.alpha < 1:
        raise GateUsageError(f"--alpha {args.alpha} is invalid: in (0, 1)")
    tol = None
    if args.tolerances:
        from mla_fp8_bench.analysis.calibrate import load_tolerances

        tol = load_tolerances(args.tolerances)
    base, bsrc = load_side(args.base, "BASE", args.results_dir, args.machine, args.env)
    head, hsrc = load_side(args.head, "HEAD", args.results_dir, args.machine, args.env)
    rows = compare(base, head, factor=args.factor, acc_factor=args.acc_factor, alpha=args.alpha, tolerances=tol)
    quiet = ("ok", "info", "skipped")
    shown = rows if args.all else [r for r in rows if r.verdict not in quiet
                                   and r.verdict != "removed"]
    t = Table(title=f"gate: BASE {bsrc}  vs  HEAD {hsrc}  (latency factor {args.factor}, "
                    f"Mann-Whitney alpha {args.alpha}; accuracy: "
                    f"{'tolerances ' + tol.name + ' and ' if tol else ''}growth > {args.acc_factor}x)")
    for col in ("verdict", "backend", "case", "metric", "BASE", "HEAD", "ratio", "detail"):
        t.add_column(col, overflow="fold")
    for r in shown:
        st = _STYLE.get(r.verdict, "")
        t.add_row(f"[{st}]{r.verdict}[/{st}]" if st else r.verdict, r.backend, r.case, r.metric, r.base, r.head,
                  "-" if r.ratio is None or not math.isfinite(r.ratio) else f"{r.ratio:.3f}", r.detail)
    if shown:
        console.print(t)
    # one unfolded line per notable row, so CI logs and greps see every name whatever the terminal width
    for r in shown:
        if r.verdict not in ("ok", "info", "new"):
            console.print(f"{r.verdict}: {r.backend} {r.case} {r.metric}: BASE {r.base} -> HEAD {r.head}"
                          + (f" ({r.detail})" if r.detail else ""), highlight=False, soft_wrap=True)
    # skips, grouped: backend -> cases (metrics of a skipped param are all skipped)
    # a param counts as skipped only when every one of its metrics was skipped (a CPU run skips call
    # latency alone, which is not a skipped case)
    by_param: dict[tuple[str, str], list] = {}
    for r in rows:
        by_param.setdefault((r.backend, r.case), []).append(r)
    skipped: dict[str, dict[str, str]] = {}
    for (b, c), rs in by_param.items():
        if all(r.verdict == "skipped" for r in rs):
            skipped.setdefault(b, {}).setdefault(c, next((r.detail for r in rs if r.detail), ""))
    for b, cases in sorted(skipped.items()):
        reasons = sorted({x for x in cases.values() if x})
        console.print(f"skipped on HEAD: {b}: {len(cases)} case(s) ({', '.join(sorted(cases))})"
                      + (f": {reasons[0][:160]}" if reasons else ""), highlight=False, soft_wrap=True)
    removed = [r for r in rows if r.verdict == "removed" and r.base not in ("skipped", "failed")]
    if removed and not args.all:
        console.print(f"absent on HEAD (measured on BASE): {len(removed)} row(s), metrics "
                      f"{', '.join(sorted({r.metric for r in removed}))} (--all lists them)", highlight=False,
                      soft_wrap=True)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.verdict] = counts.get(r.verdict, 0) + 1
    console.print("compared (backend, case, metric) rows: " + ", ".join(f"{v} {n}" for v, n in sorted(counts.items())),
                  highlight=False)
    bad = [r for r in rows if r.gating]
    if bad:
        console.print(f"[bold red]GATE FAILED[/bold red]: {len(bad)} regression(s)/new failure(s)")
        return EXIT_REGRESSION
    console.print("[green]GATE PASSED[/green]")
    return EXIT_OK


def _handler(args: argparse.Namespace, console) -> int:
    from mla_fp8_bench.analysis.calibrate import ToleranceFileError

    try:
        return cmd_gate(args, console)
    except (GateUsageError, ToleranceFileError) as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        return EXIT_USAGE


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("gate", help="PR gate: HEAD vs BASE (accuracy vs tolerances, latency with statistics)")
    p.add_argument("base", metavar="BASE", help="run JSON, asv result file, or commit hash (prefix) in --results-dir")
    p.add_argument("head", metavar="HEAD", help="run JSON, asv result file, or commit hash (prefix) in --results-dir")
    p.add_argument("--results-dir", default="results", help="asv results directory (default: results)")
    p.add_argument("--machine", help="asv machine name (default: the only one in --results-dir)")
    p.add_argument("--env", help="substring of the asv environment name when a commit has several")
    p.add_argument("--factor", type=float, default=DEFAULT_FACTOR, help="latency/resource growth factor (1.05)")
    p.add_argument("--acc-factor", type=float, default=DEFAULT_ACC_FACTOR,
                   help="accuracy growth factor over BASE (2.0, the calibration margin)")
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help="Mann-Whitney significance level (0.01)")
    p.add_argument("--tolerances", help="calibrated tolerance JSON (e.g. tolerances/cpu-emulated-v1.json)")
    p.add_argument("--all", action="store_true", help="show every compared row, not only notable ones")
    p.set_defaults(handler=_handler)
