"""SGLang's overlap scheduling on the CPU: forwards that land late.

With overlap scheduling (SGLang's default) the scheduler launches batch N's
forward and prepares batch N+1 while it runs (docs/design.md §12).  A real
CPU cannot show that: ``torch.cpu`` runs every op when it is issued, and a
``torch.cpu.Event`` is always done (``query()`` is True).  So ``Device`` is a
fault injector: it plays the GPU's forward stream, whose forwards land late.
Use it only where that timing is the point; elsewhere real
``torch.cpu``/``torch.cuda`` streams and events do.

What it keeps of SGLang 0.5.23 and a GPU:

- **Translation at launch, on the forward stream.**  SGLang builds a batch's
  ``ForwardBatch`` inside the forward stream's context, after
  ``forward_stream.wait_stream(schedule_stream)``: the iteration's
  ``KVLocPlan`` translates the write slots there (the allocator's
  ``translate_write_loc``, and ``translate_loc_from_full_to_swa`` for the
  window), the attention backend the state slots
  (``translate_mamba_indices``), before the model's kernels run.  Then, on
  CUDA, the scheduler's WAR barrier (``_apply_war_barrier``) orders its next
  work after the forward's shared reads, which the translation precedes
  (its coarse form, after the whole forward).  So on a GPU the forward has translated before the allocator's next call
  can move anything, and writes its K/V and state later, layer by layer.  ``launch(work)`` runs ``work``
  (the translation) at once, with the forward stream current; its writes
  land later at the rows it translated.  A page moved before the launch
  carries the write with it (the forward translates to the new rows); one
  moved after it and before the forward lands loses the write unless the
  move waits on the forward's event.  That window is what SGLang's hooks
  guard, and what the planted bugs in tests/sglang/test_overlap.py open.
  (Translated when it lands instead, the forward would write wherever its
  pages had moved, as if it ran after every move: that hides the lost
  writes, and no GPU runs it so under SGLang's barrier.)
- **Landing.**  A forward lands (its reads are checked, its writes happen,
  ``on_land`` runs) when something waits for it: ``event.synchronize()``
  (the scheduler processing its result), or the schedule stream's
  ``wait_event``/``wait_stream`` (an allocator's settle, an eager free).
  Forwards land in launch order, as on one stream.  On a GPU a stream wait
  blocks no host thread: it orders the stream's later work after the
  forward.  The CPU issues that work at once, so landing the forward at the
  wait is the one way to keep the order.  What this leaves out is the cost:
  after a real wait, a host read of the stream's later work stalls until
  the forward ends.  tests/sglang/test_host_sync.py catches those host
  reads; ``waits`` counts the landings a stream wait caused.
- **The forward stream** is in order already: its own waits order nothing
  here.  So an allocator that waits on the forward stream instead of the
  schedule stream (the current one) lands nothing, as on a GPU.
- **Event.query()** is False until the forward lands, as a CUDA event's is
  while its work runs.

``Device.current()`` makes the schedule stream the current CPU stream
through torch's own stream API (``torch.cpu.stream``), the stream kvarena's
drop-in asks for (``torch.get_device_module(device).current_stream()``);
``torch.cuda`` is untouched.  SGLang's own allocator asks ``torch.cuda`` even
on CPU (``_settle_inflight_forward``, docs/findings.md), so a run of it says
so: ``current(sglang_allocator=True)`` answers ``torch.cuda.current_stream``
with the same stream.
"""

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from unittest import mock

import torch

Write = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # buffer[rows] = values when the forward lands


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
    """One launched forward: its writes and its reads, as it translated
    them at launch."""

    number: int
    writes: list[Write]
    reads: list[Read]
    on_land: Callable[[], None] | None = None
    landed: bool = False
    event: "Event" = field(init=False)


class Event(torch.cpu.Event):
    """A forward's done event, with ``torch.cpu.Event``'s calls; unlike a CPU
    event (always done) it stays pending until the forward lands, as a GPU
    event does.  ``synchronize()`` and ``wait()`` land it."""

    def __init__(self, device: "Device", forward: Forward) -> None:
        self._device, self.forward = device, forward

    def query(self) -> bool:
        return self.forward.landed

    def synchronize(self) -> None:
        self._device.land(self.forward)

    def wait(self, stream=None) -> None:
        (stream or torch.cpu.current_stream()).wait_event(self)

    def record(self, stream=None) -> None:
        """Recorded at launch already."""


class Stream(torch.cpu.Stream):
    """One of the device's streams.  The schedule stream's waits land the
    forwards they order its later work after; the forward stream's order
    nothing (its forwards already run in order)."""

    def __init__(self, device: "Device", schedule: bool) -> None:
        self._device, self._schedule = device, schedule

    def wait_event(self, event: Event) -> None:
        if self._schedule:
            event._device.land(event.forward, waited=True)  # the event's own device (a copy engine's, say)

    def wait_stream(self, stream) -> None:
        if self._schedule and isinstance(stream, Stream) and stream is not self:
            stream._device.land_all(waited=True)

    def synchronize(self) -> None:
        """The host waits for the stream's work: the forward stream's is every
        forward; the schedule stream's waits have landed theirs already."""
        if not self._schedule:
            self._device.land_all()


class Device:
    """The GPU's forward stream, forwards in launch order, landed late, and
    the schedule stream that waits on them (the module docstring says what
    is faithful and what is injected)."""

    def __init__(self) -> None:
        self.in_flight: list[Forward] = []
        self.stream = Stream(self, schedule=True)  # the scheduler's (the current stream)
        self.forward_stream = Stream(self, schedule=False)  # what SGLang's eager ``free`` waits on
        self.launched = 0
        self.waits = 0  # forwards landed by a stream wait (settles that waited)
        self.rows_written = 0
        self.reads_checked = 0
        self.reads_corrupted = 0  # read rows overwritten before their forward landed

    def launch(
        self,
        work: Callable[[], tuple[list[Write], list[Read]]] | None = None,
        on_land: Callable[[], None] | None = None,
    ) -> Event:
        """Launch a forward: ``work`` runs now on the forward stream and
        returns its writes and reads, translated there (nothing is written
        yet); ``on_land`` runs when it lands.  Returns its done event."""
        writes: list[Write] = []
        reads: list[Read] = []
        if work is not None:
            with torch.cpu.stream(self.forward_stream):
                writes, reads = work()
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
        device's schedule stream; with ``sglang_allocator``,
        ``torch.cuda.current_stream()`` too (SGLang's own allocator calls it
        on CPU)."""
        with torch.cpu.stream(self.stream):
            if not sglang_allocator:
                yield self
                return
            with mock.patch.object(torch.cuda, "current_stream", lambda device=None: self.stream):
                yield self
