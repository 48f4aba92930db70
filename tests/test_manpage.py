"""kprobefs(8) (docs/kprobefs.8) and the examples of ``kprobefs --help``: the page
renders without a warning, has the sections of trace-cmd's and perf's pages, and names
every option and command of the parser (kprobefs/cli.py), so that it cannot go stale
silently; every ``kprobefs ...`` example line, in the page and in each --help, is one
the parser accepts."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kprobefs.cli import EXAMPLES, _parse, build_parser

PAGE = Path(__file__).resolve().parents[1] / "docs" / "kprobefs.8"
SECTIONS = ["NAME", "SYNOPSIS", "DESCRIPTION", "COMMANDS", "OPTIONS", "MODULE TOOLS",
            "EXAMPLES", "EXIT STATUS", "ENVIRONMENT", "FILES", "SEE ALSO"]


def _need(tool: str) -> None:
    if shutil.which(tool) is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{tool} is missing under CI=true")
        pytest.skip(f"{tool} is missing")


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _page_text() -> str:
    """The page's source with troff's escaped hyphens as plain ones."""
    return PAGE.read_text().replace("\\-", "-")


def test_the_page_renders_without_warnings():
    _need("groff")
    done = subprocess.run(["groff", "-man", "-ww", "-z", "-Tutf8", str(PAGE)],
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (0, "")


def test_man_shows_the_page_without_warnings():
    _need("man")
    done = subprocess.run(["man", "--warnings", "-l", str(PAGE)], capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, MANWIDTH="80",
                                                          MANPAGER="cat", PAGER="cat"))
    assert (done.returncode, done.stderr) == (0, "")
    assert "kprobefs exec --kernel-scratch -- ./ftracetest" in done.stdout


def test_the_page_has_the_sections_of_a_tools_man_page_in_order():
    found = re.findall(r'^\.SH "?([A-Z ]+?)"?$', PAGE.read_text(), re.M)
    assert found == SECTIONS
    assert re.search(r"^\.TH KPROBEFS 8 ", PAGE.read_text(), re.M)


def test_the_page_names_every_command_and_option_of_the_parser():
    page = _page_text()
    parser = build_parser()
    options = {s for a in parser._actions for s in a.option_strings}
    for name, command in _commands(parser).items():
        assert f".TP\n.B {name}\n" in page, f"{name} is not under COMMANDS"
        options |= {s for a in command._actions for s in a.option_strings}
    missing = [o for o in sorted(options)
               if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", page)]
    assert not missing


def _example_commands(text: str) -> list[list[str]]:
    """The ``kprobefs ...`` command lines of examples (a comment after two spaces and
    a shell's `cd ... &&` left out)."""
    out = []
    for line in text.splitlines():
        line = line.strip().split("  ", 1)[0]
        line = line.split("&&")[-1].strip() if line.startswith("cd ") else line
        if line.startswith("kprobefs ") and "|" not in line:
            out.append(shlex.split(line)[1:])
    return out


def _page_examples() -> str:
    """The text of the page's EXAMPLES section, troff's escapes undone."""
    text = PAGE.read_text().split(".SH EXAMPLES", 1)[1].split("\n.SH ", 1)[0]
    return text.replace("\\-", "-").replace("\\(aq", "'")


@pytest.mark.parametrize("name", [None, "mount", "umount", "status", "exec"])
def test_each_help_ends_with_examples_the_parser_accepts(name):
    argv = [name, "--help"] if name else ["--help"]
    done = subprocess.run([sys.executable, "-m", "kprobefs", *argv], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0
    assert "\nexamples:\n" in done.stdout and EXAMPLES[name] in done.stdout
    commands = _example_commands(EXAMPLES[name])
    assert commands
    for argv in commands:
        args = _parse(build_parser(), argv)
        assert args.command == (name or args.command), argv


def test_the_pages_examples_are_ones_the_parser_accepts():
    commands = _example_commands(_page_examples())
    assert len(commands) >= 8
    for argv in commands:
        _parse(build_parser(), argv)


def test_every_command_has_examples():
    assert set(EXAMPLES) == {None} | set(_commands(build_parser()))
