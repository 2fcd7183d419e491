"""Python's garbage collector, set for a process that runs many conversations at once.

By default the collector walks the young container objects every 700 allocations (less those
freed), and every object once the survivors of those walks have grown by a quarter. A process
with hundreds of conversations in flight allocates a few hundred containers per tool call (the
request and its reply, futures, the model client's request and response) and holds many of them
across the call's round trip: frequent walks find them alive and promote them, and the full
passes that follow walk everything start-up made and every conversation in flight, for a tenth
of the orchestrator's CPU. Reference counting frees almost all of it anyway: the collector is
only for cycles.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

#: Allocations (less deallocations) of container objects between two walks of the young ones:
#: a walk then meets mostly objects whose call is over, freed already, and promotes few.
YOUNG_OBJECTS = 50_000


@contextlib.contextmanager
def tuned_for_many_conversations() -> Iterator[None]:
    """While it lasts: what was made before (modules, settings, the fleet), which lives as long
    as the process, is frozen and never walked again, and the young objects are walked less
    often. For commands that run many conversations, once their start-up is done; the process's
    own settings come back at the end."""
    threshold = gc.get_threshold()
    frozen_before = gc.get_freeze_count()
    gc.freeze()
    gc.set_threshold(YOUNG_OBJECTS, *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        if not frozen_before:  # a process that froze objects itself keeps them frozen
            gc.unfreeze()
