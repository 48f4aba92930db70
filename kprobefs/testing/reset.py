"""The reset between tests: a tracefs as ftracetest's ``initialize_ftrace`` leaves it.

Linux 6.1's ``test.d/functions`` puts the tracer to ``nop``, removes the event triggers
(hist actions first) and filters, the ``set_ftrace_filter`` functions and commands,
disables every event, removes the dynamic events, empties the pid lists and the
function filters, frees the snapshot, clears the buffer and turns tracing on.  This
reset does the same and more, so that a test cannot see what the one before it did:
no instances, every option at its default, the default clock, buffer size,
buffer_percent, CPU mask and thresholds, the kprobes and ftrace switches on, the
modules loaded since the first reset unloaded, and an empty ``error_log``.

It is made to be cheap: each request to the mount is a system call of the emulated
kernel (one to four milliseconds), and ftracetest's way, reading each event's
``trigger`` and ``filter`` (some 240 files here), costs half a second.  So:

- it looks only at what was written since the last reset.  An inotify watch on every
  directory of the mount (the host kernel reports each write(2), each close of a file
  opened for writing, each mkdir and rmdir, from any process and any mount namespace:
  ``kprobefs exec`` too) names the files; directories made since (a new probe's) are
  reached only through a write to a watched file (``kprobe_events``), which brings in
  the steps that undo them.  The first reset, and one after the watch's queue
  overflowed, look at everything;
- it reads one file per setting and writes only what differs: ``set_event`` lists
  every event that is enabled or has a trigger (soft mode), so only their ``trigger``
  files are read; a write of ``0`` to a system's ``filter`` clears the filter of every
  event in it (6.1's ``filter_free_subsystem_preds``); a dynamic event's filter goes
  with the event.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from pathlib import Path

from .errors import ResetError

__all__ = ["TracefsReset", "ResetError", "DEFAULT_OPTIONS"]


#: Linux 6.1's default value of each option (``options/NAME``), tracer options too.
DEFAULT_OPTIONS = {
    "print-parent": 1, "sym-offset": 0, "sym-addr": 0, "verbose": 0, "raw": 0, "hex": 0,
    "bin": 0, "block": 0, "fields": 0, "trace_printk": 1, "annotate": 1,
    "userstacktrace": 0, "sym-userobj": 0, "printk-msg-only": 0, "context-info": 1,
    "latency-format": 0, "record-cmd": 1, "record-tgid": 0, "overwrite": 1,
    "disable_on_free": 0, "irq-info": 1, "markers": 1, "event-fork": 0,
    "pause-on-trace": 0, "hash-ptr": 1, "function-trace": 1, "function-fork": 0,
    "display-graph": 0, "stacktrace": 0, "test_nop_accept": 0, "test_nop_refuse": 0,
    "func_stack_trace": 0, "func-no-repeats": 0, "funcgraph-overrun": 0, "funcgraph-cpu": 1,
    "funcgraph-overhead": 1, "funcgraph-proc": 0, "funcgraph-duration": 1,
    "funcgraph-abstime": 0, "funcgraph-irqs": 1, "funcgraph-tail": 0,
    "sleep-time": 1, "graph-time": 1,
}

#: Files whose clean content is known: written with O_TRUNC (an empty write) otherwise.
_EMPTY_WHEN_CLEAN = {
    "set_event_pid": ("",), "set_event_notrace_pid": ("",),
    "set_ftrace_pid": ("", "no pid"), "set_ftrace_notrace_pid": ("", "no pid"),
    "set_ftrace_notrace": ("", "#### no functions disabled ####"),
    "set_graph_function": ("", "#### all functions enabled ####"),
    "set_graph_notrace": ("", "#### no functions disabled ####"),
    "stack_trace_filter": ("", "#### all functions enabled ####"),
    "error_log": ("",),
}

#: (file under the mount, clean value, what to write, other files whose writes may
#: change it); the value as read, stripped.  The stack tracer stops before its maximum
#: is cleared.
_SCALARS = (
    ("proc/sys/kernel/stack_tracer_enabled", "0", "0", ()),
    ("tracing/tracing_thresh", "0", "0", ()),
    ("tracing/max_graph_depth", "0", "0", ()),
    ("tracing/buffer_percent", "50", "50", ()),
    ("tracing/tracing_max_latency", "0", "0", ("tracing/current_tracer",)),
    ("tracing/function_profile_enabled", "0", "0", ()),
    ("tracing/saved_cmdlines_size", "128", "128", ()),
    ("tracing/stack_max_size", "0", "0", ("proc/sys/kernel/stack_tracer_enabled",)),
    ("proc/sys/kernel/ftrace_enabled", "1", "1", ()),
    ("proc/sys/debug/kprobes-optimization", "1", "1", ()),
    ("kprobes/enabled", "1", "1", ()),
)

_DEFAULT_BUFFER_KB = "1408"
_DYNAMIC_FILES = ("tracing/kprobe_events", "tracing/dynamic_events",
                  "tracing/synthetic_events", "tracing/uprobe_events")
#: Writes after which events may be enabled or triggered where no watch sees it.
_EVENT_FILES = _DYNAMIC_FILES + ("tracing/set_event", "tracing/set_ftrace_filter",
                                 "kprobefs/modules")


class _Watch:
    """inotify on a set of directories: the names written, made or removed in them
    since the last ``take()``."""

    _MASK = 0x2 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200   # MODIFY CLOSE_WRITE MOVED CREATE DELETE
    _OVERFLOW, _IGNORED = 0x4000, 0x8000

    def __init__(self):
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self._dirs: dict[int, str] = {}

    def add(self, path: Path, rel: str) -> bool:
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), self._MASK)
        if wd < 0:
            return False
        self._dirs[wd] = rel
        return True

    def take(self) -> set[str] | None:
        """The relative names changed since the last call; None when some were lost
        (the queue overflowed, a watched directory went away)."""
        names: set[str] | None = set()
        while True:
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return names
            i = 0
            while i + 16 <= len(buf):
                wd, mask, _cookie, length = struct.unpack_from("iIII", buf, i)
                name = buf[i + 16:i + 16 + length].rstrip(b"\0").decode(errors="replace")
                i += 16 + length
                if mask & (self._OVERFLOW | self._IGNORED):
                    names = None
                elif names is not None:
                    d = self._dirs.get(wd, "?")
                    names.add(f"{d}/{name}" if d else name)

    def close(self) -> None:
        os.close(self.fd)


class TracefsReset:
    """Resets the tracefs of the mount at ``root``.  Keeps an inotify descriptor and a
    few files open for writing between resets (``close()`` closes them)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.t = self.root / "tracing"
        self._held: dict[str, int] = {}
        self._watch: _Watch | None = None
        self._static_groups: list[str] = []
        self._watched_events: set[str] = set()
        self._modules: set[str] | None = None
        self._tracer_options: list[str] = []
        self._buffer_kb_clean: set[str] = set()
        self._cpumask = ""
        self._incomplete = False
        self.done: list[str] = []

    def close(self) -> None:
        for fd in self._held.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._held.clear()
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    # ---------------------------------------------------------------- file access
    def _read(self, rel: str) -> str:
        """The file's text; rel is relative to the mount's root."""
        with open(self.root / rel, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def _write(self, rel: str, data: str, *, trunc: bool = True) -> None:
        """One write(2) of data, opened with O_TRUNC unless ``trunc`` is false (then
        O_APPEND, as ``>>``); raises ResetError with the file's name."""
        path = self.root / rel
        flags = os.O_WRONLY | (os.O_TRUNC if trunc else os.O_APPEND)
        try:
            fd = os.open(path, flags)
            try:
                if data:
                    os.write(fd, data.encode())
            finally:
                os.close(fd)
        except OSError as e:
            raise ResetError(f"{path}: cannot write {data.strip()!r}: "
                             f"{os.strerror(e.errno)}") from e

    def _held_write(self, rel: str, data: str) -> None:
        """A write on a file opened once and kept open: one request instead of three.
        A file that went away (ENODEV, ENOENT) is forgotten."""
        fd = self._held.get(rel)
        if fd is None:
            fd = self._held[rel] = os.open(self.root / rel, os.O_WRONLY)
        try:
            os.write(fd, data.encode())
        except OSError as e:
            if e.errno in (errno.ENODEV, errno.ENOENT, errno.EBADF):
                os.close(self._held.pop(rel))
                return
            raise ResetError(f"{self.root / rel}: cannot write {data.strip()!r}: "
                             f"{os.strerror(e.errno)}") from e

    def _did(self, what: str) -> None:
        self.done.append(what)

    # ---------------------------------------------------------------- the reset
    def reset(self, full: bool = False) -> list[str]:
        """Resets what was written since the last reset (everything with ``full``, at
        the first reset, and when the watch lost track); returns what had to change,
        empty when nothing had."""
        self.done = []
        if self._watch is None:
            self._learn()
            full = True
        dirty = self._watch.take()
        # A reset that stopped half way took its dirty names with it: look at all.
        if dirty is None or self._incomplete:
            full = True
        self._incomplete = True
        touched = full or bool(dirty)

        def any_of(*names: str, under: str = "") -> bool:
            return full or any(n in dirty for n in names) or bool(
                under and any(n.startswith(under) for n in dirty))

        if touched:
            tracing_on = self._read("tracing/tracing_on").strip()
        if any_of("tracing/current_tracer"):
            self._reset_tracer()
        if any_of(under="tracing/instances/"):
            self._remove_instances()
        if any_of("tracing/set_ftrace_filter"):
            self._reset_ftrace_filter()
        if any_of(*_EVENT_FILES, under="tracing/events/"):
            self._reset_events(lambda rel: full or rel in dirty)
        groups = self._static_groups if full else sorted(
            {n.split("/")[2] for n in dirty
             if n.startswith("tracing/events/") and n.endswith("/filter")})
        for group in groups:
            if group in self._static_groups:
                self._held_write(f"tracing/events/{group}/filter", "0")
        if any_of(*_DYNAMIC_FILES):
            self._reset_dynamic_events()
        for name, clean in _EMPTY_WHEN_CLEAN.items():
            rel = f"tracing/{name}"
            if any_of(rel) or touched and name == "error_log":
                if self._read(rel).strip() not in clean:
                    self._write(rel, "")
                    self._did(f"emptied {name}")
        if touched:
            self._held_write("tracing/snapshot", "0")
        if any_of("tracing/trace_options", "tracing/current_tracer", under="tracing/options/"):
            # A tracer's options show in trace_options only while it is current (the
            # tracer is nop by now): a write there may have changed them too.
            self._reset_options(any_of("tracing/trace_options", under="tracing/options/"))
        if any_of("tracing/trace_clock"):
            self._reset_clock()
        if any_of("tracing/buffer_size_kb", under="tracing/per_cpu/"):
            self._reset_buffer_size()
        if any_of("tracing/tracing_cpumask"):
            self._reset_cpumask()
        for rel, clean, value, also in _SCALARS:
            if any_of(rel, *also):
                self._reset_scalar(rel, clean, value)
        if any_of("kprobefs/modules"):
            self._unload_modules()
        self._write("tracing/trace", "")
        if touched and (tracing_on != "1" or
                        self._read("tracing/tracing_on").strip() != "1"):
            self._write("tracing/tracing_on", "1")
            self._did("tracing_on 1")
        self._watch.take()          # this reset's own writes
        self._incomplete = False
        return self.done

    def _learn(self) -> None:
        """What the first reset finds out once: the directories to watch, the events'
        systems that are not dynamic events' groups, the options that are a tracer's,
        the modules loaded, the CPUs."""
        dynamic = {line.split()[0].split(":", 1)[-1].split("/")[0]
                   for line in self._read("tracing/dynamic_events").splitlines()
                   if line.strip()}
        events = self.t / "events"
        self._static_groups = sorted(
            d for d in os.listdir(events)
            if d not in dynamic and (events / d / "filter").exists())
        listed = {o.removeprefix("no") for o in self._read("tracing/trace_options").split()}
        self._tracer_options = sorted(o for o in os.listdir(self.t / "options")
                                      if o not in listed and o in DEFAULT_OPTIONS)
        self._modules = self._loaded_modules()
        cpus = sorted(p for p in os.listdir(self.t / "per_cpu") if p.startswith("cpu"))
        self._cpumask = format((1 << len(cpus)) - 1, "x")
        watch = _Watch()
        dirs = ["", "tracing", "tracing/events", "tracing/options", "tracing/instances",
                "tracing/per_cpu", "kprobes", "kprobefs", "proc", "proc/sys",
                "proc/sys/kernel", "proc/sys/debug"]
        dirs += [f"tracing/per_cpu/{c}" for c in cpus]
        dirs += [f"tracing/events/{g}" for g in os.listdir(events) if (events / g).is_dir()]
        static = [e.replace(":", "/") for e in self._read("tracing/available_events").split()
                  if e.split(":")[0] not in dynamic] + ["ftrace/print"]
        dirs += [f"tracing/events/{e}" for e in static]
        for rel in dirs:
            if watch.add(self.root / rel, rel) and rel.startswith("tracing/events/"):
                self._watched_events.add(rel[len("tracing/events/"):])
        self._watch = watch

    def _reset_tracer(self) -> None:
        tracer = self._read("tracing/current_tracer").strip()
        if tracer != "nop":
            self._write("tracing/current_tracer", "nop")
            self._did(f"current_tracer {tracer} -> nop")

    def _remove_instances(self) -> None:
        for name in sorted(os.listdir(self.t / "instances")):
            try:
                os.rmdir(self.t / "instances" / name)
            except OSError as e:
                why = "a process still has one of its files open" \
                    if e.errno == errno.EBUSY else os.strerror(e.errno)
                raise ResetError(f"instances/{name}: cannot remove: {why}") from e
            self._did(f"rmdir instances/{name}")

    def _reset_ftrace_filter(self) -> None:
        rel = "tracing/set_ftrace_filter"
        if self._read(rel).strip() == "#### all functions enabled ####":
            return
        self._write(rel, "")
        for line in self._read(rel).splitlines():
            parts = line.split(":")
            if line.startswith("#") or len(parts) < 2:
                continue
            func, command, rest = parts[0].split()[0], parts[1], parts[2:]
            if command in ("enable_event", "disable_event"):
                command, rest = ":".join(parts[1:4]), parts[4:]
            limit = rest[0] if rest else "unlimited"
            self._write(rel, f"!{func}:{command}" + ("" if limit == "unlimited" else f":{limit}"))
        self._did("set_ftrace_filter emptied")

    def _reset_events(self, written) -> None:
        """Removes the triggers and disables the events.  ``written(rel)``: whether the
        file was written since the last reset; a watched event's trigger file that was
        not has no trigger (``set_event`` also lists events soft-enabled otherwise)."""
        enabled = self._read("tracing/set_event").split()
        # ftrace/print's trigger (trace_marker's) puts no event in set_event.
        for event in [e.replace(":", "/") for e in enabled] + ["ftrace/print"]:
            rel = f"tracing/events/{event}/trigger"
            if event not in self._watched_events or written(rel):
                self._remove_triggers(rel)
        if enabled:
            self._held_write("tracing/events/enable", "0")
            self._did(f"disabled {len(enabled)} events")

    def _remove_triggers(self, rel: str) -> None:
        try:
            text = self._read(rel)
        except OSError:
            return
        lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
        # Actions (onmatch/onmax/onchange) first: they hold variables others read.
        lines.sort(key=lambda ln: not (":on" in ln and "(" in ln))
        for line in lines:
            self._write(rel, "!" + line.split("[")[0].strip(), trunc=False)
        if lines:
            self._did(f"removed {len(lines)} triggers of {rel}")

    def _reset_dynamic_events(self) -> None:
        rel = "tracing/dynamic_events"
        for _ in range(10):
            lines = [ln for ln in self._read(rel).splitlines() if ln.strip()]
            if not lines:
                return
            try:
                self._write(rel, "")
                self._did(f"removed {len(lines)} dynamic events")
                return
            except ResetError:
                pass
            for line in lines:      # one by one: some must go before others
                try:
                    self._write(rel, "-:" + line.split()[0].split(":", 1)[-1], trunc=False)
                except ResetError:
                    continue
        raise ResetError(f"{rel}: cannot remove: " + self._read(rel))

    def _reset_options(self, tracer_options: bool) -> None:
        for token in self._read("tracing/trace_options").split():
            name = token.removeprefix("no")
            self._set_option(name, 0 if token.startswith("no") else 1, held=True)
        for name in self._tracer_options if tracer_options else ():
            self._set_option(name, int(self._read(f"tracing/options/{name}").strip() or 0))

    def _set_option(self, name: str, value: int, held: bool = False) -> None:
        default = DEFAULT_OPTIONS.get(name)
        if default is None or default == value:
            return
        if held:
            self._held_write("tracing/trace_options", name if default else f"no{name}")
        else:
            self._write(f"tracing/options/{name}", str(default))
        self._did(f"option {name} {value} -> {default}")

    def _reset_clock(self) -> None:
        if "[local]" not in self._read("tracing/trace_clock"):
            self._write("tracing/trace_clock", "local")
            self._did("trace_clock local")

    def _reset_buffer_size(self) -> None:
        rel = "tracing/buffer_size_kb"
        size = self._read(rel).strip()
        if "expanded" in size or size in self._buffer_kb_clean:
            return
        self._write(rel, _DEFAULT_BUFFER_KB)
        self._buffer_kb_clean.add(self._read(rel).strip())
        if size not in self._buffer_kb_clean:
            self._did(f"buffer_size_kb {size} -> {_DEFAULT_BUFFER_KB}")

    def _reset_cpumask(self) -> None:
        mask = self._read("tracing/tracing_cpumask").strip()
        if mask.lstrip("0") != self._cpumask:
            self._write("tracing/tracing_cpumask", self._cpumask)
            self._did(f"tracing_cpumask {mask} -> {self._cpumask}")

    def _reset_scalar(self, rel: str, clean: str, value: str) -> None:
        now = self._read(rel).strip()
        if now != clean:
            self._write(rel, value)
            self._did(f"{rel} {now} -> {value}")

    def _loaded_modules(self) -> set[str]:
        return {line.split()[0] for line in self._read("proc/modules").splitlines()
                if line.strip()}

    def _unload_modules(self) -> None:
        for name in sorted(self._loaded_modules() - self._modules):
            self._write("kprobefs/modules", f"unload {name}")
            self._did(f"unloaded module {name}")
