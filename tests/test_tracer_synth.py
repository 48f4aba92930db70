"""Synthetic event commands: error_log entries with 6.1's messages and carets (the
cases of ftracetest's trigger-synthetic_event_syntax_errors.tc), and records."""

import errno

import pytest

from tracer_fakes import cat, echo, make_tracer, write_errno


@pytest.fixture
def t():
    return make_tracer()


@pytest.mark.parametrize("command, message", [   # the caret goes where ^ is
    ("myevent ^chr arg", "Invalid type"),
    ("myevent ^unsigned arg", "Incomplete type"),
    ("myevent char ^str]; int v", "Illegal name"),
    ("^mye-vent char str[]", "Illegal name"),
    ("myevent char ^st-r[]", "Illegal name"),
    ("myevent char str;^[]", "Invalid field"),
    ("myevent char str; ^int", "Invalid field"),
    ("myevent char ^str[; int v", "Invalid array specification"),
    ("myevent char ^str[kdjdk]", "Invalid array specification"),
    ("myevent char ^str[257]", "Invalid array specification"),
    ("^mye;vent char str[]", "Command must be of the form: <name> field[;field] ..."),
    ("^myevent ; char str[]", "Command must be of the form: <name> field[;field] ..."),
    ("^myevent; char str[]", "Command must be of the form: <name> field[;field] ..."),
    ("^myevent ;char str[]", "Command must be of the form: <name> field[;field] ..."),
    ("^; char str[]", "Command must be of the form: <name> field[;field] ..."),
    ("^;myevent char str[]", "Command must be of the form: <name> field[;field] ..."),
    ("^myevent", "Command must be of the form: <name> field[;field] ..."),
    ("s:^junk/myevent char str[", None),
])
def test_errors_are_logged_at_synthetic_events(t, command, message):
    caret = command.index("^")
    text = command.replace("^", "")
    path = "synthetic_events"
    if text.startswith("s:"):
        path, caret = "dynamic_events", 0
        message = ("Command must be of the form: s or -:[synthetic/]<name> "
                   "field[;field] ...")
    assert write_errno(t.root, path, text + "\n") == errno.EINVAL
    assert cat(t.root, "error_log").splitlines()[-3:] == [
        f"[ 1234.567891] synthetic_events: error: {message}",
        f"  Command: {text}",
        " " * (len("  Command: ") + caret) + "^"]
    assert cat(t.root, "synthetic_events") == ""


def test_existing_name(t):
    echo(t.root, "synthetic_events", "ev u64 a")
    assert write_errno(t.root, "synthetic_events", "ev u32 b") == errno.EEXIST
    assert cat(t.root, "error_log").splitlines()[-3:] == [
        "[ 1234.567891] synthetic_events: error: Event already exists",
        "  Command: ev u32 b",
        "           ^"]


def test_good_definitions_still_parse(t):
    echo(t.root, "synthetic_events", "a u64 x; char s[16]; unsigned int u; char d[]; long st[]")
    echo(t.root, "dynamic_events", "s:synthetic/b pid_t p")
    assert cat(t.root, "synthetic_events") == (
        "a\tu64 x; char[16] s; unsigned int u; char[] d; long[] st\nb\tpid_t p\n")
    assert cat(t.root, "error_log") == ""


def test_records_render_and_encode_every_field_kind(t):
    echo(t.root, "synthetic_events", "a u64 x; char s[16]; s32 n; char d[]; gfp_t g")
    event = t.tracer.events[("synthetic", "a")]
    args = event.encode([7, b"static", (-3) & (2**64 - 1), b"dynamic", 0x10])
    text = event.render((0, 1, 0, event, 0, 0, args), t.tracer, None)
    assert text == "a: x=7 s=static n=-3 d=dynamic g=10\n"
