"""Input placements (CPU): the relocated copy of a case's inputs, the placement figure, and how many extra
placements are prepared under a memory budget."""

from __future__ import annotations

import dataclasses
import statistics

import pytest
import torch

from mla_fp8_bench.backends.base import Backend, Prepared, Verdict
from mla_fp8_bench.harness import placements as pl
from mla_fp8_bench.measure.timing import TimingResult, placement_figure
from mla_fp8_bench.problem.cases import parse_case_id
from mla_fp8_bench.problem.inputs import make_inputs, relocated


def _tensors(inp):
    for f in dataclasses.fields(inp):
        v = getattr(inp, f.name)
        if isinstance(v, torch.Tensor):
            yield f.name, v
        elif isinstance(getattr(v, "data", None), torch.Tensor):
            yield f.name + ".data", v.data
            yield f.name + ".descale", v.descale


@pytest.mark.parametrize("case_id", ["s64", "s64-mla", "ragged-33-17"])
def test_relocated_same_values_and_layout_new_storage(case_id):
    inp = make_inputs(parse_case_id(case_id))
    cp = relocated(inp)
    old, new = dict(_tensors(inp)), dict(_tensors(cp))
    assert old.keys() == new.keys() and len(old) >= 10
    for name, t in old.items():
        n = new[name]
        assert n.dtype == t.dtype and n.shape == t.shape and n.stride() == t.stride(), name
        assert torch.equal(n.view(torch.uint8) if n.dtype.itemsize == 1 else n, t.view(torch.uint8)
                           if t.dtype.itemsize == 1 else t), name
        assert n.untyped_storage().data_ptr() != t.untyped_storage().data_ptr(), name
    assert cp.case is inp.case and cp.softmax_scale == inp.softmax_scale and cp.causal == inp.causal


def test_relocated_mla_v_stays_a_strided_view():
    cp = relocated(make_inputs(parse_case_id("s64-mla")))
    assert cp.v.stride(-2) == 256 and not cp.v.is_contiguous()  # a view into a [T, H, 256] buffer, as vLLM passes it


def test_placement_figure_mean_of_medians():
    # placement 0: 1, 2, 9 (median 2); placement 1: 4, 6 (median 5)
    assert placement_figure([1.0, 4.0, 2.0, 6.0, 9.0], [0, 1, 0, 1, 0]) == pytest.approx(3.5)
    assert placement_figure([3.0, 1.0, 2.0]) == 2.0
    with pytest.raises(ValueError, match="2 placements for 3 values"):
        placement_figure([1.0, 2.0, 3.0], [0, 1])
    with pytest.raises(ValueError, match="no values"):
        placement_figure([])


def test_timing_result_latency_follows_placements():
    tr = TimingResult([10.0, 20.0, 11.0, 22.0], "graph", 1, 3, placements=[0, 1, 0, 1])
    assert tr.latency_s == pytest.approx((10.5 + 21.0) / 2) and tr.placement_count == 2
    assert tr.placement_medians_s == [10.5, 21.0]
    assert tr.median_s == statistics.median([10.0, 20.0, 11.0, 22.0])
    one = TimingResult([10.0, 20.0, 11.0], "graph", 1, 3)
    assert one.latency_s == 11.0 and one.placement_count == 1


class _Fake(Backend):
    name = "fake-placements"
    fail_at: int | None = None

    def __init__(self):
        self.prepared, self.cleaned = 0, []

    def availability(self, platform):
        return Verdict.yes()

    def prepare(self, inputs):
        if self.fail_at is not None and self.prepared == self.fail_at:
            raise RuntimeError("copy failed")
        self.prepared += 1
        i = self.prepared
        return Prepared(run=lambda: i, cleanup=lambda: self.cleaned.append(i))


@pytest.fixture
def on_fake_gpu(monkeypatch):
    """Inputs that say they are on a GPU; ``memory_allocated`` grows 30 bytes per prepared copy."""
    inp = dataclasses.replace(make_inputs(parse_case_id("s64")), device=torch.device("cuda", 0))
    state = {"bk": None, "spacers": 0}

    def spacer(dev, rng, held):  # a spacer of 1000 bytes, not counted against the copies' budget
        state["spacers"] += 1
        return torch.empty(1000, dtype=torch.uint8)

    monkeypatch.setattr(pl, "_spacer", spacer)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda dev=None: 30 * state["bk"].prepared
                        + 1000 * state["spacers"])
    return inp, state


def test_extra_placements_fill_the_budget(on_fake_gpu):
    inp, state = on_fake_gpu
    bk = state["bk"] = _Fake()
    with pl.extra_placements(bk, inp, 32, budget_bytes=100) as more:
        assert [r() for r in more] == [1, 2, 3]  # floor(100 / 30) copies fit
    assert bk.cleaned == [3, 2, 1] and state["spacers"] == 3  # one spacer before each copy


def test_extra_placements_count_caps_and_one_means_none(on_fake_gpu):
    inp, state = on_fake_gpu
    bk = state["bk"] = _Fake()
    with pl.extra_placements(bk, inp, 3, budget_bytes=10**9) as more:
        assert len(more) == 2
    with pl.extra_placements(bk, inp, 1, budget_bytes=10**9) as more:
        assert more == []


def test_extra_placements_copy_over_budget_is_dropped(on_fake_gpu):
    inp, state = on_fake_gpu
    bk = state["bk"] = _Fake()
    with pl.extra_placements(bk, inp, 32, budget_bytes=20) as more:
        assert more == []
    assert bk.cleaned == [1]


def test_extra_placements_failing_copy_keeps_what_was_built(on_fake_gpu):
    inp, state = on_fake_gpu
    bk = state["bk"] = _Fake()
    bk.fail_at = 2
    with pl.extra_placements(bk, inp, 32, budget_bytes=10**9) as more:
        assert [r() for r in more] == [1, 2]
    assert bk.cleaned == [2, 1]


def test_extra_placements_none_where_refused_or_on_cpu(on_fake_gpu):
    inp, state = on_fake_gpu
    bk = state["bk"] = _Fake()
    bk.placements = Verdict.no("holds global state")
    with pl.extra_placements(bk, inp, 32) as more:
        assert more == []
    bk2 = state["bk"] = _Fake()
    with pl.extra_placements(bk2, make_inputs(parse_case_id("s64")), 32) as more:
        assert more == [] and bk2.prepared == 0


def test_backends_that_refuse_placements_say_why():
    from mla_fp8_bench.backends import get_backend

    for name in ("vllm-aiter", "aiter-emulated", "cudnn-fp8"):
        v = get_backend(name).placements
        assert not v and len(v.reason) > 20, name
    for name in ("fa3-fp8", "fa3-bf16", "aiter", "torch-sdpa-bf16"):
        assert get_backend(name).placements, name


@pytest.mark.parametrize("raw", ["0", "257", "x", "\u0665", "-1", "1.5"])
def test_placements_knob_refused(raw):
    from mla_fp8_bench.config import RunConfig

    with pytest.raises(ValueError, match="MLA_FP8_BENCH_PLACEMENTS=.*an integer from 1 to 256"):
        RunConfig.from_env({"MLA_FP8_BENCH_PLACEMENTS": raw})


def test_placements_knob_read():
    from mla_fp8_bench.config import RunConfig

    assert RunConfig.from_env({"MLA_FP8_BENCH_PLACEMENTS": "8"}).placements == 8
    assert RunConfig.from_env({}).placements == 32


@pytest.mark.parametrize("bad", [0, 257, True, 2.0])
def test_run_options_refuse_bad_placements(bad):
    from mla_fp8_bench.harness.runner import RunOptions

    with pytest.raises(ValueError, match="placements=.* an integer from 1 to 256"):
        RunOptions(placements=bad)


def test_cli_run_refuses_bad_placements(capsys):
    from mla_fp8_bench.cli import main

    with pytest.raises(SystemExit) as e:
        main(["run", "-b", "torch-sdpa-bf16", "-c", "s64", "--placements", "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--placements" in err and "0" in err and len(err.strip().splitlines()) == 1


def test_spacer_respects_its_limits(monkeypatch):
    """A spacer is refused when the spacers held would pass SPACER_BYTES or a quarter of the free memory."""
    made = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (4 << 30, 8 << 30))
    monkeypatch.setattr(torch, "empty", lambda n, **kw: made.append(n) or n)

    class Rng:
        def randint(self, lo, hi):
            return 300  # MiB

    dev = torch.device("cuda", 0)
    assert pl._spacer(dev, Rng(), 0) == 300 << 20 and made == [300 << 20]
    assert pl._spacer(dev, Rng(), (1 << 30) - (300 << 20) + 1) is None  # a quarter of 4 GiB free is 1 GiB
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (1 << 40, 1 << 40))
    assert pl._spacer(dev, Rng(), pl.SPACER_BYTES - (300 << 20)) == 300 << 20
    assert pl._spacer(dev, Rng(), pl.SPACER_BYTES - (300 << 20) + 1) is None
