"""Storm suppression (pure): one event per dedupe key and window, duplicates counted.

For each dedupe key the first report opens a window (the fault type's window, from the
catalogue or the notifier's settings) and is published. Reports with the same key and the
same state inside the window are *suppressed*: counted, not published. When the window
ends with suppressed reports, one summary event (a copy of the last suppressed report with a
new id) is published carrying ``suppressed_count`` and a new window starts; a report that
arrives after the window ends carries the count itself if no summary went out yet. A change
of state (OPEN -> RESOLVED) is always published at once, carrying what was suppressed.

So every report is either published or counted in exactly one published event's
``suppressed_count``, and a key never produces more than one event per window beyond its
state changes (``tests/unit/notifier/test_suppression.py`` checks both properties).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from dataservice.common.v1 import common_pb2

SUMMARY_ATTRIBUTE = "suppressed_summary"


@dataclass(frozen=True)
class Admission:
    publish: bool
    # Reports suppressed since the key's last published event (set on the event published).
    suppressed_count: int


@dataclass
class _Window:
    ends_at: float
    state: int
    suppressed: int = 0
    last_suppressed: common_pb2.FaultEvent | None = None


class StormSuppressor:
    def __init__(self, window_for: Callable[[common_pb2.FaultType.ValueType], float]) -> None:
        """``window_for(fault_type)`` is the suppression window in seconds (0 = none)."""
        self._window_for = window_for
        self._windows: dict[str, _Window] = {}
        self.suppressed_total = 0

    def __len__(self) -> int:
        return len(self._windows)

    def admit(self, event: common_pb2.FaultEvent, now: float) -> Admission:
        """Decide about one report; ``event.dedupe_key`` must be set. On publish the caller
        sets ``event.suppressed_count`` to the admission's count."""
        key = event.dedupe_key
        window = self._windows.get(key)
        length = self._window_for(event.type)
        if window is None or now >= window.ends_at or event.state != window.state:
            carried = window.suppressed if window is not None else 0
            self._windows[key] = _Window(ends_at=now + length, state=event.state)
            if length <= 0:
                del self._windows[key]
            return Admission(True, carried)
        window.suppressed += 1
        window.last_suppressed = event
        self.suppressed_total += 1
        return Admission(False, 0)

    def next_due(self) -> float:
        """When :meth:`due` next has a summary to give: the earliest end of a window that
        suppressed something (``inf``: none). Windows that end quietly need no tick; the
        next :meth:`due` forgets them."""
        return min((w.ends_at for w in self._windows.values() if w.suppressed), default=math.inf)

    def due(self, now: float) -> list[common_pb2.FaultEvent]:
        """Summary events of windows that ended with suppressed reports (a new window
        starts for each); windows that ended quietly are forgotten."""
        summaries: list[common_pb2.FaultEvent] = []
        for key, window in list(self._windows.items()):
            if now < window.ends_at:
                continue
            if window.suppressed == 0 or window.last_suppressed is None:
                del self._windows[key]
                continue
            summary = common_pb2.FaultEvent()
            summary.CopyFrom(window.last_suppressed)
            summary.id = str(uuid.uuid4())
            summary.suppressed_count = window.suppressed
            summary.attributes[SUMMARY_ATTRIBUTE] = "true"
            summaries.append(summary)
            self._windows[key] = _Window(
                ends_at=now + self._window_for(summary.type), state=window.state
            )
        return summaries
