"""Latency rounds (aggregation, orders), the gate's latency rule (fastest modes, the standard-error
threshold, the figure chosen by the clock) and the ab orchestration, on CPU with fake round runners.
Expected values are computed by hand."""

from __future__ import annotations

import math
import os
import sys

import pytest

from mla_fp8_bench.analysis import ab
from mla_fp8_bench.analysis import stats as S
from mla_fp8_bench.analysis.gate import judge as J
from mla_fp8_bench.analysis.gate import load as L
from mla_fp8_bench.harness import rounds as R
from mla_fp8_bench.harness.asv_tracks import track_value
from mla_fp8_bench.measure.metric_table import find
from mla_fp8_bench.terminal import fmt_seconds


# ------------------------------------------------------------------------------------------ rounds
def test_round_orders_alternate_and_shuffle_is_seeded():
    assert [R.round_order(i) for i in range(5)] == ["sorted", "reversed", "shuffled", "sorted", "reversed"]
    pairs = [("a", "s1024"), ("b", "s1024"), ("c", "s1024"), ("a", "s128"), ("b", "s128"), ("c", "s128")]
    # cases small to large whatever the given order; the order name permutes backends within a case
    assert R.ordered(pairs, "sorted") == [("a", "s128"), ("b", "s128"), ("c", "s128"),
                                          ("a", "s1024"), ("b", "s1024"), ("c", "s1024")]
    assert R.ordered(pairs, "reversed") == [("c", "s128"), ("b", "s128"), ("a", "s128"),
                                            ("c", "s1024"), ("b", "s1024"), ("a", "s1024")]
    sh = R.ordered(pairs, "shuffled", 3)
    assert sorted(sh) == sorted(pairs) and sh == R.ordered(pairs, "shuffled", 3)
    assert [c for _b, c in sh] == ["s128"] * 3 + ["s1024"] * 3
    with pytest.raises(ValueError, match="allowed sorted"):
        R.ordered(pairs, "random")
    with pytest.raises(ValueError):
        R.round_order(-1)


def test_cases_go_from_least_to_most_work():
    # s128: 128^2/2 pairs; ctx4096-q64: 64 x 4096 (not causal); ragged-1024x2: 2 x 1024^2/2; s2048: 2048^2/2
    cases = ["s2048", "ragged-1024x2", "s128", "ctx4096-q64"]
    work = {c: R.case_work(c) for c in cases}
    assert work["s128"] < work["ctx4096-q64"] < work["ragged-1024x2"] < work["s2048"]
    got = [c for _b, c in R.ordered([("x", c) for c in cases + ["no-such-case"]], "sorted")]
    assert got == ["s128", "ctx4096-q64", "ragged-1024x2", "s2048", "no-such-case"]


def test_spread_is_range_over_median():
    assert R.spread([10.0, 10.5, 9.5]) == pytest.approx(1.0 / 10.0)
    assert R.spread([4.0]) == 0.0
    with pytest.raises(ValueError):
        R.spread([])


def _row(b, c, lat, cyc=None, mhz=None):
    return {"backend": b, "case": c, "latency_s": lat, "latency_sm_cycles": cyc, "sm_clock_mhz": mhz}


def test_merge_rounds_takes_the_median_over_rounds_and_keeps_each_round():
    rec = {"backend": "fa3-fp8", "case": "s512", "status": "ok", "latency_s": 16.0e-6, "latency_sm_cycles": 31600.0,
           "sm_clock_mhz": 1965.0, "flops": 1.0e9, "bytes": 4.0e6}
    skipped = {"backend": "fa3-fp8", "case": "s128", "status": "skipped", "latency_s": None}
    docs = [{"order": "reversed", "rows": [_row("fa3-fp8", "s512", 15.3e-6, 30300.0, 1980.0)]},
            {"order": "shuffled", "rows": [_row("fa3-fp8", "s512", 16.4e-6, 32200.0, 1965.0),
                                           {"backend": "fa3-fp8", "case": "s128", "error": "x"}]}]
    R.merge_rounds([rec, skipped], docs)
    assert rec["latency_rounds_s"] == [16.0e-6, 15.3e-6, 16.4e-6]
    assert rec["latency_round_orders"] == ["sorted", "reversed", "shuffled"]
    assert rec["latency_s"] == 16.0e-6 and rec["latency_round0_s"] == 16.0e-6  # middle of 15.3, 16.0, 16.4
    assert rec["latency_sm_cycles_rounds"] == [31600.0, 30300.0, 32200.0] and rec["latency_sm_cycles"] == 31600.0
    assert rec["latency_round_spread"] == pytest.approx((16.4 - 15.3) / 16.0)
    assert rec["tflops"] == pytest.approx(1.0e9 / 16.0e-6 / 1e12)
    assert "latency_rounds_s" not in skipped


def test_records_from_rounds_alone():
    docs = [{"order": "sorted", "rows": [_row("x", "s1", 2.0), _row("x", "s2", 5.0)]},
            {"order": "reversed", "rows": [_row("x", "s2", 7.0), _row("x", "s1", 4.0)]},
            {"order": "shuffled", "rows": [_row("x", "s1", 3.0)]}]
    recs = {r["case"]: r for r in R.records_from_rounds(docs)}
    assert recs["s1"]["latency_rounds_s"] == [2.0, 4.0, 3.0] and recs["s1"]["latency_s"] == 3.0
    assert recs["s2"]["latency_rounds_s"] == [5.0, 7.0] and recs["s2"]["latency_s"] == 6.0


def test_asv_track_returns_rounds_as_samples_and_falls_back_to_samples():
    m = find("track_latency")
    assert track_value({"latency_s": 2.0, "latency_rounds_s": [1.0, 2.0, 4.0], "latency_samples_s": [9.0]}, m) == \
        {"samples": [1.0, 2.0, 4.0], "number": 1}
    assert track_value({"latency_s": 2.0, "latency_rounds_s": [2.0], "latency_samples_s": [1.9, 2.1]}, m) == \
        {"samples": [1.9, 2.1], "number": 1}


# ------------------------------------------------------------------------------------------ the latency rule
def _side(label, params, cpu=False):
    """A gate side from {(backend, case): (latency rounds, cycles rounds, sm clock)}."""
    s = L.Side(label, label, cpu=cpu)
    for (b, c), (lat, cyc, mhz) in params.items():
        s.params[(b, c)] = ("ok", "")
        s.data[(b, c, "latency_s")] = L.Value("ok", sorted(lat)[len(lat) // 2], tuple(lat))
        s.data[(b, c, "latency_sm_cycles")] = L.Value("ok", sorted(cyc)[len(cyc) // 2], tuple(cyc))
        s.data[(b, c, "sm_clock_mhz")] = L.Value("ok", mhz, (mhz,))
    return s


def _verdicts(base, head, **kw):
    return {(r.backend, r.case): r for r in J.compare(base, head, J.Options(**kw)) if r.metric == "latency_s"}


def test_the_gate_judges_cycles_off_the_clock_plateau_and_time_on_it():
    # s512 at the 1980 MHz plateau: +4 % time; s8192 power-capped (1725 MHz): time +4 % from a lower clock,
    # cycles unchanged
    base = _side("B", {("k", "s512"): ([15.3, 15.3, 15.31], [30294, 30294, 30314], 1980.0),
                       ("k", "s8192"): ([384.0, 384.2, 384.1], [662400, 662745, 662573], 1725.0)})
    head = _side("H", {("k", "s512"): ([15.91, 15.92, 15.92], [31502, 31522, 31522], 1980.0),
                       ("k", "s8192"): ([399.4, 399.6, 399.5], [662400, 662745, 662573], 1658.0)})
    v = _verdicts(base, head, factor=1.02, noise_k=1.0)
    ratio = (15.91 + 15.92 + 15.92) / (15.3 + 15.3 + 15.31)
    assert v[("k", "s512")].verdict == "REGRESSION" and v[("k", "s512")].ratio == f"{ratio:.3f}x"
    assert "gated on" not in v[("k", "s512")].detail
    assert v[("k", "s8192")].verdict == "ok" and "gated on SM cycles" in v[("k", "s8192")].detail
    assert v[("k", "s8192")].ratio == "1.000x" and v[("k", "s8192")].base == "6.626e+05 cycles"


def test_ab_judges_time_on_the_ratio_of_the_fastest_mode_means():
    # s8192 on the H200 reads one of two per-process modes, 384.3 or 389.0 us. A +3 % HEAD whose rounds fell
    # mostly in the low mode: medians 395.83 / 389.0 = 1.0176 would pass 1.02; means 397.04 / 387.825 = 1.0238.
    base = _side("B", {("k", "s8192"): ([389.0, 389.0, 389.0, 384.3], [671000] * 4, 1725.0),
                       ("k", "s512"): ([15.30, 15.29, 15.30, 15.30], [30300] * 4, 1980.0)})
    slow = _side("H", {("k", "s8192"): ([395.83, 395.83, 395.83, 400.67], [671000] * 4, 1725.0),
                       ("k", "s512"): ([15.29, 15.30, 15.30, 15.29], [30300] * 4, 1980.0)})
    r = _verdicts(base, slow, factor=1.02, noise_k=1.0, interleaved=True)
    assert r[("k", "s8192")].verdict == "REGRESSION" and r[("k", "s8192")].ratio == f"{397.04 / 387.825:.3f}x"
    assert (r[("k", "s8192")].base, r[("k", "s8192")].head) == (fmt_seconds(387.825) + " (4)",
                                                                fmt_seconds(397.04) + " (4)")
    assert r[("k", "s512")].verdict == "ok"
    # the same values as two separate runs: cycles off the plateau (unchanged: ok)
    r = _verdicts(base, slow, factor=1.02, noise_k=1.0)
    assert r[("k", "s8192")].verdict == "ok" and "gated on SM cycles" in r[("k", "s8192")].detail
    # A/A with the modes split unevenly: means 386.65 / 387.825 = 1.0030 -> ok
    aa = _side("H", {("k", "s8192"): ([389.0, 389.0, 389.0, 384.3], [671000] * 4, 1725.0)})
    b2 = _side("B", {("k", "s8192"): ([384.3, 389.0, 384.3, 389.0], [671000] * 4, 1725.0)})
    r = _verdicts(b2, aa, factor=1.02, noise_k=1.0, interleaved=True)[("k", "s8192")]
    assert r.verdict == "ok" and r.ratio == f"{387.825 / 386.65:.3f}x"


def test_the_ratio_drops_an_odd_round_and_the_threshold_follows_the_standard_error():
    # H200 s8192 rounds of one trial: BASE in two modes ~0.9 % apart; the +3 % HEAD has one odd process (441.8 us)
    base = [386.27, 389.89, 386.36, 389.90]
    head = [406.87, 403.72, 402.13, 441.80]
    # BASE: fastest 386.27, every round within 2 % (<= 393.9954): all kept, mean 388.105
    assert S.fastest_mode(base) == base
    # HEAD: fastest 402.13, cut-off 410.1726: 441.8 left out, mean(406.87, 403.72, 402.13) = 404.24
    assert S.fastest_mode(head) == [406.87, 403.72, 402.13]
    ratio, thr, se = S.latency_ratio(base, head, 1.02, 3.0)
    assert ratio == pytest.approx(404.24 / 388.105)
    # robust SDs of the kept rounds: BASE median 388.125, |dev| 1.855 1.765 1.765 1.775 -> MAD 1.77;
    # HEAD median 403.72, |dev| 3.15 0 1.59 -> MAD 1.59
    assert S.robust_sd(head[:3]) == pytest.approx(1.4826 * 1.59)
    want = ((1.4826 * 1.77 / 388.125) ** 2 / 4 + (1.4826 * 1.59 / 403.72) ** 2 / 3) ** 0.5
    assert se == pytest.approx(want) and thr == pytest.approx(max(1.02, 1 + 3 * want))
    # an A/A pair whose HEAD has one odd round: the ratio stays at 1
    aa_ratio = S.latency_ratio([15.27, 15.28, 15.27, 15.28], [15.28, 15.27, 16.04, 15.27], 1.02, 3.0)[0]
    assert aa_ratio == pytest.approx((15.28 + 15.27 + 15.27) / 3 / 15.275)
    # all rounds equal, or one value a side: the factor alone
    assert S.latency_ratio([2.0, 2.0], [2.0, 2.0], 1.02, 3.0)[:2] == (1.0, 1.02)
    assert S.latency_ratio([2.0], [3.0], 1.02, 3.0)[:2] == (1.5, 1.02)


def test_the_fastest_per_process_modes_are_compared():
    # H200 FA3-FP8 s512 (2026-12-02): each fresh process reads 15.16 or 16.21 us (+6.9 %), the +3 % HEAD
    # 15.59-15.60 or 16.65. A slowdown trial whose BASE had two high-mode rounds and HEAD none:
    # means of all rounds 15.5975 / 15.685 = 0.994 (missed); fastest modes 15.5975 / 15.16 = 1.0289
    ratio, thr, _se = S.latency_ratio([15.16, 16.21, 16.21, 15.16], [15.6, 15.6, 15.59, 15.6], 1.02, 3.0)
    assert ratio == pytest.approx(15.5975 / 15.16) and ratio > thr == pytest.approx(1.02)
    # an A/A trial with BASE three rounds high and HEAD one: all-round means 15.9475 / 15.4225 would read
    # 0.967; fastest modes 15.163333 / 15.16 = 1.0002
    ratio, thr, _se = S.latency_ratio([15.16, 16.21, 16.21, 16.21], [15.16, 15.16, 15.17, 16.21], 1.02, 3.0)
    assert ratio == pytest.approx(15.163333333 / 15.16) and ratio < thr


def test_rounds_that_are_no_latency_are_invalid_and_other_rows_are_judged():
    good = [1e-4, 1.001e-4, 0.999e-4]
    for bad in ([0.0, 0.0, 0.0], [math.inf, math.inf, 1e-4], [-1.0, 1e-4, 1e-4]):
        base = _side("B", {("k", "s128"): (good, [1] * 3, 1980.0), ("k", "s256"): (good, [1] * 3, 1980.0)})
        head = _side("H", {("k", "s128"): (bad, [1] * 3, 1980.0), ("k", "s256"): (good, [1] * 3, 1980.0)})
        v = _verdicts(base, head, factor=1.02, noise_k=3.0, interleaved=True)
        assert v[("k", "s128")].verdict == "INVALID" and "on HEAD (possible: (0, inf])" in v[("k", "s128")].detail
        assert v[("k", "s256")].verdict == "ok"


# ------------------------------------------------------------------------------------------ ab
def test_schedule_alternates_which_side_goes_first():
    assert ab.schedule(3) == [(0, "base"), (0, "head"), (1, "head"), (1, "base"), (2, "base"), (2, "head")]


class FakeRunner:
    """Round documents with a latency per side (s) and a per-round offset; records the calls."""

    def __init__(self, lat: dict[str, dict[str, float]], offsets=(0.0, 0.004, -0.003, 0.002, -0.001, 0.0)):
        self.lat, self.offsets, self.calls = lat, offsets, []

    def __call__(self, side, backends, cases, order, seed, out):
        i = len([c for c in self.calls if c[0] == side.label])
        self.calls.append((side.label, order, seed))
        rows = [{"backend": b, "case": c, "latency_s": self.lat[side.label][c] * (1 + self.offsets[i]),
                 "latency_sm_cycles": None, "sm_clock_mhz": None} for c in cases for b in backends]
        return {"order": order, "device": "fake GPU", "vendor": "cuda", "rows": rows}


def _sides(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "h").mkdir()
    return ab.parse_side(str(tmp_path / "b"), "BASE"), ab.parse_side(str(tmp_path / "h"), "HEAD")


def test_ab_catches_three_percent_and_passes_aa_with_fake_rounds(tmp_path):
    base, head = _sides(tmp_path)
    for lat_head, expect in ((1.03, "REGRESSION"), (1.0, "ok")):
        runner = FakeRunner({"BASE": {"s512": 15.3e-6, "s8192": 384e-6},
                             "HEAD": {"s512": 15.3e-6 * lat_head, "s8192": 384e-6 * lat_head}})
        m = ab.measure_ab(base, head, ["fa3-fp8"], ["s512", "s8192"], 4, runner)
        assert [c[0] for c in runner.calls] == ["BASE", "HEAD", "HEAD", "BASE", "BASE", "HEAD", "HEAD", "BASE"]
        assert [c[1] for c in runner.calls] == ["sorted", "sorted", "reversed", "reversed", "shuffled", "shuffled",
                                                "sorted", "sorted"]
        docs, rows = ab.judge(m)
        rec = {r["case"]: r for r in docs["head"]["records"]}["s512"]
        assert len(rec["latency_rounds_s"]) == 4
        # median of 4 rounds with offsets 0, +0.4 %, -0.3 %, +0.2 %: mean of the middle two (0 and +0.2 %)
        assert rec["latency_s"] == pytest.approx(15.3e-6 * lat_head * 1.001)
        lat = {r.case: r.verdict for r in rows if r.metric == "latency_s"}
        assert lat == {"s512": expect, "s8192": expect}


def test_ab_where_nothing_can_be_judged_fails_and_says_so(tmp_path, monkeypatch, capsys):
    """On a CPU every round is host time: informational, so nothing is judged, and ab fails saying so."""
    from mla_fp8_bench.cli import main

    class CpuRounds(FakeRunner):
        def __init__(self, *a, **k):
            super().__init__({"BASE": {"s64": 1e-3}, "HEAD": {"s64": 1e-3}})

        def __call__(self, *a):
            return {**super().__call__(*a), "device": "cpu", "vendor": "cpu"}

        def close(self):
            pass

    monkeypatch.setattr(ab, "ServerRunner", CpuRounds)
    monkeypatch.setattr(ab, "probe_side", lambda *a, **k: None)
    for d in ("b", "h"):
        (tmp_path / d).mkdir()
    rc = main(["ab", str(tmp_path / "b"), str(tmp_path / "h"), "-b", "torch-sdpa-bf16", "-c", "s64", "--device",
               "cpu", "--rounds", "2", "--summary", str(tmp_path / "ab.md")])
    out = capsys.readouterr().out
    assert rc == 1 and "AB PASSED" not in out
    assert "AB FAILED: nothing judged: no value of HEAD could be judged" in out.splitlines()[-1]
    assert "**AB FAILED: nothing judged" in (tmp_path / "ab.md").read_text()


def test_ab_side_spec_errors(tmp_path):
    with pytest.raises(ab.AbUsageError, match="does not exist or is no file: give a Python interpreter"):
        ab.parse_side(str(tmp_path / "missing"), "BASE")
    exe = ab.parse_side(sys.executable, "HEAD")
    assert exe.python == sys.executable and exe.prepend == ()
    env = ab.RD.suite_env(ab.parse_side(str(tmp_path), "BASE").prepend, {"PYTHONPATH": "/x"})
    parts = env["PYTHONPATH"].split(os.pathsep)
    assert parts[0] == str(tmp_path) and parts[-1] == "/x"


def test_ab_cli_refuses_bad_input_before_work(tmp_path, capsys):
    from mla_fp8_bench.cli import main

    (tmp_path / "b").mkdir()
    (tmp_path / "h").mkdir()
    assert main(["ab", str(tmp_path / "b"), str(tmp_path / "nope")]) == 2
    assert "does not exist or is no file: give a Python interpreter" in capsys.readouterr().out
    assert main(["ab", str(tmp_path / "b"), str(tmp_path / "h"), "--rounds", "1"]) == 2
    assert "--rounds 1 is invalid" in capsys.readouterr().out
    assert main(["ab", str(tmp_path / "b"), str(tmp_path / "h"), "-b", "nosuch"]) == 2
    assert "--backends 'nosuch': unknown nosuch; allowed" in capsys.readouterr().out


def test_ci_templates_run_ab_in_the_pr_job_with_existing_options():
    import re
    from pathlib import Path

    import yaml

    from mla_fp8_bench.cli import build_parser

    root = Path(__file__).resolve().parents[1]
    gh = yaml.safe_load((root / ".github" / "workflows" / "mla-fp8-bench-gfx950.yml").read_text())
    steps = [st for st in gh["jobs"]["measure"]["steps"] if "mla-fp8-bench ab \"" in st.get("run", "")]
    assert len(steps) == 1 and steps[0]["if"] == "github.event_name == 'pull_request'"
    bk = " ".join(yaml.safe_load((root / ".buildkite" / "mla-fp8-bench.yml").read_text())["steps"][0]["commands"])
    assert "BUILDKITE_PULL_REQUEST" in bk and "mla-fp8-bench ab" in bk
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    opts = {o for a in sub.choices["ab"]._actions for o in a.option_strings}
    flags = set()
    for text in (steps[0]["run"], bk):
        text = re.sub(r"\$\$?\([^)]*\)", "X", text)  # command substitutions are not ab's options
        for m in re.finditer(r"mla-fp8-bench ab((?:[^\n]*\\\n)*[^\n]*)", text):
            flags |= set(re.findall(r" (--?[a-z][a-z-]*)", m.group(1)))
    assert flags and flags <= opts, flags - opts


def test_round_server_forks_a_child_per_round_on_cpu(tmp_path):
    """The forking round server (the one ab uses) answers each request with a round from a new process."""
    srv = R.RoundServer(sys.executable, R.suite_env(), ["torch-sdpa-bf16"])
    try:
        docs = [srv.round(["torch-sdpa-bf16", "nosuch-backend"], ["s128"], order, i, str(tmp_path / f"r{i}.json"),
                          device="cpu") for i, order in enumerate(("sorted", "reversed"))]
    finally:
        srv.close()
    assert [d["order"] for d in docs] == ["sorted", "reversed"]
    assert docs[0]["pid"] != docs[1]["pid"] and docs[0]["pid"] != os.getpid()
    ok = [r for d in docs for r in d["rows"] if r["backend"] == "torch-sdpa-bf16"]
    assert len(ok) == 2 and all(r["latency_s"] > 0 for r in ok)
    bad = [r for d in docs for r in d["rows"] if r["backend"] == "nosuch-backend"]
    assert len(bad) == 2 and all("error" in r for r in bad)  # one failing pair never loses the others


def test_run_rounds_forks_each_round_from_one_server_in_alternating_order():
    logs: list[str] = []
    docs = R.run_rounds(["torch-sdpa-bf16"], ["s128", "s64"], 2, device="cpu", log=logs.append)
    assert [(d["round"], d["order"]) for d in docs] == [(1, "reversed"), (2, "shuffled")]
    assert docs[0]["pid"] != docs[1]["pid"]
    assert [r["case"] for r in docs[0]["rows"]] == ["s64", "s128"]  # least work first
    for d in docs:  # where a round's wall time goes: setup, then per pair inputs / prepare / timing
        phases = [r["phases_s"] for r in d["rows"]]
        assert all(set(ph) == {"inputs", "prepare", "timing"} and min(ph.values()) >= 0 for ph in phases)
        assert 0 <= d["setup_s"] and d["setup_s"] + sum(sum(ph.values()) for ph in phases) <= d["wall_s"]
    assert all(r["latency_s"] > 0 for d in docs for r in d["rows"])
    assert len(logs) == 2 and logs[0].startswith("round 1 (reversed): 2/2 pairs in ")
    assert R.run_rounds(["torch-sdpa-bf16"], ["s64"], 0) == []


def test_a_round_past_its_timeout_ends_with_an_error_and_the_next_round_says_so(tmp_path):
    srv = R.RoundServer(sys.executable, R.suite_env(), [])
    try:
        doc = srv.round(["torch-sdpa-bf16"], ["s4096"], "sorted", 0, str(tmp_path / "r.json"), device="cpu",
                        timeout=0.01)
        assert doc == {"error": "round timed out after 0 s", "rows": []}
        assert srv.proc.poll() is not None
        nxt = srv.round(["torch-sdpa-bf16"], ["s64"], "sorted", 0, str(tmp_path / "r2.json"), device="cpu")
        assert nxt["rows"] == [] and "round server is gone" in nxt["error"]
    finally:
        srv.close()


def test_run_rounds_starts_a_new_server_after_a_round_timed_out():
    docs = R.run_rounds(["torch-sdpa-bf16"], ["s4096"], 2, device="cpu", timeout=0.01)
    # each round timed out on its own server: none reads "round server is gone"
    assert [d["error"] for d in docs] == ["round timed out after 0 s"] * 2



def test_run_rounds_flag_folds_latency_rounds_into_the_run_json(tmp_path, capsys):
    import json

    from mla_fp8_bench.cli import main

    out = tmp_path / "r.json"
    argv = ["--device", "cpu", "run", "-b", "torch-sdpa-bf16", "-c", "s64", "--rounds", "3", "--json", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "round 1 (reversed): 1/1 pairs in " in printed and "round 2 (shuffled): 1/1 pairs in " in printed
    d = json.loads(out.read_text())
    rec = d["records"][0]
    assert rec["latency_round_orders"] == ["sorted", "reversed", "shuffled"] and len(rec["latency_rounds_s"]) == 3
    assert rec["latency_s"] == sorted(rec["latency_rounds_s"])[1]  # the median of three
    assert d["rounds"]["rounds"] == 3 and [x["round"] for x in d["rounds"]["extra"]] == [1, 2]


@pytest.mark.parametrize("bad", ["0", "101", "x"])
def test_run_rounds_flag_refuses_a_bad_count_before_work(bad, tmp_path, capsys):
    from mla_fp8_bench.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--device", "cpu", "run", "-b", "torch-sdpa-bf16", "-c", "s64", "--rounds", bad,
              "--json", str(tmp_path / "r.json")])
    assert e.value.code == 2 and "--rounds" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_a_backend_whose_availability_raises_fails_its_own_rows_only(monkeypatch):
    from mla_fp8_bench import backends
    from mla_fp8_bench.backends.torch_ref import TorchSdpaBf16

    class Broken(TorchSdpaBf16):
        name = "broken-availability"

        def availability(self, pinfo):
            raise OSError("driver query failed")

    monkeypatch.setitem(backends._REGISTRY, Broken.name, Broken)
    doc = R.measure_round(["broken-availability", "torch-sdpa-bf16"], ["s64"], device="cpu")
    rows = {r["backend"]: r for r in doc["rows"]}
    assert "OSError: driver query failed" in rows["broken-availability"]["error"]
    assert "error" not in rows["torch-sdpa-bf16"] and rows["torch-sdpa-bf16"]["latency_s"] > 0


def test_fold_rounds_leaves_an_emulation_record_out_by_its_emulation_field(monkeypatch):
    ran = []
    monkeypatch.setattr(R, "run_rounds", lambda b, c, n, **kw: ran.append((b, c, n)) or [])
    emu = {"backend": "aiter-emulated", "case": "s64", "status": "ok", "latency_s": 1e-3, "emulation": True,
           "timing_scope": "kernel"}
    assert R.fold_rounds([emu], 3, "cpu") == {"rounds": 1, "extra": []} and ran == []
    kern = {"backend": "torch-sdpa-bf16", "case": "s64", "status": "ok", "latency_s": 1e-5, "timing_scope": "kernel"}
    R.fold_rounds([emu, kern], 3, "cpu")
    assert ran == [(["torch-sdpa-bf16"], ["s64"], 2)]
