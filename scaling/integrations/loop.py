"""A trainer's loop seen through its callbacks: the requests for batches a hand-written loop's
`meter.batches` marks, made through the meter's push API.

A hand-written loop runs `for batch in meter.batches(loader)`, and each request for a batch ends
the micro-batch before it (meter.py's step rule). A trainer owns its loop, so its callback calls
`Requests.request()` where the trainer is about to fetch the next micro-batch (after the previous
one's backward, or its optimizer step) and `Requests.end_training()` after the epoch's last one;
they are `meter.request_batch()` with `meter.batch_arrived(samples=...)`, and `meter.end_batches()`.
The meter then cuts steps and phases exactly as for a hand-written loop.

The meter counts a micro-batch's samples when it is requested, before the trainer has fetched
it, so it counts the trainer's per-device batch size; the callback counts the samples its
trainer actually trained and hands the epoch's total to `end_epoch` (a last, shorter batch).
"""

from __future__ import annotations


class Requests:
    """A trainer's requests for batches, handed to the meter's push API (module docstring)."""

    def __init__(self, meter, batch_size: int):
        self.meter = meter
        self._batch_size = max(int(batch_size), 1)  # the samples the meter counts per requested batch
        self._training = False

    @property
    def training(self) -> bool:
        """Whether an epoch's training is in progress (between its first request and its end)."""
        return self._training

    def request(self) -> None:
        """The trainer is about to fetch a micro-batch: the one before it ends here."""
        self._training = True
        self.meter.request_batch()
        self.meter.batch_arrived(samples=self._batch_size)

    def end_training(self) -> None:
        """The epoch's last micro-batch has ended: its step is recorded and the epoch's training time stops."""
        if not self._training:
            return
        self._training = False
        self.meter.end_batches()
