"""SGLang's in-flight forwards (overlap scheduling, SGLang's default;
docs/design.md §12): ``InFlightForwards``, the mixin of ``_Dropin`` that
hands each forward to the composite and orders the drop-in's own work
after it.

The two hooks the scheduler calls after each launch
(``set_latest_forward_done_event``, ``set_inflight_forward``) keep
references, the next call hands the forward to the composite (its pages
pinned until it is settled), and a settle is the schedule stream's wait on
the forward's done event.
"""

from typing import Any

import torch

from .views import I64

_IDLE = object()  # set_latest_forward_done_event(None): no forward in flight (a report, see InFlightForwards)


class InFlightForwards:
    """SGLang's two hooks, the hand-over of what they reported
    (``_take_forward``, run by ``_Dropin._handed`` before every call), the
    settle's stream wait, and an eager free's wait on ``forward_stream``."""

    # Overlap scheduling (docs/design.md §12): SGLang's in-flight forward, as its two hooks left it.
    _forward_due: list[Any] | None = None  # (done event, out_cache_loc or None) or _IDLE, not yet handed over
    _flight_event: Any = None  # the done event of the last forward the composite was handed
    # The drop-in's, set by its _boot.
    _composite: Any
    forward_stream: Any
    _waits: dict[str, bool]

    def _current_stream(self) -> Any:
        """The stream this thread issues work on, for the pool's device:
        ``torch.cuda``'s on CUDA, ``torch.cpu``'s on CPU (where a wait is a
        no-op: CPU work runs in program order), never ``torch.cuda`` on a
        CPU tensor's path."""
        return torch.get_device_module(self._composite.device).current_stream()

    def _wait_forward(self, *pools: str) -> None:
        """Before a free of ``pools`` writes tables or moves pages: eager mode
        orders it after the in-flight forward, ``current_stream().wait_stream(
        forward_stream)``, as SGLang's ``free`` does for an END (a device-side
        wait, no host read).  Lazy frees and a float's free move nothing then."""
        if any(self._waits[n] for n in pools):
            self._current_stream().wait_stream(self.forward_stream)

    def set_latest_forward_done_event(self, event) -> None:
        """SGLang's hook, after every forward it launches: the event that
        fires when that forward is done.  Alone it hands over a forward that
        reads these pools (so what a move vacates waits for it) and writes
        none; ``set_inflight_forward`` adds what it writes.  ``None``: no
        forward in flight (the next call settles, and its wait is a no-op).
        A reference only: no device work, no host read."""
        self._report_forward(_IDLE if event is None else (event, None))

    def set_inflight_forward(self, forward_done, out_cache_loc_virtual: torch.Tensor | None) -> None:
        """SGLang's hook, after every forward it launches: its done event and
        the virtual token ids it writes (``out_cache_loc``); ``None`` ids: it
        writes no pool of this allocator (it still reads them); a ``None``
        event: no forward, nothing to hand over.  References only: the next
        call hands the forward to the composite (``_take_forward``), which
        keeps every page it writes or reads until it is settled
        (docs/design.md §12)."""
        if forward_done is not None:
            self._report_forward((forward_done, out_cache_loc_virtual))

    def _report_forward(self, report) -> None:
        """Queue a hook's report for the next call; the two hooks' reports of
        one forward (one event) make one entry, with its write set if either
        named one.  Host bookkeeping only."""
        due = self._forward_due or []
        last: Any = due[-1] if due else _IDLE
        if report is not _IDLE and last is not _IDLE and last[0] is report[0]:
            due[-1] = report if report[1] is not None else last
        else:
            due.append(report)
        self._forward_due = due

    def _take_forward(self) -> None:
        """Hand the reported forwards to the composite, in order: each one's
        pages are pinned (``launch``, a scatter on the device; no host read;
        the state slots it writes are every live one, since SGLang names
        none), after settling the ones before it if their event has fired
        (a cold point: that settle's wait is a no-op; settle changes no
        count, so no view changes).  ``_IDLE`` settles."""
        due, self._forward_due = self._forward_due or [], None
        c = self._composite
        for report in due:
            if report is _IDLE:
                c.settle()
                self._flight_event = None
                continue
            self._settle_if_fired()
            event, loc = report
            self._flight_event = event
            if loc is None:  # it writes none of these pools, and reads them
                c.launch(torch.empty(0, dtype=I64, device=c.device), state_slots=[], check=False)
            else:
                c.launch(loc.reshape(-1).to(I64), state_slots=None, check=False)

    def _settle_if_fired(self) -> None:
        """Settle the composite if the last forward handed to it is done
        (its event's ``query()``, a host call that reads no tensor): at a
        cold point, where waiting on it would be a no-op."""
        c = self._composite
        if c.arena.in_flight and self._flight_event is not None and self._flight_event.query():
            c.settle()
            self._flight_event = None

    def _wait_forward_done(self) -> None:
        """The arena's ``on_settle``: the schedule stream waits on the done
        event of the forwards the composite was handed (they run in order,
        so the last one's), as SGLang's ``_settle_inflight_forward`` does.
        A device-side dependency, no host read."""
        if self._flight_event is not None:
            self._current_stream().wait_event(self._flight_event)
