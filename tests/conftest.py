"""Fixtures shared by the test modules."""

from __future__ import annotations

import signal

import pytest


@pytest.fixture
def poison_inputs(monkeypatch):
    """``poison(case_id, value=nan)``: the bf16 inputs of ``case_id`` get ``q[0, 0, 0] = value`` (other
    cases are untouched); undone by ``monkeypatch`` at the end of the test."""
    import mla_fp8_bench.problem.inputs as inputs_mod

    orig = inputs_mod.make_bf16_qkv

    def poison(victim: str, value: float = float("nan")) -> None:
        def make(case, *a, **k):
            q, k_, v = orig(case, *a, **k)
            if case.id == victim:
                q = q.clone()
                q[0, 0, 0] = value
            return q, k_, v

        monkeypatch.setattr(inputs_mod, "make_bf16_qkv", make)

    return poison


@pytest.fixture
def no_block():
    """Fail, rather than hang, if the code under test blocks for 10 s (a FIFO opened for reading)."""
    def alarm(*_):
        raise TimeoutError("blocked for 10 s")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)
