"""The collector's settings while a command runs many conversations, and after."""

from __future__ import annotations

import gc

from api.process.gc_tuning import YOUNG_OBJECTS, tuned_for_many_conversations


def test_start_up_is_frozen_and_young_objects_walked_less_often_while_it_lasts() -> None:
    before = gc.get_threshold()

    with tuned_for_many_conversations():
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (YOUNG_OBJECTS, *before[1:])

    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_a_process_that_froze_objects_itself_keeps_them_frozen() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with tuned_for_many_conversations():
            pass
        assert gc.get_freeze_count() >= frozen
    finally:
        gc.unfreeze()
