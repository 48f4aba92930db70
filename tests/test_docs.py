"""The shell examples of README.md and docs/*.md, run against a real mount, so that the
docs cannot go stale silently.

The convention (docs/testing.md says the same to writers of the docs):

- A fenced block whose info string is ``console`` is run.  Blocks of other kinds
  (``sh``, ``text``) are shown, never run: they are for what a test cannot do
  (installing, systemctl, commands that take minutes).
- A ``python`` block is run too, on its own, by the Python running the tests: it must
  not raise (its ``assert`` statements are its expected output).
- In a ``console`` block a line that starts with ``$ `` is a command.  A command line
  that ends in ``\\`` goes on to the next line.
- The lines after a command, up to the next ``$ `` line or the end of the block, are what
  the command prints, its standard output and standard error together, in order.
- In an expected line, ``...`` matches any text (none too), as doctest's ELLIPSIS does;
  a line that is only ``...`` matches any number of lines, none too.  A run of blanks
  matches any run of blanks (doctest's NORMALIZE_WHITESPACE, within a line: columns
  widen with a pid's digits).  Trailing blanks and blank lines at the end of an output
  do not count.
- Each page runs on its own fresh mount, made with ``kprobefs mount`` (the command the
  README documents) before the page's first block.  All the blocks of a page run in
  order in one ``sh``, so a ``cd`` carries on to the next block.  ``/run/kprobefs`` in a
  block stands for that mount, and so does a ``kprobefs`` command given no mount point;
  ``kprobefs`` is on ``PATH``.  The shell starts in an empty scratch directory, which
  is also ``$HOME``, with ``LC_ALL=C``.

A changed output fails the page with the command, where it is, and a diff.  Pages
without ``console`` blocks are not collected.  The matcher's own tests need no mount;
the pages' tests skip where FUSE is missing, never under CI=true.
"""

from __future__ import annotations

import difflib
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import kprobefs
from robust_mount import need_fuse

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: The mount point the docs write; each page's run replaces it with its own.
DOC_MOUNTPOINT = "/run/kprobefs"
PAGE_TIMEOUT = 120.0
#: The daemons and wrappers run the kprobefs these tests import.
PACKAGE_PARENT = str(Path(kprobefs.__file__).resolve().parents[1])
_MARK = "\x1e"


# ---- reading the pages -------------------------------------------------------------------
@dataclass(frozen=True)
class Example:
    """One command of a console block and the output the page says it prints."""

    page: str
    line: int           # 1-based line of the command's first line in the page
    command: str
    expected: tuple[str, ...]


_FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)")


def _fenced_blocks(text: str):
    """Yields (info, first body line's number, body lines) of each fenced block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith(m.group(1)):
            j += 1
        yield m.group(2), i + 2, lines[i + 1:j]
        i = j + 1


def iter_examples(text: str, page: str = "<page>"):
    """Yields the Examples of the console blocks of a Markdown text, in order."""
    for info, first, body in _fenced_blocks(text):
        if info == "console":
            yield from _block_examples(body, first, page)


def iter_python_blocks(text: str):
    """Yields (line, source) of each python block of a Markdown text."""
    for info, first, body in _fenced_blocks(text):
        if info == "python":
            yield first, "\n".join(body) + "\n"


def _block_examples(body: list[str], first_line: int, page: str):
    i = 0
    while i < len(body):
        if not body[i].startswith("$ "):
            raise ValueError(f"{page}:{first_line + i}: a console block's first line must "
                             f"be a command ('$ '): {body[i]!r}")
        start = i
        command = [body[i][2:]]
        while command[-1].endswith("\\") and i + 1 < len(body):
            i += 1
            command.append(body[i])
        i += 1
        expected = []
        while i < len(body) and not body[i].startswith("$ "):
            expected.append(body[i])
            i += 1
        yield Example(page, first_line + start, "\n".join(command), tuple(expected))


# ---- matching ----------------------------------------------------------------------------
def _literal(text: str) -> str:
    """A regular expression for text in which a run of blanks matches any such run."""
    return "".join(r"[ \t]+" if part.isspace() else re.escape(part)
                   for part in re.split(r"([ \t]+)", text) if part)


def _line_pattern(expected: str) -> re.Pattern:
    return re.compile(".*".join(_literal(part) for part in expected.split("...")),
                      re.DOTALL)


def _trim(lines) -> list[str]:
    out = [line.rstrip() for line in lines]
    while out and not out[-1]:
        out.pop()
    return out


def output_matches(expected, actual) -> bool:
    """Whether the actual lines are what the expected lines say (``...`` inside a line:
    any text; a line that is only ``...``: any number of lines)."""
    want, got = _trim(expected), _trim(actual)
    # can[i][j]: want[i:] matches got[j:].
    can = [[False] * (len(got) + 1) for _ in range(len(want) + 1)]
    can[len(want)][len(got)] = True
    for i in range(len(want) - 1, -1, -1):
        if want[i].strip() == "...":
            for j in range(len(got), -1, -1):
                can[i][j] = can[i + 1][j] or (j < len(got) and can[i][j + 1])
            continue
        pattern = _line_pattern(want[i])
        for j in range(len(got) - 1, -1, -1):
            can[i][j] = can[i + 1][j + 1] and pattern.fullmatch(got[j]) is not None
    return can[0][0]


# ---- running a page ----------------------------------------------------------------------
def _script(examples, workdir: Path, mountpoint: str) -> str:
    parts = ["exec 2>&1", f"cd '{workdir}'"]
    for n, example in enumerate(examples):
        parts.append(f"printf '{_MARK}%d\\n' {n}")
        parts.append(example.command.replace(DOC_MOUNTPOINT, mountpoint))
    parts.append(f"printf '{_MARK}%d\\n' {len(examples)}")
    return "\n".join(parts) + "\n"


def split_outputs(stdout: str, count: int) -> list[list[str]]:
    """The output of each of count commands, from the marked stdout of a page's run."""
    pieces = re.split(_MARK + r"(\d+)\n", stdout)
    outputs: dict[int, str] = {}
    for k in range(1, len(pieces) - 1, 2):
        outputs[int(pieces[k])] = pieces[k + 1]
    result = []
    for n in range(count):
        text = outputs.get(n)
        result.append(None if text is None else text.splitlines())
    return result


def _wrapper(bindir: Path, mountpoint: str) -> None:
    """bin/kprobefs: the CLI of the tree under test, whose default mount point is the
    page's mount."""
    path = bindir / "kprobefs"
    path.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import sys
        sys.path.insert(0, {PACKAGE_PARENT!r})
        from kprobefs import cli
        assert hasattr(cli, "DEFAULT_MOUNTPOINT"), "the CLI's default mount point moved"
        cli.DEFAULT_MOUNTPOINT = {mountpoint!r}
        sys.exit(cli.main())
        """))
    path.chmod(0o755)


def _env(bindir: Path, home: Path) -> dict:
    env = dict(os.environ)
    env["HOME"] = str(home)
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = PACKAGE_PARENT + os.pathsep + env.get("PYTHONPATH", "")
    env["LC_ALL"] = "C"
    env.pop("NOTIFY_SOCKET", None)
    return env


class PageMount:
    """A fresh mount for one page, made and taken down with the documented commands."""

    def __init__(self):
        # Not under /tmp, which `kprobefs exec --kernel-scratch` replaces.
        self.path = tempfile.mkdtemp(prefix="kprobefs-docs-", dir="/run")
        self.scratch = Path(tempfile.mkdtemp(prefix="kprobefs-docs-"))
        self.bindir = self.scratch / "bin"
        self.bindir.mkdir()
        self.workdir = self.scratch / "work"
        self.workdir.mkdir()
        _wrapper(self.bindir, self.path)
        self.env = _env(self.bindir, self.workdir)

    def run(self, *argv: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bindir / "kprobefs"), *argv], env=self.env,
                              capture_output=True, text=True, timeout=timeout, cwd="/")

    def __enter__(self) -> "PageMount":
        done = self.run("mount", self.path)
        if done.returncode != 0:
            self.__exit__()
            pytest.fail(f"kprobefs mount failed: {done.stderr}")
        return self

    def _mounts(self) -> list[str]:
        """The mount and those a page made beside it (``/run/kprobefs-4cpus``)."""
        with open("/proc/mounts") as f:
            return [line.split()[1] for line in f
                    if line.split()[1].startswith(self.path)]

    def _daemons(self) -> list[int]:
        """The daemons this page's kprobefs commands started (their command line names
        the page's mount point, which no one else uses)."""
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                # comm first: reading the command line of a process stuck in a FUSE
                # request may wait as long as it does.
                with open(f"/proc/{entry}/comm", "rb") as f:
                    if f.read().strip() != b"kprobefs":
                        continue
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if b"mount" in argv and any(a.startswith(self.path.encode()) for a in argv):
                pids.append(int(entry))
        return pids

    def __exit__(self, *exc) -> None:
        for path in self._mounts():
            self.run("umount", path)
        # A daemon exits when its FUSE connection ends, which a mount namespace still
        # holding a copy of the mount delays; SIGTERM makes it abort the connection.
        for sig, wait in ((None, 2.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            pids = self._daemons()
            if not pids:
                break
            for pid in pids:
                if sig is not None:
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
            deadline = time.monotonic() + wait
            while self._daemons() and time.monotonic() < deadline:
                time.sleep(0.1)
        from kprobefs.daemon import unmount
        for path in self._mounts():
            unmount(path, lazy=True)
        for path in glob.glob(self.path + "*"):
            try:
                os.rmdir(path)
            except OSError:
                pass
        shutil.rmtree(self.scratch, ignore_errors=True)


def run_page(examples, mount: PageMount) -> list[list[str] | None]:
    """The output of each example, None for those that did not run.  The output goes to
    a file, not a pipe: a daemon the page starts, or a command stuck in the mount, may
    keep a copy of it open after the shell is gone."""
    script = _script(examples, mount.workdir, mount.path)
    out_path = mount.scratch / "output"
    with open(out_path, "w") as out:
        proc = subprocess.Popen(["sh", "-c", script], env=mount.env, cwd=mount.workdir,
                                stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        proc.wait(timeout=PAGE_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return split_outputs(out_path.read_text(errors="replace"), len(examples))


def _shown(expected, actual) -> list[str]:
    """The expected lines for a diff: one that matches the actual line beside it is
    shown as that line, so that the diff shows only what differs."""
    want, got = _trim(expected), _trim(actual)
    return [got[k] if k < len(got) and line.strip() != "..." and
            _line_pattern(line).fullmatch(got[k]) else line
            for k, line in enumerate(want)]


def check_outputs(examples, outputs, mountpoint: str) -> list[str]:
    """A report of every example whose output is not what its page says."""
    failures = []
    for example, actual in zip(examples, outputs):
        expected = [line.replace(DOC_MOUNTPOINT, mountpoint) for line in example.expected]
        where = f"{example.page}:{example.line}: $ {example.command}"
        if actual is None:
            failures.append(f"{where}\n  did not run (the page's shell ended or timed out "
                            f"before it)")
            continue
        if not output_matches(expected, actual):
            diff = "\n".join(difflib.unified_diff(_shown(expected, actual), _trim(actual),
                                                  "the page", "the run", lineterm=""))
            failures.append(f"{where}\n{diff}")
    return failures


# ---- the tests ---------------------------------------------------------------------------
def _pages_with_examples():
    out = []
    for page in PAGES:
        if page.exists():
            examples = list(iter_examples(page.read_text(), str(page.relative_to(ROOT))))
            if examples:
                out.append(pytest.param(page, examples, id=str(page.relative_to(ROOT))))
    return out


#: The tools the examples run under `kprobefs exec`, and their Debian packages (installed
#: by ./install.sh --test).
TOOLS = {"trace-cmd": "trace-cmd", "perf": "linux-perf", "kprobe-perf": "perf-tools-unstable"}


def need_tools(examples) -> None:
    """Skips (fails under CI=true) when a tool an example runs is missing."""
    for tool, package in TOOLS.items():
        pattern = re.compile(rf"(^|[\s;&|(]){re.escape(tool)}\s")
        if any(pattern.search(e.command) for e in examples) and not shutil.which(tool):
            reason = f"{tool} is missing (apt-get install {package})"
            if os.environ.get("CI") == "true":
                pytest.fail(f"cannot run under CI=true: {reason}")
            pytest.skip(reason)


@pytest.mark.fuse
@pytest.mark.parametrize("page, examples", _pages_with_examples())
def test_the_pages_examples_print_what_the_page_says(page, examples):
    need_fuse()
    need_tools(examples)
    with PageMount() as mount:
        outputs = run_page(examples, mount)
    failures = check_outputs(examples, outputs, mount.path)
    assert not failures, f"{len(failures)} example(s) of {page.name} changed:\n\n" + \
        "\n\n".join(failures)


def _python_blocks():
    out = []
    for page in PAGES:
        if page.exists():
            for line, source in iter_python_blocks(page.read_text()):
                name = f"{page.relative_to(ROOT)}:{line}"
                out.append(pytest.param(source, id=name))
    return out


@pytest.mark.parametrize("source", _python_blocks())
def test_the_pages_python_runs(source, tmp_path):
    done = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True,
                          timeout=PAGE_TIMEOUT, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=PACKAGE_PARENT + os.pathsep +
                                   os.environ.get("PYTHONPATH", "")))
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_readme_and_every_page_read_as_examples():
    """Every console block parses, and the README has examples to run."""
    readme = list(iter_examples((ROOT / "README.md").read_text(), "README.md"))
    assert readme
    for page in PAGES[1:]:
        list(iter_examples(page.read_text(), page.name))


_LINK = re.compile(r"\]\(([^)\s]*)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(line.lstrip("#")) for line in page.read_text().splitlines()
            if line.startswith("#") and not line.startswith("#!")}


def test_every_link_between_the_pages_leads_somewhere():
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
        for target in _LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


# ---- the matcher, with no mount ----------------------------------------------------------
PAGE = """\
Some text.

```console
$ cd /run/kprobefs/tracing
$ echo 'p:myprobe vfs_read' > kprobe_events
$ cat kprobe_events
p:kprobes/myprobe vfs_read
$ printf 'a\\n' \\
    'b'
a
...
```

```sh
$ not run
```
"""


def test_console_blocks_are_read_and_other_blocks_are_not():
    examples = list(iter_examples(PAGE, "p.md"))
    assert [(e.line, e.command, e.expected) for e in examples] == [
        (4, "cd /run/kprobefs/tracing", ()),
        (5, "echo 'p:myprobe vfs_read' > kprobe_events", ()),
        (6, "cat kprobe_events", ("p:kprobes/myprobe vfs_read",)),
        (8, "printf 'a\\n' \\\n    'b'", ("a", "...")),
    ]


def test_a_block_must_start_with_a_command():
    with pytest.raises(ValueError, match="p.md:2"):
        list(iter_examples("```console\noutput\n```\n", "p.md"))


TRACE = [
    "# tracer: nop",
    "#",
    "             cat-6237    [000] .....     2.076957: myprobe: (vfs_read+0x0/0x98) "
    "count=131072",
]


@pytest.mark.parametrize("expected", [
    TRACE,
    ["# tracer: nop", "...", "             cat-...    [...] .....  ...: myprobe: "
                             "(vfs_read+0x0/0x98) count=131072"],
    ["..."],
    ["...", "#", "..."],
    TRACE + ["", ""],
    [line + "  " for line in TRACE],
    ["...", " cat-6237 [000] ..... 2.076957: myprobe: (vfs_read+0x0/0x98)\tcount=131072"],
])
def test_the_expected_lines_match(expected):
    assert output_matches(expected, TRACE)


@pytest.mark.parametrize("expected", [
    TRACE[:2] + [TRACE[2].replace("count=131072", "count=4096")],     # a changed line
    TRACE[:2],                                                         # a missing line
    TRACE + ["one more"],
    ["# tracer: function", "..."],
    ["...", "cat-...", "..."],              # `...` inside a line does not cover the start
    ["...", "             cat-6237[000] ..."],  # a blank is not nothing
    [],
])
def test_a_changed_output_fails(expected):
    assert not output_matches(expected, TRACE)


def test_the_outputs_are_split_by_command():
    stdout = f"{_MARK}0\none\ntwo\n{_MARK}1\nno newline{_MARK}2\n{_MARK}3\n"
    assert split_outputs(stdout, 5) == [["one", "two"], ["no newline"], [], [], None]


def test_a_missing_tool_is_found_in_the_commands(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    example = Example("p.md", 1, "kprobefs exec -- trace-cmd list -e", ())
    with pytest.raises(pytest.skip.Exception, match="apt-get install trace-cmd"):
        need_tools([example])
    need_tools([Example("p.md", 1, "echo perfect > trace", ())])


def test_a_changed_example_is_reported_with_its_place():
    example = Example("p.md", 7, "cat /run/kprobefs/tracing/kprobe_events",
                      ("p:kprobes/myprobe vfs_read",))
    assert check_outputs([example], [["p:kprobes/myprobe vfs_read"]], "/run/x") == []
    [report] = check_outputs([example], [["p:kprobes/other vfs_read"]], "/run/x")
    assert report.startswith("p.md:7: $ cat /run/kprobefs/tracing/kprobe_events\n")
    assert "-p:kprobes/myprobe vfs_read\n+p:kprobes/other vfs_read" in report
    [report] = check_outputs([example], [None], "/run/x")
    assert "did not run" in report
