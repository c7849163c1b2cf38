"""asv's Regressions page never lists a CPU machine's latency step (host time moved by load)."""

from __future__ import annotations

import json

from mla_fp8_bench.report.publish import drop_host_time_regressions

CPU = {"machine": "cpu-2core", "gpu": "none", "cpu": "2-core x86_64"}
GPU = {"machine": "h200", "gpu": "NVIDIA H200"}
LAT = "bench_mla_prefill.MLAPrefill.track_latency('torch-fp8-ref', 's256')"
ERR = "bench_mla_prefill.MLAPrefill.track_max_abs_error('aiter-emulated', 's256')"


def _row(name, facts):
    return [name, "graphs/x.json", facts, 86, 2.0, 1.0, [[10, 16, 1.0, 2.0]]]


def _entry(name):
    return (f"<entry><id>tag:x,2026:/{abs(hash(name + str(id(name))))}</id>"
            f"<title xml:lang=\"en\">50.00% {name}</title><content>x</content></entry>")


def test_cpu_latency_rows_are_dropped_and_the_rest_kept(tmp_path):
    rows = [_row(LAT, CPU), _row(LAT, GPU), _row(ERR, CPU)]
    (tmp_path / "regressions.json").write_text(json.dumps({"regressions": rows}))
    (tmp_path / "regressions.xml").write_text(
        "<?xml version='1.0' encoding='utf-8'?><feed xmlns=\"http://www.w3.org/2005/Atom\">"
        + "".join(_entry(r[0]) for r in rows) + "</feed>")
    assert drop_host_time_regressions(tmp_path) == 1
    kept = json.loads((tmp_path / "regressions.json").read_text())["regressions"]
    assert [(r[0], r[2]["machine"]) for r in kept] == [(LAT, "h200"), (ERR, "cpu-2core")]
    feed = (tmp_path / "regressions.xml").read_text()
    assert feed.count("<entry>") == 2
    assert ERR in feed and feed.count(LAT) == 1


def test_site_without_regressions_is_left_alone(tmp_path):
    assert drop_host_time_regressions(tmp_path) == 0
    assert list(tmp_path.iterdir()) == []
