"""Testing code against kprobefs (docs/testing-your-code.md): a pytest plugin
(:mod:`kprobefs.testing.plugin`, the ``kprobefs`` fixture), a mount driven through the
command line (:class:`KprobefsMount`), the reset between tests (:class:`TracefsReset`),
records read from ``trace``, ``trace_pipe`` and ``trace_pipe_raw`` (:class:`TraceReader`,
:class:`Record`) and a bounded wait for one (:class:`TracePipe`).  Everything but the
plugin works without pytest."""

from .formats import EventFormat, FormatError, FormatField, parse_format
from .mount import KprobefsMount, MountError, fuse_missing
from .records import Record, TraceReader, canonical, decode_page, parse_line, parse_trace
from .reset import ResetError, TracefsReset
from .waiter import RecordTimeout, TracePipe, wait_for_record

__all__ = ["KprobefsMount", "MountError", "fuse_missing", "TracefsReset", "ResetError",
           "Record", "TraceReader", "parse_trace", "parse_line", "decode_page", "canonical",
           "EventFormat", "FormatField", "FormatError", "parse_format", "TracePipe",
           "RecordTimeout", "wait_for_record"]
