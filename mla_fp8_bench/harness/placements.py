"""Input placements: the case's inputs copied to other device addresses and prepared again, so that one
latency figure averages over where the inputs sit (docs/methodology.md §2, §15). On an H200 a small case
reads at one of two levels about 4% apart depending on where its inputs sit (§14.2); a figure from one
placement takes one level, so two processes can differ by that much.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator

import torch

from mla_fp8_bench.backends.base import Backend, Prepared
from mla_fp8_bench.config import PLACEMENT_BYTES
from mla_fp8_bench.problem.inputs import CaseInputs, relocated

#: Sizes of the spacer allocated before each copy, MiB (drawn uniformly, a new draw in every process), and the
#: most device memory the spacers of one case may hold, bytes.
SPACER_MIB = (64, 512)
SPACER_BYTES = 12 << 30


def _spacer(dev: torch.device, rng: random.Random, held: int) -> torch.Tensor | None:
    """An allocation of :data:`SPACER_MIB` that pushes the next copy into its own allocation segment at a
    random distance, or None when it would exceed :data:`SPACER_BYTES` or a quarter of the free memory."""
    size = rng.randint(*SPACER_MIB) << 20
    free = torch.cuda.mem_get_info(dev)[0] if hasattr(torch.cuda, "mem_get_info") else 0
    if held + size > min(SPACER_BYTES, free // 4):
        return None
    return torch.empty(size, dtype=torch.uint8, device=dev)


@contextlib.contextmanager
def extra_placements(backend: Backend, inputs: CaseInputs, count: int,
                     budget_bytes: int = PLACEMENT_BYTES) -> Iterator[list[Callable[[], object]]]:
    """Up to ``count - 1`` more prepared calls of ``backend`` on :func:`relocated` copies of ``inputs``, each
    after a spacer allocation (:func:`_spacer`, held until exit), as many copies as fit in ``budget_bytes``
    of device memory (measured with ``torch.cuda.memory_allocated``, spacers not counted); none on a CPU
    or for a backend whose :attr:`Backend.placements` says no. Running out of device memory, or any error
    preparing a copy, stops adding (what was built is used; the case's own call is timed as it would be
    alone). Every extra call's cleanup runs on exit, last first; the spacers are freed then."""
    preps: list[tuple[Prepared, CaseInputs]] = []
    spacers: list[torch.Tensor] = []
    try:
        if count > 1 and inputs.device.type == "cuda" and backend.placements:
            dev, rng = inputs.device, random.Random()
            start, held = torch.cuda.memory_allocated(dev), 0
            while len(preps) < count - 1:
                try:
                    sp = _spacer(dev, rng, held)
                    if sp is not None:
                        spacers.append(sp)
                        held += sp.numel()
                    copy = relocated(inputs)
                    preps.append((backend.prepare_case(copy), copy))
                except Exception:  # noqa: BLE001 - out of memory or a failing copy: time the placements built
                    break
                used = torch.cuda.memory_allocated(dev) - start - held
                if used * (len(preps) + 1) > budget_bytes * len(preps):  # the next one would not fit
                    if used > budget_bytes:
                        _cleanup(preps.pop()[0])
                    break
        yield [p.run for p, _copy in preps]
    finally:
        for p, _copy in reversed(preps):
            _cleanup(p)
        preps.clear()
        spacers.clear()


def _cleanup(p: Prepared) -> None:
    if p.cleanup is not None:
        with contextlib.suppress(Exception):  # the case's own cleanup reports errors; copies restore the same state
            p.cleanup()
