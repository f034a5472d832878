"""The worker's start runs with the cyclic collector paused (engine/gc_pause.py): off inside the block,
on after it with the start's leftover cycles collected, what survived frozen until thaw(), and left off
where the caller had it off."""

import gc

from autoslm.engine.gc_pause import collector_paused, thaw


class Cycle:
    def __init__(self):
        self.me = self


def test_the_collector_is_off_inside_and_on_after_with_the_starts_cycles_collected():
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        Cycle()  # garbage only the cyclic collector frees
        assert any(type(o) is Cycle for o in gc.get_objects())
    assert gc.isenabled()
    assert not any(type(o) is Cycle for o in gc.get_objects())
    thaw()


def test_what_the_start_kept_is_out_of_collections_until_thawed_and_its_garbage_is_collected_then():
    with collector_paused():
        kept = Cycle()  # made by the start, let go during training
    try:
        assert gc.get_freeze_count() > 0 and not any(o is kept for o in gc.get_objects())
        del kept
        gc.collect()  # what transformers' training loop runs: it no longer walks the start's objects
        assert gc.get_freeze_count() > 0
    finally:
        thaw()
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert not any(type(o) is Cycle for o in gc.get_objects())


def test_a_failed_start_turns_it_back_on_and_a_caller_that_had_it_off_keeps_it_off():
    try:
        with collector_paused():
            raise RuntimeError("the model did not load")
    except RuntimeError:
        pass
    thaw()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
