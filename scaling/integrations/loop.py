"""A trainer's loop seen through its callbacks: the requests for batches `meter.batches` would mark.

A hand-written loop runs `for batch in meter.batches(loader)`, and each request for a batch ends
the micro-batch before it (meter.py's step rule). A trainer owns its loop, so its callback calls
`Requests.request()` where the trainer is about to fetch the next micro-batch (after the previous
one's backward, or its optimizer step) and `Requests.end_training()` after the epoch's last one.
The meter then cuts steps and phases exactly as for a hand-written loop.

The meter counts a micro-batch's samples when it is requested, before the trainer has fetched
it, so it counts the trainer's per-device batch size; the callback counts the samples its
trainer actually trained and hands the epoch's total to `end_epoch` (a last, shorter batch).
"""

from __future__ import annotations

import torch


class Requests:
    """Drives `meter.batches` from a trainer's callbacks (module docstring)."""

    def __init__(self, meter, batch_size: int):
        self.meter = meter
        # what the meter counts a requested batch's samples from (its first dimension)
        self._placeholder = torch.empty(max(int(batch_size), 1), device="meta")
        self._batches = None  # the meter's generator over this epoch, while the epoch trains
        self._more = False

    @property
    def training(self) -> bool:
        """Whether an epoch's training is in progress (between its first request and its end)."""
        return self._batches is not None

    def _feed(self):
        while self._more:
            yield self._placeholder

    def request(self) -> None:
        """The trainer is about to fetch a micro-batch: the one before it ends here."""
        if self._batches is None:
            self._more = True
            self._batches = self.meter.batches(self._feed())
        next(self._batches)

    def end_training(self) -> None:
        """The epoch's last micro-batch has ended: its step is recorded and the epoch's training time stops."""
        if self._batches is None:
            return
        self._more = False
        next(self._batches, None)  # the feed runs dry: the meter closes the step and the epoch's training
        self._batches = None
