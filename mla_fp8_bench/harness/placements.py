"""Input placements: the case's inputs copied to other device addresses and prepared again, so that one
latency figure averages over where the inputs sit (docs/methodology.md §2, §15). On an H200 a small case
reads at one of two levels about 4% apart depending on where its inputs sit (§14.2); a figure from one
placement takes one level, so two processes can differ by that much.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from mla_fp8_bench.backends.base import Backend, Prepared
from mla_fp8_bench.config import PLACEMENT_BYTES
from mla_fp8_bench.problem.inputs import CaseInputs, relocated


@contextlib.contextmanager
def extra_placements(backend: Backend, inputs: CaseInputs, count: int,
                     budget_bytes: int = PLACEMENT_BYTES) -> Iterator[list[Callable[[], object]]]:
    """Up to ``count - 1`` more prepared calls of ``backend`` on :func:`relocated` copies of ``inputs``, as
    many as fit in ``budget_bytes`` of device memory (measured with ``torch.cuda.memory_allocated``);
    none on a CPU or for a backend whose :attr:`Backend.placements` says no. Running out of device memory,
    or any error preparing a copy, stops adding (what was built is used; the case's own call is timed as
    it would be alone). Every extra call's cleanup runs on exit, last first."""
    preps: list[tuple[Prepared, CaseInputs]] = []
    try:
        if count > 1 and inputs.device.type == "cuda" and backend.placements:
            dev = inputs.device
            start = torch.cuda.memory_allocated(dev)
            while len(preps) < count - 1:
                try:
                    copy = relocated(inputs)
                    preps.append((backend.prepare_case(copy), copy))
                except Exception:  # noqa: BLE001 - out of memory or a failing copy: time the placements built
                    break
                used = torch.cuda.memory_allocated(dev) - start
                if used * (len(preps) + 1) > budget_bytes * len(preps):  # the next one would not fit
                    if used > budget_bytes:
                        _cleanup(preps.pop()[0])
                    break
        yield [p.run for p, _copy in preps]
    finally:
        for p, _copy in reversed(preps):
            _cleanup(p)
        preps.clear()


def _cleanup(p: Prepared) -> None:
    if p.cleanup is not None:
        with contextlib.suppress(Exception):  # the case's own cleanup reports errors; copies restore the same state
            p.cleanup()
