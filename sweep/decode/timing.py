"""The one synchronised timer every measurement uses (engine, batches, self-speculation, cost model).

A GPU runs kernels asynchronously: the wall clock around a forward measures only the launch
unless the device has finished its queued work when the clock starts and when it stops. The
timer synchronises CUDA at both ends (nothing to wait for elsewhere) and reads
``time.perf_counter``. It is a plain class, not a generator, so what it adds inside the timed
interval is one method call; one timer can be reused for many samples.
"""

from __future__ import annotations

import time

import torch


class Timer:
    """``with timer: ...`` leaves the block's synchronised wall time in ``timer.seconds``."""

    __slots__ = ("_cuda", "_t0", "seconds")

    def __init__(self, device: torch.device | str) -> None:
        device = torch.device(device)
        self._cuda = device if device.type == "cuda" else None
        self._t0 = 0.0
        self.seconds = 0.0

    def __enter__(self) -> Timer:
        if self._cuda is not None:
            torch.cuda.synchronize(self._cuda)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type, _exc, _tb) -> None:
        if exc_type is None:  # a block that raised has no time (and a failed device nothing to wait for)
            if self._cuda is not None:
                torch.cuda.synchronize(self._cuda)
            self.seconds = time.perf_counter() - self._t0
