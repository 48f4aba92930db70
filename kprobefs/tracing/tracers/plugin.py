"""Tracers: what ``current_tracer`` names (Linux's ``struct tracer``).

A trace array holds one instance of each tracer it offers (:meth:`TraceArray.
set_current_tracer` switches between them).  A tracer is anything with the shape of
:class:`TracerPlugin`: a ``name``; ``init(tr)`` when it becomes the array's current tracer
(after the array's buffer is reset, as ``tracer_init`` does) and ``reset(tr)`` when another
replaces it; ``print_header(tr, options)`` and ``print_trace(tr, pairs, options)`` where its
``trace`` text differs from the event lines (None: the array's default).  ``use_max_tr``
says it keeps its maximum-latency trace in the array's snapshot buffer (Linux refuses
``snapshot`` writes then, EBUSY); ``print_max`` that ``trace`` shows that buffer.
``allow_instances`` says an instance offers it too.
``flags`` are the tracer's own options (Linux's tracer_flags), name -> value in its
order: each is a file in ``options/`` while the tracer is offered, and a line of
``trace_options`` while it is current; ``set_flag(tr, name, on)`` changes one.

The registry (``events.Tracer``) builds each array's tracers from a list of factories
(``factory(registry, tr) -> tracer or None``), in registration order; ``available_tracers``
lists them newest first, as Linux does.
"""

from __future__ import annotations

from typing import Callable, Iterable

from kprobefs.tracing.buffers.output import TraceOptions

__all__ = ["TracerPlugin", "NopTracer", "TracerFactory"]


class TracerPlugin:
    """The base of the tracers: every hook does nothing."""

    name = ""
    use_max_tr = False
    print_max = False
    allow_instances = True
    #: print_trace prints every record, whatever options/raw, hex or bin say
    prints_every_record = False

    #: No options of its own (a tracer that has some sets a dict per instance).
    flags: dict[str, bool] = {}

    def init(self, tr) -> None:
        """Called with the array's lock held, after its buffer was reset."""

    def reset(self, tr) -> None:
        """Called with the array's lock held, before the next tracer's ``init``."""

    def set_flag(self, tr, name: str, on: bool) -> None:
        """Called with the array's lock held; ``name`` is one of ``flags``."""
        self.flags[name] = on

    def print_header(self, tr, options: TraceOptions) -> str | None:
        return None

    def print_trace(self, tr, pairs: Iterable[tuple[int, tuple]],
                    options: TraceOptions) -> str | None:
        return None


class NopTracer(TracerPlugin):
    """``nop``: no tracer; events only."""

    name = "nop"


#: ``factory(registry, tr)``: the tracer this array offers, or None where it cannot.
TracerFactory = Callable[[object, object], TracerPlugin | None]
