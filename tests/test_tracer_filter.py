"""Event filters: accepted and rejected expressions, the file text after an error,
error_log entries, group filters, and filtering on the hit path."""

import errno
import random
import struct

import pytest

from kprobefs.tracing.triggers.filter import (
    FilterField, FilterParseError, _check, _lark, compile_filter, filter_fields,
)
from tracer_fakes import KDATA, VFS_READ, cat, echo, make_tracer, write_errno

FIELDS = filter_fields([])
FIELDS.update({
    "x": FilterField("x", "num", 8, 8, False),
    "n": FilterField("n", "num", 16, 4, True),
    "s": FilterField("s", "str", 20, 4, True),
})
RECORD = struct.pack("<HBBiQiI", 1, 0, 0, 42, 5, -3, (4 << 16) | 24) + b"abc\0"


def match(text, cpu=1, comm="bash"):
    return compile_filter(text, FIELDS).match(RECORD, cpu, lambda: comm)


@pytest.mark.parametrize("text, expected", [
    ("x == 5", True), ("x != 5", False), ("x < 6", True), ("x <= 4", False),
    ("x > 4", True), ("x >= 6", False), ("x & 4", True), ("x & 2", False),
    ("x == 0x5", True), ("x == 05", True),
    ("n == -3", True), ("n < 0", True), ("n > -4", True),
    ('s == "abc"', True), ('s != "abc"', False), ('s ~ "a*"', True), ('s ~ "*c"', True),
    ('s ~ "?b?"', True), ("s == 'abc'", True), ('s ~ "b*"', False),
    ("common_pid == 42", True), ('comm == "bash"', True), ('COMM ~ "ba*"', True),
    ("cpu == 1", True), ("CPU != 1", False), ("common_cpu >= 1", True),
    ("x == 5 && n == -3", True), ("x == 5 && n == 3", False), ("x == 1 || n == -3", True),
    ("!x == 5", False), ("!(x == 1 || n == 3)", True), ("x == 1 || x == 5 && n == -3", True),
    ("(x == 1 || x == 5) && n == -3", True), ("!!(x == 5)", True),
    ("  x==5&&n==-3", True), ("((x == 5))", True),
])
def test_accepted(text, expected):
    assert match(text) is expected


@pytest.mark.parametrize("text, err, message, pos", [
    ("x == 5 &&", errno.EINVAL, "Meaningless filter expression", 9),
    ("(x == 5", errno.ENOENT, "Too many '('", 0),
    ("x == 5)", errno.EPERM, "Too few '('", 6),
    ('s == "abc', errno.ESRCH, "Missing matching quote", 5),
    ("nofield == 1", errno.EINVAL, "Field not found", 8),
    ("x = 1", errno.EINVAL, "Invalid operator", 3),
    ('x == "a"', errno.EINVAL, "Expecting numeric field", 6),
    ("s == 1", errno.EINVAL, "Expecting string field", 6),
    ("x ~ 1", errno.EINVAL, "Illegal operation for field type", 5),
    ('s < "a"', errno.EINVAL, "Illegal operation for field type", 5),
    ("x == 1x", errno.EINVAL, "Illegal integer value", 6),
    ("x == -1", errno.EINVAL, "Illegal integer value", 6),
    ("x == abc", errno.EINVAL, "Invalid value (did you forget quotes)?", 6),
    ("x == 5 y", errno.EPERM, "Too many terms in predicate expression", 7),
    ("x == 5 & n == 1", errno.EPERM, "Too many terms in predicate expression", 7),
    ("!", errno.EINVAL, "No filter found", 1),
    ("x == 123456789012345678901234", errno.EINVAL, "Operand too long", 30),
    ('s == "' + "a" * 300 + '"', errno.EINVAL, "Operand too long", 307),
])
def test_rejected(text, err, message, pos):
    with pytest.raises(FilterParseError) as info:
        compile_filter(text, FIELDS)
    assert (info.value.errno, info.value.message, info.value.pos) == (err, message, pos)


@pytest.mark.parametrize("text, err", [("()", errno.EINVAL), ("== 1", errno.EPERM),
                                        ("x == 1 && && x == 2", errno.EPERM)])
def test_rejected_without_message(text, err):
    with pytest.raises(FilterParseError) as info:
        compile_filter(text, FIELDS)
    assert info.value.errno == err and info.value.code == 0
    assert info.value.file_text(text) == f"{text}\nError: (0)\n"


def test_walk_and_grammar_agree_on_random_text():
    rng = random.Random(1)
    atoms = ["x", "n", "s", "==", "!=", "<", ">=", "&", "~", "&&", "||", "!", "(", ")",
             "5", "-3", '"a*"', "'b'", " ", "cpu", "comm", "1x", "0x10"]
    for _ in range(3000):
        text = "".join(rng.choice(atoms) for _ in range(rng.randint(1, 9)))
        try:
            _check(text, FIELDS)
        except Exception:
            continue
        _lark().parse(text)             # whatever the kernel's walk accepts parses


def test_filter_file_and_error_log():
    t = make_tracer()
    echo(t.root, "kprobe_events", "p:ev vfs_read arg=%di name=+0(%si):string")
    assert cat(t.root, "events/kprobes/ev/filter") == "none\n"
    echo(t.root, "events/kprobes/ev/filter", "arg == 1 && name ~ \"he*\"\n")
    assert cat(t.root, "events/kprobes/ev/filter") == 'arg == 1 && name ~ "he*"\n'
    assert write_errno(t.root, "events/kprobes/ev/filter", "arg == 1 && nope == 2\n") == (
        errno.EINVAL)
    assert cat(t.root, "events/kprobes/ev/filter") == (
        "arg == 1 && nope == 2\n"
        "                 ^\n"
        "parse_error: Field not found\n\n")
    assert cat(t.root, "error_log") == (
        "[ 1234.567891] event filter parse error: error: Field not found\n"
        "  Command: arg == 1 && nope == 2\n"
        "                            ^\n")
    echo(t.root, "events/kprobes/ev/filter", "0")
    assert cat(t.root, "events/kprobes/ev/filter") == "none\n"
    assert write_errno(t.root, "events/kprobes/ev/filter", "x" * 4096) == errno.EINVAL


def test_filter_discards_records_but_counts_hits():
    t = make_tracer()
    echo(t.root, "kprobe_events", "p:ev vfs_read arg=%di name=+0(%si):string")
    echo(t.root, "events/kprobes/ev/enable", "1")
    echo(t.root, "events/kprobes/ev/filter", 'arg > 1 && name == "hello" && common_pid == 100')
    t.engine.hit(VFS_READ, di=1, si=KDATA + 0x80)
    t.engine.hit(VFS_READ, di=2, si=KDATA + 0x80)
    t.engine.hit(VFS_READ, di=3, si=KDATA)
    text = cat(t.root, "trace")
    assert "1/1" in text and text.endswith('arg=0x2 name="hello"\n')
    assert cat(t.root, "kprobe_profile").split() == ["ev", "3", "0"]
    # a rejected filter disables filtering
    write_errno(t.root, "events/kprobes/ev/filter", "arg ==")
    t.engine.hit(VFS_READ, di=1, si=KDATA)
    assert "2/2" in cat(t.root, "trace")


def test_comm_and_cpu_filters():
    t = make_tracer()
    echo(t.root, "kprobe_events", "p:ev vfs_read")
    echo(t.root, "events/kprobes/ev/enable", "1")
    echo(t.root, "events/kprobes/ev/filter", 'comm == "cat" && cpu == 1')
    t.kernel.run_as(5, "cat", cpu=1)
    t.engine.hit(VFS_READ)
    t.kernel.run_as(6, "cat", cpu=0)
    t.engine.hit(VFS_READ)
    t.kernel.run_as(7, "bash", cpu=1)
    t.engine.hit(VFS_READ)
    assert "1/1" in cat(t.root, "trace")


def test_group_filter():
    t = make_tracer()
    echo(t.root, "kprobe_events", "p:g/a vfs_read arg=%di\np:g/b vfs_read other=%si\n")
    assert cat(t.root, "events/g/filter").startswith("### global filter ###\n")
    echo(t.root, "events/g/filter", "arg == 1")
    assert cat(t.root, "events/g/a/filter") == "arg == 1\n"
    assert cat(t.root, "events/g/b/filter") == (
        "arg == 1\n^\nparse_error: Couldn't find or set field in one of a subsystem's "
        "events\n\n")
    assert "Couldn't find or set field" in cat(t.root, "error_log")
    echo(t.root, "events/g/filter", "common_pid != 0")
    assert cat(t.root, "events/g/b/filter") == "common_pid != 0\n"
    echo(t.root, "events/g/filter", "0")
    assert cat(t.root, "events/g/a/filter") == "none\n"
