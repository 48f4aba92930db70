"""The kprobe-based event tracer (the only package that imports lark).

Where things live:

* The top level: the event registry and the trace arrays' list (``registry``:
  :class:`Tracer`), a trace array's own state (``trace_array``), the tracefs tree
  (``files``, over ``nodes``, the node protocol and generic nodes, and ``buffer_files``,
  ``trace``/``snapshot``/the pipes), and what every array shares: ``error_log``,
  kallsyms as the tracer asks it (``symbols``), the pid filters (``pid_filter``),
  ``tracing_cpumask`` (``cpumask``), the collector paused over bulk reads (``gcpause``).
* ``events/``: the kinds of event: kprobe events (``trace_kprobe``), their commands
  (``probe_parser``, the fetch arguments and grammar in ``probe_args``) and fetch
  programs (``fetch``), event probes (``trace_eprobe``), synthetic events (``synth``),
  the dynamic-event commands (``trace_dynevent``), the kernel's static events
  (``trace_events``, their ``print fmt``: ``print_fmt``), the ftrace system's records
  (``ftrace_events``) and trace_printk() (``trace_printk``).
* ``tracers/``: what ``current_tracer`` names: the plugin interface and nop (``plugin``),
  function and the stack tracer (``function``, set_ftrace_filter's commands in
  ``ftrace_probes``), function_graph (``function_graph`` records,
  ``function_graph_output`` prints), the profiler (``function_profile``), the latency
  tracers (``latency_tracers``) and their records and format (``latency_format``).
* ``triggers/``: what runs when an event fires: its filter (``filter``), its triggers
  (``trigger``, the commands and the engine; ``trigger_actions``, what they do to their
  trace array), histograms (``hist``, the table and the hist file; ``hist_command``,
  parsing and registering a hist command).
* ``buffers/``: the ring buffer (``ring_buffer``) and its pages (``raw_page``), the host
  side of the kernel's recorder (``native``), the text of trace and trace_pipe
  (``output``), trace_marker_raw (``marker``), the snapshot buffer (``snapshot``) and
  the trace clocks (``clocks``).

Imports point down: ``fs`` imports this package, which imports ``kprobes`` and below.
"""

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
