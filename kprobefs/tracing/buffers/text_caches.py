"""The texts ``trace`` lines are made of, kept by value: the caches of
output.TraceFormatter, and the set of them a trace array keeps from one read of
``trace`` to the next (:class:`SharedTextCaches`).

A read of a full buffer meets thousands of events, contexts and argument values, each
text made once (a Python call); kept over reads, a read makes only the texts no earlier
read made.  What is kept is keyed so that it cannot go stale: the options and symbols
key the whole set; an event's head texts are those of the compiled text its
``compile_text`` gave at this read (checked for each event once a read, the event held
by the caches so that no other object takes its id); a context's text is that of the
comm its pid has at this read (checked as a read starts).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from functools import partial
from itertools import repeat
from operator import mod
from typing import Callable, Iterable, Iterator

__all__ = ["TextCaches", "SharedTextCaches", "bytes_text"]

#: The most events whose texts are kept (events held past their removal until then).
EVENTS_KEPT = 16384
#: The most contexts (cpu, pid, flags) kept.
CONTEXTS_KEPT = 16384
#: The most seconds whose records' context columns are kept.
SECONDS_KEPT = 64
#: The most argument texts kept (of all the events).
ARGS_KEPT = 65536


class _Made(dict):
    """A dict that makes a missing value as ``make(key)`` and keeps it: looked up with
    ``map(made.__getitem__, keys)``, only the misses run Python."""

    __slots__ = ("_make",)

    def __init__(self, make: Callable[[object], object]):
        super().__init__()
        self._make = make

    def __missing__(self, key):
        value = self[key] = self._make(key)
        return value


class _Contexts(dict):
    """(cpu, pid, flags) -> a line's context columns (``comm-pid [cpu] flags``), made at
    the first lookup or for many keys at once (:meth:`make`); ``comms``: pid -> the
    comm they printed.  It holds no reference to its formatter, nor do the text makers
    below: a read's caches are freed with it, by reference counting (a cycle would
    leave every key of them to the cyclic collector once the read is done)."""

    __slots__ = ("find_comm", "_format", "_flags", "comms")

    def __init__(self, find_comm: Callable[[int], str], irq_info: bool,
                 flags_text: Callable[[int], str]):
        super().__init__()
        self.find_comm = find_comm
        # as format_context's columns (its f-string's conversions, in % terms)
        self._format = "%16s-%-7d [%03d] %s" if irq_info else "%16s-%-7d [%03d] %.0s"
        self._flags = _Made(flags_text)
        self.comms: dict[int, str] = {}

    def __missing__(self, key: tuple) -> str:
        self.make((key,))
        return self[key]

    def make(self, keys: Iterable[tuple]) -> None:
        """Make the columns of each of ``keys`` not made yet."""
        new = [key for key in set(keys) if key not in self]
        if new:
            cpus, pids, flags = zip(*new)
            comms = list(map(self.find_comm, pids))
            self.comms.update(zip(pids, comms))
            self.update(zip(new, map(mod, repeat(self._format), zip(
                comms, pids, cpus, map(self._flags.__getitem__, flags)))))

    def renamed(self) -> bool:
        """Whether a pid's comm is not the one its contexts printed."""
        find = self.find_comm
        return any(find(pid) != comm for pid, comm in self.comms.items())

    def clear(self) -> None:
        super().clear()
        self.comms.clear()


class _Heads(dict):
    """(event, ip, return ip) -> a compiled event's line from ``sep`` (``": "`` after
    the timestamp, or nothing) up to its arguments' text: the event's name and probed
    address(es), made at the first lookup in one call (a read may meet thousands of
    events, each once).  ``texts`` is the reading formatter's id(event) -> compiled
    text."""

    __slots__ = ("texts", "_sep")

    def __init__(self, sep: str):
        super().__init__()
        self.texts: dict = {}
        self._sep = sep

    def __missing__(self, key: tuple) -> str:
        ev, ip, ret_ip = key
        text = self.texts[id(ev)]
        value = self[key] = self._sep + text.head((ret_ip, ip) if text.is_return else ip)
        return value


def _args_text(tail: str, unpack: Callable[[bytes], tuple], data: bytes) -> str:
    return tail % unpack(data)


def bytes_text(bytes_texts: dict, text) -> _Made:
    """Argument bytes (a record's or a staged entry's) -> their text, for the events
    that unpack and print their arguments as the compiled ``text`` does (equal bytes
    of events whose types differ, s32 and u32, are told apart by the codes), kept in
    ``bytes_texts``."""
    key = (text.codes, text.tail)
    made = bytes_texts.get(key)
    if made is None:
        made = bytes_texts[key] = _Made(partial(_args_text, text.tail, text.unpack))
    return made


def _staged_head_text(heads: _Heads, events: dict, key: tuple) -> str:
    """The head of a staged entry's line: ``key`` is (its type, ip[, return ip]), the
    type's event in ``events``."""
    return heads[events[key[0]], key[1], key[2] if len(key) > 2 else 0]


class TextCaches:
    """The caches of one formatter, or of the reads of one trace array under one
    ``key`` (the options and symbols), one read at a time (:class:`SharedTextCaches`).
    ``flags_text`` makes a context's flags columns."""

    def __init__(self, key: object, find_comm: Callable[[int], str], irq_info: bool,
                 context_info: bool, flags_text: Callable[[int], str]):
        self.key = key
        self.contexts = _Contexts(find_comm, irq_info, flags_text)
        #: (event, ip, return ip) -> the line's text from the timestamp to the arguments
        self.heads = _Heads(": " if context_info else "")
        #: event -> the compiled text its heads were made from
        self.events: dict = {}
        self.staged_events: dict = {}           # type -> event, of the staged entries
        self.staged_heads = _Made(partial(_staged_head_text, self.heads,
                                          self.staged_events))
        #: (struct codes, tail) -> argument bytes -> their text
        self.bytes_texts: dict = {}
        #: event -> its arguments' texts (bytes_text of its compiled text)
        self.event_args: dict = {}
        #: (None, second) -> (cpu, pid, flags) -> a record's context columns and
        #: timestamp up to its microseconds
        self.prefixes: dict = {}

    def begin(self, find_comm: Callable[[int], str], texts: dict) -> None:
        """Start a read: ``texts`` is the reading formatter's id(event) -> compiled
        text; the contexts of a pid whose comm changed since, and what outgrew its
        bound, are dropped."""
        contexts = self.contexts
        contexts.find_comm = find_comm
        if len(contexts) > CONTEXTS_KEPT or contexts.renamed():
            contexts.clear()
            self.prefixes.clear()
        if len(self.prefixes) > SECONDS_KEPT:
            self.prefixes.clear()
        if len(self.events) > EVENTS_KEPT \
                or sum(map(len, self.bytes_texts.values())) > ARGS_KEPT:
            self._forget_heads()
            self.events.clear()
            self.event_args.clear()
            self.staged_events.clear()
            self.bytes_texts.clear()
        self.heads.texts = texts

    def end(self) -> None:
        """End a read: the reading formatter's texts are let go."""
        self.heads.texts = {}

    def saw(self, event, text) -> None:
        """``event``'s compiled text at this read is ``text``: the heads made from
        another one are dropped."""
        old = self.events.get(event)
        if old is not text:
            if old is not None:
                self._forget_heads()
            self.events[event] = text
            self.event_args[event] = bytes_text(self.bytes_texts, text)

    def saw_types(self, events: dict) -> None:
        """The staged entries' types name ``events`` (type -> event): the staged heads
        of a type that named another event are dropped."""
        staged = self.staged_events
        if any(staged.get(type_, ev) is not ev for type_, ev in events.items()):
            self.staged_heads.clear()
            staged.clear()
        staged.update(events)

    def _forget_heads(self) -> None:
        self.heads.clear()
        self.staged_heads.clear()


class SharedTextCaches:
    """The :class:`TextCaches` a trace array's reads of ``trace`` share: those of the
    last read's key, lent to one read at a time."""

    def __init__(self):
        self._lock = threading.Lock()
        self._caches: TextCaches | None = None

    def drop(self) -> None:
        """Forget every text kept: the next read makes each text it needs."""
        with self._lock:
            self._caches = None

    @contextmanager
    def lend(self, key: object, make: Callable[[], TextCaches]
             ) -> Iterator[TextCaches | None]:
        """The caches kept under ``key`` (``make()`` when there are none, or they were
        kept under another key); ``None`` while another read has them."""
        if not self._lock.acquire(blocking=False):
            yield None
            return
        try:
            caches = self._caches
            if caches is None or caches.key != key:
                caches = self._caches = make()
            try:
                yield caches
            finally:
                if caches is not None:
                    caches.end()
        finally:
            self._lock.release()
