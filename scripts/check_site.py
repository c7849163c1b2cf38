#!/usr/bin/env python3
"""Browser check of the published asv site: publish it, serve it, look at it with headless chromium
with the network blocked.

Steps:

1. ``mla-fp8-bench publish`` (:func:`mla_fp8_bench.report.publish.publish_site`) into a temporary
   html directory, from the repository's ``results/`` when it holds result files, else from a
   synthetic results fixture (``--synthetic`` forces it): one machine, the repository's last two
   commits, plausible values for three backends on the CPU sweep and NaN (= skipped) elsewhere.
   ``publish`` replaces every CDN script/stylesheet of asv's pages with a pinned local copy (see that
   module; the copies come from ``mla-fp8-bench publish --install-assets``).
2. ``python -m http.server`` on 127.0.0.1 and a free port, serving that directory.
3. Debian's ``/usr/bin/chromium``, headless (``--dump-dom`` and ``--screenshot`` with
   ``--virtual-time-budget``, a fresh ``--user-data-dir``; no playwright), with every host name but
   127.0.0.1 unresolvable and a proxy to nowhere (:data:`NETWORK_BLOCK_FLAGS`), checks:

   * the benchmark list (``#/summarylist``) names our classes ``MLAPrefill`` and ``AiterPlan``;
   * the graph pages of ``MLAPrefill.track_latency`` and ``MLAPrefill.track_max_abs_error`` render:
     flot's canvas and its axis tick labels are in the DOM, asv's "No data for this combination"
     and its error banner are not, and the screenshot has coloured series pixels inside the plot
     (flot draws series on a canvas, so data points are checked in the pixels);
   * the graph data files asv wrote (``graphs/.../<benchmark>.json``) hold finite values;
   * no page or stylesheet references a remote script or stylesheet.

4. Screenshots and a JSON report ``site-check.json`` go to ``--artifacts`` (default
   ``$MLA_FP8_BENCH_ARTIFACTS``, else a new temporary folder; never the repository).

Exit status: 0 all checks passed, 1 a check failed, 77 chromium or the local asset copies are missing
(the test skips then, with the reason).

Usage::

    python scripts/check_site.py [--synthetic] [--keep] [--artifacts DIR] [--chromium PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mla_fp8_bench.report.publish import (  # noqa: E402 - the repository's package, not an installed one
    PublishError,
    asset_problems,
    assets_dir,
    missing_assets_message,
    publish_site,
    remote_references,
)

CHROMIUM = "/usr/bin/chromium"
EXIT_NO_CHROMIUM = 77
BENCH_MODULE = "bench_mla_prefill"
CLASSES = ("MLAPrefill", "AiterPlan")
GRAPH_BENCHMARKS = {
    "latency": f"{BENCH_MODULE}.MLAPrefill.track_latency",
    "max-abs-error": f"{BENCH_MODULE}.MLAPrefill.track_max_abs_error",
}
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--mute-audio")
#: The network, blocked: no host name but 127.0.0.1 resolves, and every proxied request goes to a
#: closed port (chromium never proxies loopback addresses).
NETWORK_BLOCK_FLAGS = ("--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
                       "--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=127.0.0.1")


class SiteCheckError(RuntimeError):
    """A step failed (publish, server, chromium); the message says which and why."""


# ------------------------------------------------------------------------------------- asv config
def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def has_results(results_dir: Path) -> bool:
    """True when ``results_dir`` has at least one machine directory with a result file."""
    from mla_fp8_bench.harness.results import list_result_files, machine_dirs

    return results_dir.is_dir() and any(list_result_files(m) for m in machine_dirs(results_dir))


# ------------------------------------------------------------------------------------- synthetic fixture
def make_synthetic_results(dest: Path, branch: str = "main") -> dict[str, Any]:
    """Write an asv 0.6 results tree into ``dest``: machine ``synthetic-cpu``, the branch's last two
    commits, ``MLAPrefill`` latency/accuracy tracks and ``AiterPlan`` planner time, values for
    aiter-emulated / torch-sdpa-bf16 / torch-fp8-ref on s128..s2048 and NaN (skipped) elsewhere."""
    from mla_fp8_bench.harness.asv_support import ASV_CASES, asv_backends, plan_backends

    ASV_BACKENDS, PLAN_BACKENDS = asv_backends(), plan_backends()  # noqa: N806
    commits = _git("rev-list", "--max-count=2", branch).split()
    machine = {"arch": "x86_64", "cpu": "synthetic 2-core", "gpu": "none", "machine": "synthetic-cpu",
               "num_cpu": "2", "os": "Linux", "ram": "24GB", "version": 1}
    (dest / "synthetic-cpu").mkdir(parents=True, exist_ok=True)
    (dest / "synthetic-cpu" / "machine.json").write_text(json.dumps(machine, indent=4))
    measured = {"aiter-emulated": 3.0e-6, "torch-sdpa-bf16": 9.0e-7, "torch-fp8-ref": 6.0e-7}
    err = {"aiter-emulated": 0.05, "torch-sdpa-bf16": 0.18, "torch-fp8-ref": 0.0075}
    cases = [c for c in ASV_CASES if re.fullmatch(r"s\d+", c)]

    def seq(c: str) -> int:
        return int(c[1:]) if re.fullmatch(r"s\d+", c) else 0

    def grid(backends, fn):
        return [fn(b, c) if (b in measured and c in cases and seq(c) <= 2048) else float("nan")
                for b in backends for c in ASV_CASES]

    benches = {
        "MLAPrefill.track_latency": (ASV_BACKENDS, "seconds", lambda b, c: measured[b] * seq(c) ** 1.6),
        "MLAPrefill.track_max_abs_error": (ASV_BACKENDS, "max_abs_err",
                                           lambda b, c: err[b] * (1 + 0.1 * math.log2(seq(c) / 128))),
        "MLAPrefill.track_max_abs_error_bf16_ref": (ASV_BACKENDS, "max_abs_err", lambda b, c: 0.17),
        "AiterPlan.track_planner_time": (PLAN_BACKENDS, "seconds", lambda b, c: 4e-4 + 1e-7 * seq(c)),
    }
    bench_json: dict[str, Any] = {"version": 2}
    for short, (backends, unit, _fn) in benches.items():
        name = f"{BENCH_MODULE}.{short}"
        bench_json[name] = {
            "code": f"# synthetic fixture for {name}", "name": name, "param_names": ["backend", "case"],
            "params": [[repr(b) for b in backends], [repr(c) for c in ASV_CASES]], "timeout": 3600,
            "type": "track", "unit": unit, "version": "synthetic-v1",
        }
    (dest / "benchmarks.json").write_text(json.dumps(bench_json, indent=4))
    cols = ["result", "params", "version", "started_at", "duration"]
    for i, sha in enumerate(reversed(commits)):
        results = {}
        for short, (backends, _unit, fn) in benches.items():
            drift = 1.0 + 0.05 * i
            vals = [v * drift if not math.isnan(v) else v for v in grid(backends, fn)]
            results[f"{BENCH_MODULE}.{short}"] = [vals, [[repr(b) for b in backends], [repr(c) for c in ASV_CASES]],
                                                  "synthetic-v1", 1_700_000_000_000 + i, 1.0]
        data = {"commit_hash": sha, "env_name": "existing-py_synthetic", "date": int(_git("log", "-1", "--format=%ct",
                                                                                          sha)) * 1000,
                "params": {"arch": "x86_64", "cpu": "synthetic 2-core", "gpu": "none", "machine": "synthetic-cpu",
                           "num_cpu": "2", "os": "Linux", "ram": "24GB", "python": "3.11"},
                "python": "3.11", "requirements": {}, "env_vars": {}, "result_columns": cols, "results": results,
                "durations": {}, "version": 2}
        (dest / "synthetic-cpu" / f"{sha[:8]}-existing-py_synthetic.json").write_text(json.dumps(data))
    return {"machine": "synthetic-cpu", "commits": commits}


# ------------------------------------------------------------------------------------- serve
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(directory: Path):
    """Serve ``directory`` with ``python -m http.server`` on 127.0.0.1; yields the base URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                             "--directory", str(directory)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 15
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
                conn.request("GET", "/index.html")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline or proc.poll() is not None:
                raise SiteCheckError(f"http.server on port {port} did not come up")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()


# ------------------------------------------------------------------------------------- chromium
def chromium(args: list[str], exe: str, profile: Path, timeout: float = 90) -> subprocess.CompletedProcess:
    """Run headless chromium with the workplace's flags and a fresh profile directory."""
    cmd = [exe, *CHROMIUM_FLAGS, *NETWORK_BLOCK_FLAGS, f"--user-data-dir={profile}", *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise SiteCheckError(f"chromium timed out after {timeout}s: {' '.join(cmd[-3:])}") from exc


def dump_dom(url: str, exe: str, profile: Path, budget_ms: int = 15000) -> str:
    p = chromium([f"--virtual-time-budget={budget_ms}", "--dump-dom", url], exe, profile)
    if p.returncode != 0 or "<html" not in p.stdout:
        raise SiteCheckError(f"chromium --dump-dom {url} failed (exit {p.returncode}): {p.stderr[-600:]}")
    return p.stdout


def screenshot(url: str, out: Path, exe: str, profile: Path, size: str = "1400,900", budget_ms: int = 15000) -> None:
    p = chromium([f"--virtual-time-budget={budget_ms}", f"--window-size={size}", f"--screenshot={out}", url],
                 exe, profile)
    if not out.is_file():
        raise SiteCheckError(f"chromium --screenshot {url} wrote nothing (exit {p.returncode}): {p.stderr[-600:]}")


def coloured_pixels(png: Path, box: tuple[float, float, float, float] = (0.16, 0.12, 0.98, 0.9)) -> int:
    """Strongly coloured (saturated, not grey/black/white) pixels inside ``box`` (fractions of the
    image: left, top, right, bottom) - flot's series colours; the asv chrome is grey and blue-grey."""
    import matplotlib.image as mpimg

    img = mpimg.imread(str(png))[..., :3]
    h, w = img.shape[:2]
    x0, y0, x1, y1 = int(box[0] * w), int(box[1] * h), int(box[2] * w), int(box[3] * h)
    crop = img[y0:y1, x0:x1]
    sat = crop.max(axis=-1) - crop.min(axis=-1)
    return int((sat > 0.35).sum())


def graph_url(base: str, bench: str, params: dict[str, str] | None = None) -> str:
    q = "&".join(f"{k}={v}" for k, v in (params or {}).items())
    return f"{base}/index.html#{bench}" + (f"?{q}" if q else "")


def graph_files(html: Path, bench: str) -> list[Path]:
    return sorted(html.glob(f"graphs/**/{bench}.json"))


def graph_points(path: Path) -> tuple[int, int]:
    """(finite values, all values) in one asv graph data file: ``[[date_or_rev, value|[values]|null], ...]``."""
    data = json.loads(path.read_text())
    fin = tot = 0
    for row in data:
        vals = row[1] if isinstance(row, list) and len(row) > 1 else None
        for v in (vals if isinstance(vals, list) else [vals]):
            tot += 1
            fin += isinstance(v, (int, float)) and math.isfinite(v)
    return fin, tot


# ------------------------------------------------------------------------------------- the check
def page_checks(base: str, html: Path, artifacts: Path, exe: str, profile: Path) -> dict[str, Any]:
    """The browser checks (see the module docstring) against the site served at ``base``."""
    checks: dict[str, Any] = {}
    dom = dump_dom(f"{base}/index.html#/summarylist", exe, profile)
    found = {c: (c in dom) for c in CLASSES}
    checks["benchmark list names our classes"] = {
        "ok": all(found.values()), "found": found,
        "tracks_listed": sorted(set(re.findall(r"(?:MLAPrefill|AiterPlan)\.track_\w+", dom)))}
    for key, bench in GRAPH_BENCHMARKS.items():
        url = graph_url(base, bench)
        dom = dump_dom(url, exe, profile)
        shot = artifacts / f"site-{key}.png"
        screenshot(url, shot, exe, profile)
        px = coloured_pixels(shot)
        c = {
            "flot canvas": "flot-base" in dom or "<canvas" in dom,
            "axis tick labels": "flot-tick-label" in dom or "tickLabel" in dom,
            "no 'No data' message": "No data for this combination" not in dom,
            "no error banner": "Error loading" not in dom and "failed to load" not in dom.lower()
                               and "continental origin of swallow" not in dom,
            "series pixels in plot": px > 200,
        }
        ticks = re.findall(r'class="flot-tick-label[^"]*"[^>]*>([^<]*)<', dom)
        checks[f"graph page {key}"] = {"ok": all(c.values()), **c, "coloured_pixels": px, "tick_labels": ticks[:20],
                                       "url": url, "screenshot": str(shot)}
    return checks


def data_checks(html: Path) -> dict[str, Any]:
    """The graph data files asv wrote hold finite values; no remote script/stylesheet is referenced."""
    checks: dict[str, Any] = {}
    for key, bench in GRAPH_BENCHMARKS.items():
        files = graph_files(html, bench)
        pts = [graph_points(f) for f in files]
        fin = sum(p[0] for p in pts)
        checks[f"graph data {key}"] = {"ok": bool(files) and fin > 0, "files": len(files), "finite_values": fin,
                                       "values": sum(p[1] for p in pts)}
    remote = remote_references(html)
    checks["no remote script or stylesheet"] = {"ok": not remote, "remote": remote[:10]}
    return checks


def run_check(*, synthetic: bool = False, artifacts: Path | None = None, exe: str = CHROMIUM,
              keep: bool = False, assets: Path | None = None) -> dict[str, Any]:
    """Publish, serve and inspect the site; returns the report (``report["ok"]``: True/False, or None
    with ``report["skipped"]`` when chromium or the local asset copies are missing)."""
    if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
        return {"ok": None, "skipped": f"chromium not found at {exe} (apt-get install -y chromium)"}
    cache = assets or assets_dir()
    problems = asset_problems(cache)
    if problems:
        return {"ok": None, "skipped": missing_assets_message(cache, problems)}
    work = Path(tempfile.mkdtemp(prefix="mla-site-"))
    artifacts = Path(artifacts or os.environ.get("MLA_FP8_BENCH_ARTIFACTS") or work / "artifacts")
    artifacts.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"checks": {}, "work_dir": str(work), "artifacts": str(artifacts)}
    try:
        results = ROOT / "results"
        if synthetic or not has_results(results):
            results = work / "results"
            report["fixture"] = make_synthetic_results(results)
            report["source"] = ("synthetic results fixture"
                                + ("" if synthetic else " (the repository's results/ is empty)"))
        else:
            report["source"] = f"repository results ({results})"
        html = work / "html"
        pub = publish_site(ROOT / "asv.conf.json", html_dir=html, results_dir=results, assets=cache)
        report["publish"] = {"wall_s": pub.wall_s, "asv_wall_s": pub.asv_wall_s}
        report["vendored"] = pub.vendored
        report["checks"].update(data_checks(html))
        with serve(html) as base:
            report["url"] = base
            report["checks"].update(page_checks(base, html, artifacts, exe, work / "chromium-profile"))
        report["ok"] = all(v["ok"] for v in report["checks"].values())
    finally:
        (artifacts / "site-check.json").write_text(json.dumps(report, indent=1, default=str))
        if not keep:
            shutil.rmtree(work / "html", ignore_errors=True)
            shutil.rmtree(work / "chromium-profile", ignore_errors=True)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--synthetic", action="store_true",
                    help="use the synthetic results fixture even if results/ has data")
    ap.add_argument("--artifacts", type=Path, default=None,
                    help="screenshot directory (default $MLA_FP8_BENCH_ARTIFACTS, else a new temporary folder)")
    ap.add_argument("--chromium", default=CHROMIUM, help="chromium executable (default /usr/bin/chromium)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary html directory")
    ap.add_argument("--assets", type=Path, default=None, help="site asset cache (default: publish's)")
    args = ap.parse_args(argv)
    try:
        rep = run_check(synthetic=args.synthetic, artifacts=args.artifacts, exe=args.chromium, keep=args.keep,
                        assets=args.assets)
    except (SiteCheckError, PublishError, subprocess.SubprocessError, OSError) as exc:
        print(f"site check error: {exc}", file=sys.stderr)
        return 1
    if rep.get("ok") is None:
        print(f"site check skipped: {rep['skipped']}")
        return EXIT_NO_CHROMIUM
    for name, c in rep["checks"].items():
        print(f"{'PASS' if c['ok'] else 'FAIL'}  {name}: " + ", ".join(f"{k}={v}" for k, v in c.items()
                                                                     if k not in ("ok", "url", "tick_labels")))
    print(f"source: {rep['source']}; publish {rep['publish']['wall_s']} s")
    for v in rep.get("vendored", []):
        print(f"local copy {v['local']} for {v['url']}: integrity {v['integrity']}")
    print(f"artifacts: {rep['artifacts']}")
    return 0 if rep["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
