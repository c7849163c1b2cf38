"""Clock readings and flags (mla_fp8_bench/measure/clocks.py) against a fake NVML module (CPU)."""

from __future__ import annotations

import sys
import types

import pytest

from mla_fp8_bench.measure import clocks


def _fake_nvml(sm=1755, reasons=0x4, app=1980, default_app=1980, fail_power=False):
    m = types.ModuleType("pynvml")
    m.NVML_CLOCK_SM, m.NVML_CLOCK_MEM, m.NVML_TEMPERATURE_GPU = 1, 2, 0
    m.nvmlInit = lambda: None
    m.nvmlDeviceGetHandleByIndex = lambda i: ("h", i)
    m.nvmlDeviceGetClockInfo = lambda h, kind: {1: sm, 2: 3201}[kind]
    m.nvmlDeviceGetTemperature = lambda h, kind: 61
    if fail_power:
        def power(h):
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        m.nvmlDeviceGetPowerUsage = power
    else:
        m.nvmlDeviceGetPowerUsage = lambda h: 683_500  # mW
    m.nvmlDeviceGetCurrentClocksEventReasons = lambda h: reasons
    m.nvmlDeviceGetApplicationsClock = lambda h, kind: app
    m.nvmlDeviceGetDefaultApplicationsClock = lambda h, kind: default_app
    m.nvmlDeviceGetMaxClockInfo = lambda h, kind: 1980
    m.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000
    return m


def test_reason_names_decodes_nvml_bits():
    assert clocks.reason_names(0) == []
    assert clocks.reason_names(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert clocks.reason_names(0x1000) == ["0x1000"]


def test_reader_reads_fake_nvml_in_physical_units(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml())
    r = clocks.open_reader(0, "cuda")
    assert r.available and r.backend == "nvml"
    full = r.read()
    assert (full.sm_mhz, full.mem_mhz, full.temp_c, full.power_w, full.reasons) == (1755, 3201, 61, 683.5, 0x4)
    assert not full.throttled  # the SW power cap is the sustained-load state, not throttling
    quick = r.read(full=False)
    assert quick.sm_mhz == 1755 and quick.power_w is None and quick.temp_c is None


def test_failing_query_is_recorded_not_raised(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(fail_power=True))
    r = clocks.open_reader(0, "cuda")
    assert r.read().power_w is None
    assert "NOT_SUPPORTED" in r._errors["power"]


def test_no_library_means_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    r = clocks.open_reader(0, None)
    assert not r.available and "nvml" in r.reason and "amdsmi" in r.reason
    assert r.read() == clocks.ClockReading()
    pol = r.policy()
    assert pol["available"] is False and pol["locked"] is None


@pytest.mark.parametrize("app, reasons, locked", [(1980, 0x4, False), (1590, 0x4, True), (1980, 0x2, True)])
def test_policy_detects_locked_clocks(monkeypatch, app, reasons, locked):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(app=app, reasons=reasons))
    pol = clocks.open_reader(0, "cuda").policy()
    assert pol["locked"] is locked
    assert pol["evidence"]["power_limit_w"] == 700.0 and pol["evidence"]["max_sm_mhz"] == 1980


def test_amd_policy_records_level_and_power_cap_and_never_asks_for_determinism(monkeypatch):
    m = types.ModuleType("amdsmi")
    m.amdsmi_init = lambda: None
    m.amdsmi_get_processor_handles = lambda: ["h0"]
    m.amdsmi_get_gpu_perf_level = lambda h: "AMDSMI_DEV_PERF_LEVEL_AUTO"
    m.amdsmi_get_power_cap_info = lambda h: {"power_cap": 1_400_000_000, "default_power_cap": 1_400_000_000,
                                             "min_power_cap": 0, "max_power_cap": 1_400_000_000, "dpm_cap": 2400}
    m.amdsmi_get_gpu_asic_info = lambda h: {"market_name": "AMD Instinct MI355X", "target_graphics_version": "gfx950"}
    monkeypatch.setitem(sys.modules, "amdsmi", m)
    pol = clocks.open_reader(0, "rocm").policy()
    ev = pol["evidence"]
    assert pol["locked"] is False and ev["perf_level"] == "AMDSMI_DEV_PERF_LEVEL_AUTO"
    assert ev["power_cap_w"] == 1400.0 and ev["min_power_cap_w"] == 0.0 and ev["target_graphics_version"] == "gfx950"
    assert "determinism" not in pol["recommendation"].replace("performance determinism is not supported", "")
    assert "never changes clocks" in pol["recommendation"]
    m.amdsmi_get_gpu_perf_level = lambda h: "AMDSMI_DEV_PERF_LEVEL_MANUAL"
    pol = clocks.open_reader(0, "rocm").policy()
    assert pol["locked"] is True and pol["recommendation"] == ""


def test_mark_samples_flags_throttled_and_off_plateau():
    rs = [clocks.ClockReading(sm_mhz=1755, reasons=0x4) for _ in range(6)]
    rs[2] = clocks.ClockReading(sm_mhz=1980, reasons=0x0)  # 12.8 % above the median clock
    rs[4] = clocks.ClockReading(sm_mhz=1740, reasons=0x4 | 0x20)  # 0.9 % below, but thermally slowed
    rs.append(None)
    m = clocks.mark_samples(rs)
    assert m["sm_mhz_median"] == 1755
    assert m["off_plateau"] == [2]
    assert m["throttled"] == [4]
    assert m["reasons"] == ["sw_power_cap", "sw_thermal_slowdown"]
    assert m["sm_mhz"][-1] is None


def test_plateau_rule():
    assert clocks.plateau_reached([]) is True  # no readings: callers fall back to time rules
    assert clocks.plateau_reached([1980, 1755]) is False
    assert clocks.plateau_reached([1980, 1770, 1755, 1755]) is True
    assert clocks.plateau_reached([1980, 1755, 1740, 1725]) is False  # 30 MHz > one 15 MHz step


def test_clock_fields_cycles_per_launch():
    """latency x SM clock per sample: 1 ms at 1500 MHz is 1.5e6 cycles; 2 ms at 1755 MHz 3.51e6; a sample
    without a reading is left out of the cycles."""
    from mla_fp8_bench.measure.timing import TimingResult, clock_fields

    marks = clocks.mark_samples([clocks.ClockReading(sm_mhz=1500), clocks.ClockReading(sm_mhz=1755), None])
    tr = TimingResult([1e-3, 2e-3, 5e-3], "graph", 1, 3, extra={"clocks": marks})
    f = clock_fields(tr)
    assert f["latency_sm_cycles_samples"] == pytest.approx([1.5e6, 3.51e6])
    assert f["latency_sm_cycles"] == pytest.approx((1.5e6 + 3.51e6) / 2)
    assert f["sm_clock_mhz"] == pytest.approx(1627.5)
    assert clock_fields(TimingResult([1e-3], "host", 1, 1)) == {}
