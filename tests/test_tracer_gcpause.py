"""gc_paused: the cyclic collector held off over bulk trace work, nesting across
threads, and the collector's state before it restored."""

import gc
import threading

from kprobefs.tracing.gcpause import gc_paused


def test_paused_inside_restored_after():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()           # the outer section still runs
    assert gc.isenabled()


def test_restored_after_an_exception():
    try:
        with gc_paused():
            raise KeyError
    except KeyError:
        pass
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled():
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_sections_on_two_threads_overlap():
    inside, release = threading.Event(), threading.Event()

    def other():
        with gc_paused():
            inside.set()
            release.wait(5)
    t = threading.Thread(target=other)
    t.start()
    assert inside.wait(5)
    with gc_paused():
        pass
    assert not gc.isenabled()               # the other thread's section goes on
    release.set()
    t.join(5)
    assert gc.isenabled()
