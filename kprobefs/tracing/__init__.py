"""The kprobe-based event tracer (the only package that imports lark)."""

from .events.fetch import (
    FetchContext, FetchFault, FetchProgram, build_record_fields, encode_args,
    format_event_format, print_args,
)
from .error_log import ErrorLog
from .registry import KernelSymbols, TraceEvent, TraceProbe, Tracer
from .trace_array import EventFile, TraceArray
from .buffers.ring_buffer import RingBuffer
from .files import FileHandle, TraceDir, TraceFile, tracing_root
from .triggers import filter as _filter
from .events import probe_parser as _parser
from .triggers.filter import EventFilter, FilterParseError, compile_filter
from .events.probe_parser import (
    DeleteSpec, FetchArgSpec, ProbeSpec, SymbolResolver, compare_arg_types,
    format_error_log_entry, format_probe, is_same_probe, parse_command, split_commands,
)

__all__ = [
    "parse_command", "split_commands", "format_probe", "format_error_log_entry", "ProbeSpec",
    "DeleteSpec", "FetchArgSpec", "SymbolResolver", "compare_arg_types", "is_same_probe",
    "FetchContext", "FetchFault", "FetchProgram", "encode_args", "print_args",
    "format_event_format", "build_record_fields",
    "Tracer", "TraceArray", "EventFile", "TraceEvent", "TraceProbe", "KernelSymbols",
    "tracing_root", "TraceDir", "TraceFile", "FileHandle", "ErrorLog", "EventFilter", "FilterParseError",
    "compile_filter", "RingBuffer", "warm_up",
]


def warm_up() -> None:
    """Builds the command and filter grammars now: a daemon pays for them at boot, not
    in its first user's write (about 50 ms)."""
    _parser.warm_up()
    _filter.warm_up()
