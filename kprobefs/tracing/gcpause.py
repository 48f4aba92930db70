"""The cyclic garbage collector paused over bulk work.

Reading ``trace`` decodes and formats tens of thousands of records at once: every
record tuple, (cpu, record) pair and argument tuple is a container the collector counts,
so a full buffer's read set off young and full collections that walk every record the
ring buffers hold (a quarter of a 7 MB read's time, measured).  Nothing in that work
makes a reference cycle; what it allocates is freed by reference counting when the text
is made.  So the collector waits until the outermost bulk section (on any thread) ends.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

__all__ = ["gc_paused"]

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Hold the cyclic collector off for the block (nests, across threads too)."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
