"""SGLang's overlap scheduling on the CPU: forwards that land late.

With overlap scheduling (SGLang's default) the scheduler launches batch N's
forward and prepares batch N+1 while it runs.  The forward translated its
write slots when it was launched and writes there when the GPU gets to it;
it reads the pages of its batch until then (docs/design.md §12).  On the
CPU nothing runs asynchronously, so ``Device`` plays the GPU:

- ``launch`` records a ``Forward``: the rows it will write (translated now),
  the bytes it will write there, and the rows it reads with the bytes they
  hold now.  Nothing is written yet.
- The forward *lands* (its writes happen) when its ``Event`` is waited on:
  ``event.synchronize()`` (the scheduler processing its result),
  ``event.wait()``, or the current stream's ``wait_event(event)`` (an
  allocator settling it); forwards land in launch order, as on one stream.
  ``wait_stream`` on the forward stream lands them all.
- When a forward lands, first its reads are checked (each read row still
  holds what it held at launch, for the readers the caller says are still
  live), then its writes land, then ``on_land`` runs (the caller checks the
  written tokens at their current translation).

``Device.current()`` makes the device's stream the current CPU stream
through torch's own stream API (``torch.cpu.stream``), the stream kvarena's
drop-in asks for (``torch.get_device_module(device).current_stream()``), so
it waits on it as it would on a GPU; ``torch.cuda`` is untouched.  SGLang's
own allocator asks ``torch.cuda`` even on CPU (``_settle_inflight_forward``,
docs/findings.md), so a run of it says so: ``current(sglang_allocator=True)``
answers ``torch.cuda.current_stream`` with the same stream.
"""

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from unittest import mock

import torch


@dataclass
class Read:
    """Rows of a buffer the forward reads, what they held at launch, and
    whether each reader still needs them (called when the forward lands;
    a bool mask over the rows)."""

    buffer: torch.Tensor
    rows: torch.Tensor
    held: torch.Tensor
    live: Callable[[], torch.Tensor]


@dataclass
class Forward:
    """One launched forward: its writes (``buffer[rows] = values`` when it
    lands) and its reads."""

    number: int
    writes: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    reads: list[Read]
    on_land: Callable[[], None] | None = None
    landed: bool = False
    event: "Event" = field(init=False)


class Event(torch.cpu.Event):
    """A forward's done event, with ``torch.cpu.Event``'s calls: ``query()``
    (has it landed), ``synchronize()`` and ``wait()`` (land it)."""

    def __init__(self, device: "Device", forward: Forward) -> None:
        self._device, self.forward = device, forward

    def query(self) -> bool:
        return self.forward.landed

    def synchronize(self) -> None:
        self._device.land(self.forward)

    def wait(self, stream=None) -> None:
        self._device.land(self.forward, waited=True)

    def record(self, stream=None) -> None:
        """Recorded at launch already."""


class Stream(torch.cpu.Stream):
    """The schedule stream as the allocators use it: a wait on a forward's
    event, or on the forward stream, lands the forwards it orders after."""

    def __init__(self, device: "Device") -> None:
        self._device = device

    def wait_event(self, event: Event) -> None:
        event._device.land(event.forward, waited=True)  # the event's own stream (a copy engine's, say)

    def wait_stream(self, stream) -> None:
        self._device.land_all(waited=True)

    def synchronize(self) -> None:
        self._device.land_all()


class Device:
    """The GPU's forward stream: forwards in launch order, landed late."""

    def __init__(self) -> None:
        self.in_flight: list[Forward] = []
        self.stream = Stream(self)
        self.forward_stream = Stream(self)  # what SGLang's eager ``free`` waits on
        self.launched = 0
        self.waits = 0  # forwards landed by an allocator's stream wait (settles that waited)
        self.rows_written = 0
        self.reads_checked = 0
        self.reads_corrupted = 0  # read rows overwritten before their forward landed

    def launch(
        self,
        writes: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
        reads: list[Read],
        on_land: Callable[[], None] | None = None,
    ) -> Event:
        """Record a forward (nothing is written); return its done event."""
        f = Forward(self.launched, writes, reads, on_land)
        f.event = Event(self, f)
        self.launched += 1
        self.in_flight.append(f)
        return f.event

    def land(self, forward: Forward, waited: bool = False) -> None:
        """Land every forward launched up to ``forward``, in order."""
        while self.in_flight and self.in_flight[0].number <= forward.number:
            f = self.in_flight.pop(0)
            self.waits += waited
            self._land(f)

    def land_all(self, waited: bool = False) -> None:
        if self.in_flight:
            self.land(self.in_flight[-1], waited)

    def _land(self, f: Forward) -> None:
        for r in f.reads:
            live = r.live()
            now = r.buffer[r.rows]
            bad = (now != r.held).reshape(len(r.rows), -1).any(dim=1) & live
            self.reads_checked += int(live.sum())
            self.reads_corrupted += int(bad.sum())
        for buf, rows, values in f.writes:
            buf[rows] = values
            self.rows_written += len(rows)
        f.landed = True
        if f.on_land is not None:
            f.on_land()

    @contextlib.contextmanager
    def current(self, sglang_allocator: bool = False):
        """While the block runs, ``torch.cpu.current_stream()`` is this
        device's stream; with ``sglang_allocator``, ``torch.cuda.current_stream()``
        too (SGLang's own allocator calls it on CPU)."""
        with torch.cpu.stream(self.stream):
            if not sglang_allocator:
                yield self
                return
            with mock.patch.object(torch.cuda, "current_stream", lambda device=None: self.stream):
                yield self
