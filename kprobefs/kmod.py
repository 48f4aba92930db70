"""``modprobe``, ``insmod``, ``rmmod`` and ``lsmod`` for the emulated kernel: what
``kprobefs exec`` puts in place of the host's kmod inside its namespace
(:mod:`kprobefs.execns`), so that a tool's ``modprobe trace-printk`` loads the emulated
kernel's module, never one of the host's.

One program for the four, chosen by the basename of ``argv[0]`` as kmod does (Debian's
``/usr/sbin/modprobe`` and friends are links to ``/bin/kmod``; the namespace has this
program bound over that file, so every name reaches it).  The messages and exit
statuses are kmod's (version 30, Debian 12's): ``modprobe`` exits 0 when the module is
already loaded, ``rmmod`` refuses a module whose reference count is not zero, and
every failure exits 1.

They act through the mount's debugfs view, which the namespace has at
``/sys/kernel/debug``: ``kprobefs/modules`` takes ``load NAME [PARAM=VALUE...]`` and
``unload NAME`` (a failing command fails its write with init_module's or
delete_module's errno), and ``proc/modules`` lists the loaded modules as Linux's
/proc/modules does (the host's /proc/modules is not always there to be replaced).  The
modules are the ones the daemon loads: the ``.ko`` files bundled in
``kprobefs/kernel/modules``.

This module imports nothing but the standard library: the namespace runs a copy of its
source (:func:`shim_script`), without importing the kprobefs package and its emulator, so
that a ``modprobe`` starts as fast as the interpreter does, and works where the package
is out of sight (``--kernel-scratch`` puts the emulated kernel's /tmp over the host's,
and kprobefs may be installed there).
"""

from __future__ import annotations

import errno
import hashlib
import os
import sys
from pathlib import Path
from typing import NamedTuple, Sequence

__all__ = ["TOOLS", "KMOD", "main", "shim_script", "module_dir"]

#: The names this program answers to, besides KMOD.
TOOLS = ("modprobe", "insmod", "rmmod", "lsmod")
#: kmod's own name: the file Debian's tools link to; `kmod list` is lsmod.
KMOD = "kmod"
#: Where the namespace of ``kprobefs exec`` has the mount's debugfs view.
DEBUGFS = "/sys/kernel/debug"
CONTROL = "kprobefs/modules"
PROC_MODULES = "proc/modules"

_LSMOD_HEADER = "Module                  Size  Used by"


#: In the copy :func:`shim_script` writes, what it took before the namespace was made:
#: the modules' directory and each module's name and SHA-256; None when run from the
#: package.
_SHIM: dict | None = globals().get("_KPROBEFS_SHIM")


def module_dir() -> Path:
    """The directory of the modules the daemon loads (``kprobefs/kernel/modules``; the
    same as :func:`kprobefs.machine.module.default_module_dir`)."""
    if _SHIM is not None:
        return Path(_SHIM["dir"])
    return Path(__file__).resolve().parent / "kernel" / "modules"


def _module_name(name: str) -> str:
    """A module name as the kernel spells it: ``-`` and ``_`` alike, a ``.ko`` file
    name or path standing for its module (machine.module.normalize_module_name)."""
    base = name.rsplit("/", 1)[-1]
    return base.removesuffix(".ko").replace("-", "_")


def _available() -> dict[str, str]:
    """The loadable modules: name -> the SHA-256 of their .ko file."""
    if _SHIM is not None:
        return dict(_SHIM["modules"])
    directory = module_dir()
    if not directory.is_dir():
        return {}
    return {_module_name(p.name): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.glob("*.ko"))}


class _Loaded(NamedTuple):
    """A line of /proc/modules."""
    name: str
    size: int
    refcount: int
    holders: tuple[str, ...]


class _NoMount(Exception):
    """The view of ``kprobefs exec`` is not there: no control file at DEBUGFS."""


class _Kernel:
    """The emulated kernel's modules, through the mount's debugfs view at ``root``."""

    def __init__(self, root: str = DEBUGFS):
        self.root = root
        if not os.path.exists(os.path.join(root, CONTROL)):
            raise _NoMount(f"no kprobefs mount at {root} (these tools work inside "
                           f"`kprobefs exec`)")

    def command(self, *words: str) -> int:
        """Writes one command to the control file; returns 0, or the errno of the
        failed write."""
        try:
            with open(os.path.join(self.root, CONTROL), "wb", buffering=0) as f:
                f.write((" ".join(words) + "\n").encode())
        except OSError as e:
            return e.errno or errno.EIO
        return 0

    def loaded(self) -> list[_Loaded]:
        """The loaded modules, newest first (/proc/modules' order)."""
        with open(os.path.join(self.root, PROC_MODULES)) as f:
            lines = [line.split() for line in f]
        return [_Loaded(w[0], int(w[1]), int(w[2]),
                        tuple(h for h in w[3].split(",") if h and h not in ("-", "[permanent]")))
                for w in lines if len(w) >= 4]

    def get(self, name: str) -> _Loaded | None:
        return next((m for m in self.loaded() if m.name == name), None)


# ==== the command lines =======================================================================
class _Options(NamedTuple):
    flags: frozenset[str]
    words: list[str]


def _parse(argv: Sequence[str], short: dict[str, str], long: dict[str, str],
           takes_value: frozenset[str] = frozenset()) -> _Options | str:
    """Options (by their long name) and the other words, as getopt does it (options
    stop at the first word for modprobe's parameters to follow); or an error text."""
    flags, words = set(), []
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--":
            words += args
            break
        if arg.startswith("--"):
            name = long.get(arg[2:].split("=", 1)[0])
            if name is None:
                return f"unrecognized option '{arg}'"
            if name in takes_value and "=" not in arg:
                if not args:
                    return f"option '{arg}' requires an argument"
                args.pop(0)
            flags.add(name)
        elif arg.startswith("-") and arg != "-":
            for i, letter in enumerate(arg[1:]):
                if letter not in short:
                    return f"invalid option -- '{letter}'"
                flags.add(short[letter])
                if short[letter] in takes_value:
                    if i + 2 == len(arg) and args:
                        args.pop(0)
                    break
        else:
            words.append(arg)
            words += args       # getopt with a leading '+': the rest are not options
            break
    return _Options(frozenset(flags), words)


def _say(tool: str, level: str, text: str) -> None:
    print(f"{tool}: {level}: {text}", file=sys.stderr)


_USAGE = {
    "modprobe": "modprobe [options] [-i] [-b] modulename [module parameters...]\n"
                "\tmodprobe [options] -a [-i] [-b] modulename [modulename...]\n"
                "\tmodprobe [options] -r [-i] modulename [modulename...]",
    "insmod": "insmod [options] filename [args]",
    "rmmod": "rmmod [options] modulename ...",
    "lsmod": "lsmod",
}


def _help(tool: str) -> int:
    print(f"Usage:\n\t{_USAGE[tool]}\n\nThe emulated kernel's {tool}, from kprobefs: it "
          f"acts on the modules of the kernel served at {DEBUGFS}.\nOptions are kmod's; "
          "those that concern files the emulated kernel has no counterpart of are "
          "accepted and have no effect.")
    return 0


def _version(tool: str) -> int:
    print(f"{tool} from kprobefs (kmod 30's command line), for the emulated kernel's "
          "modules")
    return 0


def _command_line(tool: str, argv: Sequence[str], short: dict[str, str],
                  long: dict[str, str], missing: str,
                  takes_value: frozenset[str] = frozenset()) -> _Options | int:
    """The options and words of a tool's command line; or, when there is nothing more
    to do, the exit status: after --help or --version, or kmod's error for a bad
    option or for no word (``missing``: what kmod says is missing)."""
    opts = _parse(argv, short, long, takes_value)
    if isinstance(opts, str):
        print(f"{tool}: {opts}", file=sys.stderr)
        _say(tool, "ERROR", "unexpected getopt_long() value '?'.")
        return 1
    if "help" in opts.flags:
        return _help(tool)
    if "version" in opts.flags:
        return _version(tool)
    if not opts.words:
        _say(tool, "ERROR", f"missing {missing}")
        return 1
    return opts


# ---- modprobe -------------------------------------------------------------------------------
_MODPROBE_SHORT = {"a": "all", "r": "remove", "n": "dry-run", "q": "quiet", "v": "verbose",
                   "V": "version", "h": "help", "f": "force", "i": "ignore-install",
                   "b": "use-blacklist", "s": "syslog", "D": "show-depends",
                   "C": "config", "d": "dirname", "S": "set-version", "o": "name"}
_MODPROBE_LONG = {**{v: v for v in _MODPROBE_SHORT.values()},
                  "first-time": "first-time", "show": "dry-run", "remove-holders":
                  "remove-holders", "force-vermagic": "force-vermagic",
                  "force-modversion": "force-modversion", "ignore-remove": "ignore-remove"}
_MODPROBE_VALUES = frozenset({"config", "dirname", "set-version", "name"})


def _modprobe(argv: Sequence[str]) -> int:
    tool = "modprobe"
    opts = _command_line(tool, argv, _MODPROBE_SHORT, _MODPROBE_LONG,
                         "parameters. See -h.", _MODPROBE_VALUES)
    if isinstance(opts, int):
        return opts
    flags = opts.flags
    if "remove" in flags or "all" in flags:
        names, params = opts.words, []
    else:
        names, params = opts.words[:1], opts.words[1:]
    kernel = _kernel(tool)
    if kernel is None:
        return 1
    available = _available()
    status = 0
    for word in names:
        name = _module_name(word)
        if "remove" in flags:
            status |= _modprobe_remove(kernel, word, name, name in available, flags)
        else:
            status |= _modprobe_insert(kernel, word, name, available.get(name), params,
                                       flags)
    return status


def _modprobe_insert(kernel: _Kernel, word: str, name: str, path: Path | None,
                     params: list[str], flags: frozenset[str]) -> int:
    tool = "modprobe"
    if path is None:
        if "quiet" not in flags:
            _say(tool, "FATAL", f"Module {word} not found in directory {module_dir()}")
        return 1
    loaded = kernel.get(name) is not None
    if loaded and "first-time" not in flags:
        return 0
    if "verbose" in flags:
        print(" ".join(["insmod", str(path), *params]))
    if "dry-run" in flags:
        return 0
    err = errno.EEXIST if loaded else kernel.command("load", name, *params)
    if err == 0 or (err == errno.EEXIST and "first-time" not in flags):
        return 0
    reason = {errno.EEXIST: "Module already in kernel",
              errno.ENOENT: "Unknown symbol in module, or unknown parameter (see dmesg)"
              }.get(err, os.strerror(err))
    _say(tool, "ERROR", f"could not insert '{name}': {reason}")
    return 1


def _modprobe_remove(kernel: _Kernel, word: str, name: str, known: bool,
                     flags: frozenset[str]) -> int:
    tool = "modprobe"
    loaded = kernel.get(name)
    if loaded is None:
        if "quiet" not in flags:
            if not known:
                _say(tool, "FATAL", f"Module {word} not found.")
            elif "first-time" in flags:
                _say(tool, "ERROR", f"could not remove '{name}': Module {name} is not "
                                    "in kernel.")
            else:
                _say(tool, "FATAL", f"Module {name} is not in kernel.")
        return 1
    if loaded.refcount > 0 or loaded.holders:
        _say(tool, "FATAL", f"Module {name} is in use.")
        return 1
    if "verbose" in flags:
        print(f"rmmod {name}")
    if "dry-run" in flags:
        return 0
    err = kernel.command("unload", name)
    if err == 0:
        return 0
    if err == errno.EWOULDBLOCK:
        _say(tool, "FATAL", f"Module {name} is in use.")
    elif err == errno.ENOENT:
        _say(tool, "FATAL", f"Module {name} is not in kernel.")
    else:
        _say(tool, "ERROR", f"could not remove '{name}': {os.strerror(err)}")
    return 1


# ---- insmod ---------------------------------------------------------------------------------
_INSMOD_SHORT = {"f": "force", "s": "syslog", "v": "verbose", "V": "version", "h": "help",
                 "p": "print-default"}
_INSMOD_LONG = {v: v for v in _INSMOD_SHORT.values()}


def _insmod(argv: Sequence[str]) -> int:
    tool = "insmod"
    opts = _command_line(tool, argv, _INSMOD_SHORT, _INSMOD_LONG, "filename.")
    if isinstance(opts, int):
        return opts
    filename, params = opts.words[0], opts.words[1:]
    try:
        with open(filename, "rb") as f:
            data = f.read()
    except OSError as e:
        _say(tool, "ERROR", f"could not load module {filename}: {e.strerror}")
        return 1
    kernel = _kernel(tool)
    if kernel is None:
        return 1
    # The emulated kernel loads only its own modules: a file that is not one of them
    # (a host module, a module built elsewhere) is refused as Linux refuses a module
    # built for another kernel.
    name = _module_name(filename)
    if _available().get(name) != hashlib.sha256(data).hexdigest():
        err = errno.ENOEXEC
    else:
        err = kernel.command("load", name, *params)
    if err == 0:
        return 0
    reason = {errno.ENOEXEC: "Invalid module format",
              errno.ENOENT: "Unknown symbol in module",
              errno.ESRCH: "Unknown symbol in module"}.get(err, os.strerror(err))
    _say(tool, "ERROR", f"could not insert module {filename}: {reason}")
    return 1


# ---- rmmod ----------------------------------------------------------------------------------
_RMMOD_SHORT = {"f": "force", "s": "syslog", "v": "verbose", "V": "version", "h": "help",
                "w": "wait"}
_RMMOD_LONG = {v: v for v in _RMMOD_SHORT.values()}


def _rmmod(argv: Sequence[str]) -> int:
    tool = "rmmod"
    opts = _command_line(tool, argv, _RMMOD_SHORT, _RMMOD_LONG, "module name.")
    if isinstance(opts, int):
        return opts
    kernel = _kernel(tool)
    if kernel is None:
        return 1
    status = 0
    for word in opts.words:
        name = _module_name(word)
        loaded = kernel.get(name)
        if loaded is None:
            _say(tool, "ERROR", f"Module {name} is not currently loaded")
        elif loaded.holders:
            _say(tool, "ERROR", f"Module {name} is in use by: {' '.join(loaded.holders)}")
        elif loaded.refcount > 0:
            _say(tool, "ERROR", f"Module {name} is in use")
        else:
            err = kernel.command("unload", name)
            if err == 0:
                continue
            if err == errno.EWOULDBLOCK:
                _say(tool, "ERROR", f"Module {name} is in use")
            else:
                _say(tool, "ERROR", f"could not remove module {name}: {os.strerror(err)}")
        status = 1
    return status


# ---- lsmod ----------------------------------------------------------------------------------
def _lsmod(argv: Sequence[str], tool: str = "lsmod") -> int:
    if argv:
        print(f"Usage: {tool}", file=sys.stderr)
        return 1
    kernel = _kernel(tool)
    if kernel is None:
        return 1
    lines = [_LSMOD_HEADER]
    for m in kernel.loaded():
        line = f"{m.name:<19} {m.size:>8}  {m.refcount}"
        lines.append(line + (" " + ",".join(m.holders) if m.holders else ""))
    print("\n".join(lines))
    return 0


def _kmod(argv: Sequence[str]) -> int:
    """``kmod list`` is lsmod; kmod's other commands concern the host's files."""
    if argv[:1] == ["list"]:
        return _lsmod(argv[1:], "kmod list")
    if argv[:1] in (["-V"], ["--version"]):
        return _version(KMOD)
    print(f"{KMOD}: in kprobefs exec only `kmod list` and the modprobe, insmod, rmmod "
          "and lsmod names are the emulated kernel's", file=sys.stderr)
    return 1


def _kernel(tool: str) -> _Kernel | None:
    try:
        return _Kernel()
    except _NoMount as e:
        _say(tool, "FATAL", str(e))
        return None


_COMMANDS = {"modprobe": _modprobe, "insmod": _insmod, "rmmod": _rmmod, "lsmod": _lsmod,
             KMOD: _kmod}


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the tool named by ``argv[0]``'s basename on argv[1:]; returns its exit
    status.  A name of kmod's this program does not provide (modinfo, depmod) fails
    rather than reach the host's files."""
    argv = list(sys.argv if argv is None else argv)
    tool = os.path.basename(argv[0]) if argv else ""
    command = _COMMANDS.get(tool)
    if command is None:
        provided = ", ".join(TOOLS)
        print(f"{tool or KMOD}: not available in kprobefs exec, whose {provided} act on "
              "the emulated kernel's modules", file=sys.stderr)
        return 1
    try:
        return command(argv[1:])
    except OSError as e:
        _say(tool, "ERROR", f"{e.filename or DEBUGFS}: {e.strerror}")
        return 1


def shim_script(python: str) -> str:
    """The text of the executable that ``kprobefs exec`` binds over the host's kmod: this
    module's source, for the interpreter ``python`` (the one running kprobefs, whose
    standard library is all it needs; by its real path, since a virtual environment's
    may lie where the namespace hides it), with the modules' directory and digests
    taken now.  It runs in isolated mode (no PYTHON* variables) and without the site
    module, whose start-up (site-packages, .pth files) would cost several times the
    rest (ftracetest's direct cases run modprobe and rmmod dozens of times)."""
    shim = {"dir": str(module_dir()), "modules": _available()}
    source = Path(__file__).read_text()
    future = "from __future__ import annotations\n"
    return (f"#!{os.path.realpath(python)} -IS\n{future}"
            f"_KPROBEFS_SHIM = {shim!r}\n" + source.replace(future, "", 1))


if __name__ == "__main__":
    sys.exit(main())
