"""A WAN and a GPU pool that change under running jobs (issue 19): the input files and their
generators. Formats and semantics: docs/wan-events.md."""

from spiderflow.wan.capacity import CapacityEvent, load_capacity_events
from spiderflow.wan.events import WanEvent, load_wan_events

__all__ = ["CapacityEvent", "WanEvent", "load_capacity_events", "load_wan_events"]
