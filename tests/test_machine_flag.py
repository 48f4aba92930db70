"""machine.flag.Flag: threading.Event's contract on a bare lock."""

import threading

from kprobefs.machine.flag import Flag


def test_a_flag_behaves_as_an_event():
    f = Flag()
    assert not f.is_set() and not f.wait(0.01)
    f.set()
    f.set()                                 # a second set is harmless
    assert f.is_set() and f.wait(0) and f.wait(None)
    f.clear()
    f.clear()
    assert not f.is_set() and not f.wait(0.01)


def test_every_waiter_wakes_on_one_set():
    f, woke = Flag(), []
    threads = [threading.Thread(target=lambda: woke.append(f.wait(30))) for _ in range(4)]
    for t in threads:
        t.start()
    f.set()
    for t in threads:
        t.join(30)
    assert woke == [True] * 4 and f.is_set()
