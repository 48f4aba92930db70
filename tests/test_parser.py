"""kprobe_events command parsing: accepted forms, read-back, every kprobe error id and caret.

Error carets follow REFERENCE.md §4.2 and Linux 6.1's
tools/testing/selftests/ftrace/test.d/kprobe/kprobe_syntax_errors.tc ('^' marks the caret).
"""

import errno

import pytest

from kprobefs.errors import PROBE_ERROR_MESSAGES, ProbeParseError
from kprobefs.tracing.events import fetch
from kprobefs.tracing.events.probe_parser import (
    DeleteSpec,
    ProbeSpec,
    caret_position,
    compare_arg_types,
    format_error_log_entry,
    is_same_probe,
    format_probe,
    parse_command,
    split_commands,
    split_words,
)

VFS_READ = 0xFFFFFFFF81200000


class FakeSymbols:
    """A tiny kallsyms: name -> [(address, size)]."""

    def __init__(self):
        self.table = {
            "vfs_read": [(VFS_READ, 0x1A0)],
            "vfs_write": [(VFS_READ + 0x1A0, 0x100)],
            "kernel_clone": [(0xFFFFFFFF81080000, 0x300)],
            "do_exit": [(0xFFFFFFFF81090000, 0x400)],
            "name_show": [(0xFFFFFFFF81300000, 0x40), (0xFFFFFFFF81300100, 0x40)],
            "jiffies": [(0xFFFFFFFF82000000, 8)],
            "foo.isra.0": [(0xFFFFFFFF81400000, 0x80)],
            "trace_printk:trace_printk_irq_work": [(0xFFFFFFFFC0001000, 0x40)],
        }
        self.spans = sorted((a, s, n.split(":")[-1])
                            for n, rows in self.table.items() for a, s in rows)

    def lookup(self, name):
        if name in self.table:
            return [a for a, _ in self.table[name]]
        return [a for n, rows in self.table.items() if n.endswith(":" + name) for a, _ in rows]

    def find_symbol(self, addr):
        for start, size, name in self.spans:
            if start <= addr < start + size:
                return name, addr - start, size
        return None

    def hash_pointer(self, addr):
        return 0xA1B2C3D4


SYMS = FakeSymbols()


def parse(line, **kw):
    return parse_command(line, SYMS, **kw)


def error_of(line, **kw):
    with pytest.raises(ProbeParseError) as info:
        parse(line, **kw)
    return info.value


# ------------------------------------------------------------------ selftest carets

SYNTAX_ERRORS = [
    ("p^100 vfs_read", "MAXACT_NO_KPROBE"),
    ("r^1a111 vfs_read", "BAD_MAXACT"),
    ("r^100000 vfs_read", "MAXACT_TOO_BIG"),
    ("p ^non_exist_func", "BAD_PROBE_ADDR"),
    ("p ^hoge-fuga", "BAD_PROBE_ADDR"),
    ("p ^hoge+1000-1000", "BAD_PROBE_ADDR"),
    ("r ^vfs_read+10", "BAD_RETPROBE"),
    ("p:^/bar vfs_read", "NO_GROUP_NAME"),
    ("p:^12345678901234567890123456789012345678901234567890123456789012345/bar vfs_read",
     "GROUP_TOO_LONG"),
    ("p:^foo.1/bar vfs_read", "BAD_GROUP_NAME"),
    ("p:^ vfs_read", "NO_EVENT_NAME"),
    ("p:foo/^12345678901234567890123456789012345678901234567890123456789012345 vfs_read",
     "EVENT_TOO_LONG"),
    ("p:foo/^bar.1 vfs_read", "BAD_EVENT_NAME"),
    ("p vfs_read ^$retval", "RETVAL_ON_PROBE"),
    ("p vfs_read ^$stack10000", "BAD_STACK_NUM"),
    ("p vfs_read ^$arg10000", "BAD_ARG_NUM"),
    ("p vfs_read ^$none_var", "BAD_VAR"),
    ("p vfs_read ^%none_reg", "BAD_REG_NAME"),
    ("p vfs_read ^@12345678abcde", "BAD_MEM_ADDR"),
    ("p vfs_read ^@+10", "FILE_ON_KPROBE"),
    ("p vfs_read arg1=\\^x", "BAD_IMM"),
    ('p vfs_read arg1=\\"abcd^', "IMMSTR_NO_CLOSE"),
    ("p vfs_read ^+0@0)", "DEREF_NEED_BRACE"),
    ("p vfs_read ^+0ab1(@0)", "BAD_DEREF_OFFS"),
    ("p vfs_read +0(+0(@0^)", "DEREF_OPEN_BRACE"),
    ("p vfs_read +0(^$comm)", "COMM_CANT_DEREF"),
    ("p vfs_read ^&1", "BAD_FETCH_ARG"),
    ("p vfs_read +0(^+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(+0(@0))))))))))))))",
     "TOO_MANY_OPS"),
    ("p vfs_read +0(@11):u8[10^", "ARRAY_NO_CLOSE"),
    ("p vfs_read +0(@11):u8[10]^a", "BAD_ARRAY_SUFFIX"),
    ("p vfs_read +0(@11):u8[^10a]", "BAD_ARRAY_NUM"),
    ("p vfs_read +0(@11):u8[^256]", "ARRAY_TOO_BIG"),
    ("p vfs_read @11:^unknown_type", "BAD_TYPE"),
    ("p vfs_read $stack0:^string", "BAD_STRING"),
    ("p vfs_read @11:^b10@a/16", "BAD_BITFIELD"),
    ("p vfs_read ^arg123456789012345678901234567890=@11", "ARG_NAME_TOO_LONG"),
    ("p vfs_read ^=@11", "NO_ARG_NAME"),
    ("p vfs_read ^var.1=@11", "BAD_ARG_NAME"),
    ("p vfs_read var1=@11 ^var1=@12", "USED_ARG_NAME"),
    ("p vfs_read ^+1234567(+1234567(+1234567(+1234567(+1234567(+1234567(@1234))))))",
     "ARG_TOO_LONG"),
    ("p vfs_read arg1=^", "NO_ARG_BODY"),
    ("p vfs_read^%hoge", "BAD_ADDR_SUFFIX"),
    ("p ^vfs_read+10%return", "BAD_RETPROBE"),
]


@pytest.mark.parametrize("marked, error_id", SYNTAX_ERRORS)
def test_selftest_error_and_caret(marked, error_id):
    pos = marked.index("^")
    line = marked.replace("^", "", 1)
    err = error_of(line)
    assert err.error_id == error_id
    assert err.log
    words = split_words(line)
    assert caret_position(words, err.index, err.offset) == pos
    # ftracetest: the caret line is 13 + pos characters long, newline included.
    entry = format_error_log_entry(1_234_567_891_000, "trace_kprobe", words, err)
    assert len(entry.splitlines(keepends=True)[-1]) == 13 + pos


@pytest.mark.parametrize("marked, error_id, err_no", [
    ("p ^non_exist_func", "BAD_PROBE_ADDR", errno.ENOENT),
    ("p ^hoge-fuga", "BAD_PROBE_ADDR", errno.EINVAL),
    ("p:test ^name_show", "NON_UNIQ_SYMBOL", errno.EADDRNOTAVAIL),
    ("p vfs_read ^@no_such_sym", "BAD_PROBE_ADDR", errno.ENOENT),
])
def test_errno_of_symbol_errors(marked, error_id, err_no):
    pos = marked.index("^")
    line = marked.replace("^", "", 1)
    err = error_of(line)
    assert (err.error_id, err.errno) == (error_id, err_no)
    if "@" in line:
        # Linux resolves @SYM at registration and logs at word 1, offset 0.
        assert (err.index, err.offset) == (1, 0)
    else:
        assert caret_position(split_words(line), err.index, err.offset) == pos


# ------------------------------------------------------------- more error ids/carets

MORE_ERRORS = [
    ("r^0 vfs_read", "BAD_MAXACT"),
    ("r^10fuzz vfs_read", "BAD_MAXACT"),
    ("r^" + "1" * 64 + " vfs_read", "BAD_MAXACT"),
    ("r^4097 vfs_read", "MAXACT_TOO_BIG"),
    ("r^0x1001:foo vfs_read", "MAXACT_TOO_BIG"),
    ("p ^vfs_read-4", "BAD_PROBE_ADDR"),
    ("p ^vfs_read+0xffffffffff", "BAD_PROBE_ADDR"),
    ("p ^vfs_read+", "BAD_PROBE_ADDR"),
    ("p vfs_read^%return%return", "BAD_ADDR_SUFFIX"),
    ("p:^.x vfs_read", "NO_GROUP_NAME"),
    ("p:^1grp/ev vfs_read", "BAD_GROUP_NAME"),
    ("r10:^ vfs_read", "NO_EVENT_NAME"),
    ("r10:grp/^1ev vfs_read", "BAD_EVENT_NAME"),
    ("p:grp.^e-v vfs_read", "BAD_EVENT_NAME"),
    ("p vfs_read ^$stackp", "BAD_VAR"),
    ("p vfs_read ^$stack0+10", "BAD_VAR"),
    ("p vfs_read ^$stack0x10", "BAD_VAR"),
    ("p vfs_read ^$stack2049", "BAD_STACK_NUM"),
    ("p vfs_read ^$arg0", "BAD_ARG_NUM"),
    ("p vfs_read ^$argx", "BAD_VAR"),
    ("p vfs_read+8 ^$arg1", "BAD_VAR"),
    ("r vfs_read ^$arg1", "BAD_VAR"),
    ("p vfs_read ^%rax", "BAD_REG_NAME"),
    ("p vfs_read ^%eax", "BAD_REG_NAME"),
    ("p vfs_read x=^%ax[2]", "BAD_REG_NAME"),
    ("p vfs_read \\^", "BAD_IMM"),
    ("p vfs_read \\^0x", "BAD_IMM"),
    ('p vfs_read \\"^', "IMMSTR_NO_CLOSE"),
    ("p vfs_read ^+(%di)", "BAD_DEREF_OFFS"),
    ("p vfs_read ^-(%di)", "BAD_DEREF_OFFS"),
    ("p vfs_read ^+u(%di)", "BAD_DEREF_OFFS"),
    ("p vfs_read +8(^)", "BAD_FETCH_ARG"),
    ("p vfs_read -8(^%xx)", "BAD_REG_NAME"),
    # +u/-u: Linux does not count the 'u', so inner carets land one column left.
    ("p vfs_read +u8^(%xx)", "BAD_REG_NAME"),
    ("p vfs_read -u8^(%xx)", "BAD_REG_NAME"),
    ("p vfs_read +8(^\\\"ab\")", "COMM_CANT_DEREF"),
    ("p vfs_read +8(^$COMM)", "COMM_CANT_DEREF"),
    ("p vfs_read ^(x)", "BAD_FETCH_ARG"),
    ("p vfs_read ^word", "BAD_FETCH_ARG"),
    ("p vfs_read x=^a1x", "BAD_FETCH_ARG"),
    ("p vfs_read +0(@11):u8[^]", "BAD_ARRAY_NUM"),
    ("p vfs_read +0(@11):u8[^0]", "BAD_ARRAY_NUM"),
    ("p vfs_read +0(@11):u8[^65]", "ARRAY_TOO_BIG"),
    ("p vfs_read +0(@11):u8[64]^]", "BAD_ARRAY_SUFFIX"),
    ("p vfs_read %ax:^", "BAD_TYPE"),
    ("p vfs_read %ax:^:x16", "BAD_TYPE"),
    ("p vfs_read %ax:^y16", "BAD_TYPE"),
    ("p vfs_read %ax:^b3@2", "BAD_TYPE"),
    ("p vfs_read %ax:^b3@2/12", "BAD_TYPE"),
    ("p vfs_read ^x16", "BAD_FETCH_ARG"),
    ("p vfs_read %ax:^string", "BAD_STRING"),
    ("p vfs_read $stack:^string", "BAD_STRING"),
    ("p vfs_read %ax:^u8[2]", "BAD_STRING"),
    ("p vfs_read +u0(%ax):^u8[2]", "BAD_STRING"),
    ("p vfs_read %ax:^symstr[2]", "BAD_STRING"),
    ("p vfs_read \\1:^symstr", "BAD_SYMSTRING"),
    ("p vfs_read $stack:^symstr", "BAD_SYMSTRING"),
    ("p vfs_read +u0(%ax):^symstr", "BAD_SYMSTRING"),
    ("p vfs_read @11:^b0@1/8", "BAD_BITFIELD"),
    ("p vfs_read @11:^b4@5/8", "BAD_BITFIELD"),
    ("p vfs_read @11:^b4/8", "BAD_BITFIELD"),
    ("p vfs_read @11:^b4@/8", "BAD_BITFIELD"),
    ("p vfs_read @11:^bogus/8", "BAD_BITFIELD"),
    ("p vfs_read ^common_pid=%ax", "USED_ARG_NAME"),
    ("p vfs_read ^__probe_ip=%ax", "USED_ARG_NAME"),
    ("p vfs_read arg2=%ax ^%bx", "USED_ARG_NAME"),
    ("p vfs_read ^1x=%ax", "BAD_ARG_NAME"),
    ("p vfs_read x=^" + "+1(" * 20 + "%ax" + ")" * 20, "ARG_TOO_LONG"),
    ("p vfs_read x=^", "NO_ARG_BODY"),
    ("p vfs_read ^rv", "RETVAL_ON_PROBE"),
    ("p vfs_read ^ra", "BAD_VAR"),
    ("p vfs_read ^a2048", "BAD_ARG_NUM"),
    ("p vfs_read ^s2049", "BAD_STACK_NUM"),
    # A kretprobe at an address gets no return flag in 6.1.
    ("r 0xffffffff81200000 ^$retval", "RETVAL_ON_PROBE"),
]


@pytest.mark.parametrize("marked, error_id", MORE_ERRORS)
def test_more_errors_and_carets(marked, error_id):
    pos = marked.index("^")
    line = marked.replace("^", "", 1)
    err = error_of(line)
    assert err.error_id == error_id
    assert caret_position(split_words(line), err.index, err.offset) == pos


def nest(depth, inner, suffix=""):
    return "p vfs_read " + "+0(" * depth + inner + ")" * depth + suffix


def test_too_many_ops_limits():
    # 14 dereferences around a register, 13 around @ADDR, 12 around @SYM are the maxima.
    assert parse(nest(14, "%ax"))
    assert parse(nest(13, "@0"))
    assert parse(nest(12, "@jiffies"))
    for depth, inner in ((15, "%ax"), (14, "@0"), (13, "@jiffies")):
        err = error_of(nest(depth, inner))
        assert (err.error_id, err.index, err.offset) == ("TOO_MANY_OPS", 2, 3)


def test_too_many_ops_with_store_bitfield_and_array():
    # One fewer with a bitfield or an array.  A bitfield that finds no free slot is
    # reported by Linux as BAD_BITFIELD (at the type), an array as TOO_MANY_OPS at 0.
    assert parse(nest(12, "@0", ":b1@0/8"))
    err = error_of(nest(13, "@0", ":b1@0/8"))
    assert (err.error_id, err.offset) == ("BAD_BITFIELD", 55)
    assert parse(nest(12, "@0", ":u8[2]"))
    err = error_of(nest(13, "@0", ":u8[2]"))
    assert (err.error_id, err.offset) == ("TOO_MANY_OPS", 0)
    # A string replaces the last load; a string array keeps it and needs two more slots.
    assert parse(nest(13, "@0", ":string"))
    assert parse(nest(11, "@0", ":string[2]"))
    err = error_of(nest(12, "@0", ":string[2]"))
    assert (err.error_id, err.offset) == ("TOO_MANY_OPS", 0)


def test_event_too_big():
    line = "p vfs_read " + " ".join(f"a{i}=+0(%di):u64[64]" for i in range(7))
    err = error_of(line)
    assert (err.error_id, err.errno) == ("EVENT_TOO_BIG", errno.E2BIG)
    assert (err.index, err.offset) == (8, 3)


def test_at_symbol_with_bad_offset_fails_registration():
    err = error_of("p vfs_read @jiffies+zz")
    assert (err.error_id, err.errno, err.index, err.offset) == ("FAIL_REG_PROBE",
                                                                errno.EINVAL, 1, 0)


def test_later_syntax_error_wins_over_unresolved_symbol():
    assert error_of("p vfs_read @nope %bad").error_id == "BAD_REG_NAME"


@pytest.mark.parametrize("line", [
    "x vfs_read", "p", "p:foo", "r10", "-:x", "e:foo bar", "s:foo u64 x",
])
def test_silent_rejections(line):
    if line.startswith("-"):
        assert isinstance(parse(line), DeleteSpec)
        return
    err = error_of(line)
    assert err.errno == errno.EINVAL and not err.log and err.error_id is None
    assert err.cancelled


def test_uprobe_point_is_not_a_kprobe():
    err = error_of("p /bin/sh:0x10")
    assert err.cancelled and not err.log


@pytest.mark.parametrize("line", [
    "p vfs_read $comm:u32", "p vfs_read $comm:string[2]", "p vfs_read $COMM:x8",
    'p vfs_read \\"abc":u8', 'p vfs_read \\"ab:c"', "p vfs_read $comm:symstr",
])
def test_comm_and_immstr_need_string_type_without_log(line):
    err = error_of(line)
    assert err.errno == errno.EINVAL and not err.log and not err.cancelled


def test_errors_are_in_linux_order():
    # maxactive before the probe point, the point before the event name, names before args.
    assert error_of("p100:/x nosuch").error_id == "MAXACT_NO_KPROBE"
    assert error_of("p:/x nosuch").error_id == "BAD_PROBE_ADDR"
    assert error_of("p:/x vfs_read %bad").error_id == "NO_GROUP_NAME"
    assert error_of("r vfs_read+8%hoge").error_id == "BAD_ADDR_SUFFIX"
    # array checks come before the type check, the type before the operand.
    assert error_of("p vfs_read %bad:nope[2").error_id == "ARRAY_NO_CLOSE"
    assert error_of("p vfs_read %bad:nope").error_id == "BAD_TYPE"
    assert error_of("p vfs_read x=%bad y=%zz").offset == 2


# ------------------------------------------------------------------ accepted forms

READ_BACK = [
    ("p vfs_read", "p:kprobes/p_vfs_read_0 vfs_read"),
    ("r10 vfs_read", "r10:kprobes/r_vfs_read_0 vfs_read"),
    ("r vfs_read", "r:kprobes/r_vfs_read_0 vfs_read"),
    ("p:myprobeaccept vfs_read%return", "r:kprobes/myprobeaccept vfs_read"),
    ("p:grp/ev vfs_read+0x10 $stack0:u32 x=+8(%di)",
     "p:grp/ev vfs_read+16 arg1=$stack0:u32 x=+8(%di)"),
    ("p vfs_read+0x10", "p:kprobes/p_vfs_read_16 vfs_read+16"),
    ("p vfs_read+010", "p:kprobes/p_vfs_read_8 vfs_read+8"),
    ("p vfs_read+10", "p:kprobes/p_vfs_read_10 vfs_read+10"),
    ("r0x10:foo vfs_read", "r16:kprobes/foo vfs_read"),
    ("p:foo.bar vfs_read", "p:foo/bar vfs_read"),
    ("p:my-grp/ vfs_read", "p:my-grp/p_vfs_read_0 vfs_read"),
    ("p:grp. vfs_read", "p:grp/p_vfs_read_0 vfs_read"),
    ("pfoo vfs_read", "p:kprobes/p_vfs_read_0 vfs_read"),
    ("rxyz:ev vfs_read", "r:kprobes/ev vfs_read"),
    ("p 0xffffffff81200000", "p:kprobes/p_0x00000000a1b2c3d4 0x00000000a1b2c3d4"),
    ("r 0xffffffff81200000", "r:kprobes/r_0x00000000a1b2c3d4 0x00000000a1b2c3d4"),
    ("p 0", "p:kprobes/p_0x0000000000000000 0x0000000000000000"),
    ("p trace_printk:trace_printk_irq_work",
     "p:kprobes/p_trace_printk_trace_printk_irq_work_0 trace_printk:trace_printk_irq_work"),
    ("p foo.isra.0", "p:kprobes/p_foo_isra_0_0 foo.isra.0"),
    ("p notloaded:func+4", "p:kprobes/p_notloaded_func_4 notloaded:func+4"),
    ("p:myprobe vfs_read a0 a1 a2 a3",
     "p:kprobes/myprobe vfs_read arg1=a0 arg2=a1 arg3=a2 arg4=a3"),
    ("r:myretprobe vfs_read rv ra", "r:kprobes/myretprobe vfs_read arg1=rv arg2=ra"),
    ("p vfs_read s0 s12 sa", "p:kprobes/p_vfs_read_0 vfs_read arg1=s0 arg2=s12 arg3=sa"),
    ("p vfs_read  \t$comm   comm=$COMM ",
     "p:kprobes/p_vfs_read_0 vfs_read arg1=$comm comm=$COMM"),
    ('p vfs_read \\"hello" \\-5 \\+7 \\0x10',
     'p:kprobes/p_vfs_read_0 vfs_read arg1=\\"hello" arg2=\\-5 arg3=\\+7 arg4=\\0x10'),
    ("p vfs_read +0(+8(%di)):string -8(%sp):s16 +u4(%si):ustring %di:symstr",
     "p:kprobes/p_vfs_read_0 vfs_read arg1=+0(+8(%di)):string arg2=-8(%sp):s16 "
     "arg3=+u4(%si):ustring arg4=%di:symstr"),
    ("p vfs_read @jiffies @jiffies+8:u32 @jiffies-8 @0xffffffff82000000:x32",
     "p:kprobes/p_vfs_read_0 vfs_read arg1=@jiffies arg2=@jiffies+8:u32 arg3=@jiffies-8 "
     "arg4=@0xffffffff82000000:x32"),
    ("p vfs_read $arg1 $arg6 $arg7:s32 $stack $stack0 +0($stack)",
     "p:kprobes/p_vfs_read_0 vfs_read arg1=$arg1 arg2=$arg6 arg3=$arg7:s32 arg4=$stack "
     "arg5=$stack0 arg6=+0($stack)"),
    ("p vfs_write $arg1", "p:kprobes/p_vfs_write_0 vfs_write arg1=$arg1"),
    ("p vfs_read+0x1a0 $arg1", "p:kprobes/p_vfs_read_416 vfs_read+416 arg1=$arg1"),
    ("r vfs_read+0x1a0", "r:kprobes/r_vfs_read_416 vfs_read+416"),
    ("p vfs_read x=+0(%di):b3@2/8 y=+0(%di):b0x3@0x2/0x10 z=+0(%di):x8[4] w=+0(%di):string[2]",
     "p:kprobes/p_vfs_read_0 vfs_read x=+0(%di):b3@2/8 y=+0(%di):b0x3@0x2/0x10 "
     "z=+0(%di):x8[4] w=+0(%di):string[2]"),
    ("p vfs_read +0(%di)junk +0(+0(@0)x)y", "p:kprobes/p_vfs_read_0 vfs_read "
     "arg1=+0(%di)junk arg2=+0(+0(@0)x)y"),
]


@pytest.mark.parametrize("line, expected", READ_BACK)
def test_read_back(line, expected):
    spec = parse(line)
    assert isinstance(spec, ProbeSpec)
    assert format_probe(spec) == expected
    if spec.address is None:     # an address probe prints its hash, not the address
        assert parse(expected) == spec


def test_spec_fields():
    spec = parse("r10:grp/ev trace_printk:trace_printk_irq_work $retval")
    assert (spec.kind, spec.maxactive, spec.group, spec.event, spec.module, spec.symbol,
            spec.offset, spec.address, spec.is_return) == (
        "kretprobe", 10, "grp", "ev", "trace_printk", "trace_printk_irq_work", 0, None, True)
    assert spec.on_func_entry
    arg = spec.args[0]
    assert (arg.name, arg.source, arg.type, arg.count) == ("arg1", "$retval", "x64", 0)
    assert arg.program.insns == (fetch.FetchRetval(), fetch.StoreRaw(8))
    addr = parse("p 0xffffffff81200004")
    assert (addr.address, addr.symbol, addr.kind, addr.hashed_address) == (
        0xFFFFFFFF81200004, None, "kprobe", 0xA1B2C3D4)
    assert parse("p vfs_read+4").on_func_entry is False


def test_types_resolve_like_linux():
    spec = parse("p vfs_read +0(%di):b3@2/16 $comm \\\"x\" %ax:symbol @jiffies:s8[3]")
    assert [(a.type, a.count) for a in spec.args] == [
        ("u16", 0), ("string", 0), ("string", 0), ("symbol", 0), ("s8", 3)]


def test_max_trace_args_silently_ignores_extra():
    line = "p vfs_read " + " ".join(["%ax"] * 128) + " %bogus"
    spec = parse(line)
    assert len(spec.args) == 128
    assert spec.args[-1].name == "arg128"


def test_return_probe_via_symbol_plus_size_of_previous_is_entry():
    # vfs_read+0x1a0 lands on vfs_write+0: an entry, so a return probe is fine.
    assert parse("r vfs_read+0x1a0").is_return


def test_unresolved_symbol_with_module_is_accepted():
    spec = parse("r mod:func")
    assert spec.module == "mod" and not spec.on_func_entry


def test_memaddr_overflow_is_a_symbol():
    assert error_of("p 0x1ffffffffffffffff").errno == errno.ENOENT
    assert error_of("p 08").errno == errno.ENOENT


def test_long_generated_name_is_truncated_not_validated():
    table = FakeSymbols()
    name = "f" * 70
    table.table[name] = [(0xFFFFFFFF81500000, 0x10)]
    spec = parse_command(f"p {name}", table)
    assert spec.event == ("p_" + name)[:63]


# ------------------------------------------------------------------------ deletes

@pytest.mark.parametrize("line, expected", [
    ("-:myevent", DeleteSpec(None, "myevent")),
    ("-:grp/ev", DeleteSpec("grp", "ev")),
    ("-:grp/", DeleteSpec("grp", "")),
    ("-:grp.ev", DeleteSpec(None, "grp.ev")),
    ("-:kprobes/testevent kernel_clone", DeleteSpec("kprobes", "testevent",
                                                    ("kernel_clone",))),
])
def test_delete_commands(line, expected):
    assert parse(line) == expected


@pytest.mark.parametrize("line", ["-myevent", "- :x", "-:", "-:/"[:2]])
def test_bad_delete_commands(line):
    err = error_of(line)
    assert err.errno == errno.EINVAL and not err.log


def test_delete_with_bang_only_in_dynamic_events():
    assert parse("!p:myevent1 kernel_clone", dynamic_events=True) == DeleteSpec(
        None, "myevent1", ("kernel_clone",))
    assert error_of("!p:myevent1 kernel_clone").cancelled
    assert error_of("!nocolon", dynamic_events=True).errno == errno.EINVAL


def test_leading_blank_before_minus_is_not_a_delete():
    err = error_of(" -:myevent")
    assert err.errno == errno.EINVAL and not err.log


def test_delete_matching():
    first = parse("p:kprobes/testevent kernel_clone a=%ax b=%bx")
    second = parse("p:kprobes/testevent do_exit")
    assert parse("-:kprobes/testevent").matches(first)
    assert parse("-:testevent").matches(second)
    assert parse("-:kprobes/").matches(first)
    assert not parse("-:other/testevent").matches(first)
    assert parse("-:testevent kernel_clone").matches(first)
    assert not parse("-:testevent kernel_clone").matches(second)
    assert parse("-:testevent kernel_clone a=%ax").matches(first)
    assert not parse("-:testevent kernel_clone b=%bx").matches(first)
    assert not parse("-:testevent kernel_clone a=%ax b=%bx c=%cx").matches(first)
    assert parse("-:p_vfs_read_16 vfs_read+16").matches(parse("p vfs_read+0x10"))
    assert parse("-:p_0x00000000a1b2c3d4 0x00000000a1b2c3d4").matches(
        parse("p 0xffffffff81200000"))


def test_blank_line_is_a_no_op():
    assert parse("   ") is None


# ------------------------------------------------------------------- split_commands

def test_split_commands_lines_and_comments():
    data = b"p vfs_read\n\n# only a comment\n  \t\np:x vfs_read # tail\nr vfs_read"
    assert list(split_commands(data)) == ["p vfs_read", "p:x vfs_read ", "r vfs_read"]


def test_split_commands_hash_anywhere_starts_a_comment():
    assert list(split_commands(b"p vfs_read x=+0(%di)#:u8\n")) == ["p vfs_read x=+0(%di)"]


def test_split_commands_line_limit():
    ok = b"p vfs_read " + b"x" * (4094 - 11) + b"\n"
    assert len(list(split_commands(ok + b"p vfs_read\n"))) == 2
    too_long = b"p vfs_read " + b"x" * (4095 - 11) + b"\n"
    commands = split_commands(b"p first\n" + too_long)
    assert next(commands) == "p first"         # earlier lines are handed out first
    with pytest.raises(ProbeParseError) as info:
        next(commands)
    assert info.value.errno == errno.EINVAL and not info.value.log


def test_split_commands_final_piece_without_newline():
    final = b"p vfs_read " + b"y" * 4084     # 4095 bytes: one full chunk, nothing after
    assert list(split_commands(final)) == [final.decode()]
    with pytest.raises(ProbeParseError):
        list(split_commands(final + b"z"))


def test_split_commands_line_straddling_chunks():
    first = b"p a " + b"a" * 4000 + b"\n"
    second = b"p b " + b"b" * 3000 + b"\n"
    assert [len(c) for c in split_commands(first + second)] == [4004, 3004]


def test_split_commands_nul_byte_fails():
    commands = split_commands(b"p one\np two\0\n")
    assert next(commands) == "p one"
    with pytest.raises(ProbeParseError):
        next(commands)


def test_split_words_kernel_blanks():
    assert split_words("p\x0bvfs_read\xa0%ax\x1c") == ["p", "vfs_read", "%ax\x1c"]


# ------------------------------------------------------------------------ error_log

def test_error_log_entry_text():
    line = "p vfs_read $retval"
    err = error_of(line)
    text = format_error_log_entry(1234_567891_000, "trace_kprobe", split_words(line), err)
    assert text == ("[ 1234.567891] trace_kprobe: error: $retval is not available on probe\n"
                    "  Command: p vfs_read $retval\n"
                    "                      ^\n")


def test_error_log_caret_past_last_word():
    err = ProbeParseError("DIFF_ARG_TYPE", errno.EEXIST, index=3, offset=5)
    words = ["p:kprobes/testevent", "kernel_clone"]
    assert caret_position(words, 3, 5) == len("p:kprobes/testevent kernel_clone") + 1
    text = format_error_log_entry(12_000_000, "trace_kprobe", words, err)
    assert text.startswith("[    0.012000] trace_kprobe: error: Argument type or name is "
                           "different from existing probe\n  Command: ")
    assert len(text.splitlines()[-1]) == 11 + 33 + 1


def test_error_table_has_every_kprobe_id():
    ids = {e for _, e in SYNTAX_ERRORS + MORE_ERRORS}
    assert ids <= set(PROBE_ERROR_MESSAGES)
    assert PROBE_ERROR_MESSAGES["IMMSTR_NO_CLOSE"] == "String is not closed with '\"'"
    assert PROBE_ERROR_MESSAGES["BAD_RETPROBE"] == "Retprobe address must be an function entry"


# ------------------------------------------------------------ multi-probe events

def test_compare_arg_types_and_same_probe():
    first = parse("p:kprobes/testevent kernel_clone abcd=\\1")
    assert compare_arg_types(first, parse("p:kprobes/testevent kernel_clone bcd=\\1")) == 1
    assert compare_arg_types(first, parse("p:kprobes/testevent kernel_clone abcd=\\1:u8")) == 1
    assert compare_arg_types(first, parse('p:kprobes/testevent kernel_clone abcd=\\"foo"')) == 1
    assert compare_arg_types(first, parse("p:kprobes/testevent kernel_clone")) == 1
    assert compare_arg_types(first, parse("p:kprobes/testevent do_exit abcd=\\2")) == 0
    assert is_same_probe(first, parse("p:kprobes/testevent kernel_clone abcd=\\1"))
    assert not is_same_probe(first, parse("p:kprobes/testevent do_exit abcd=\\1"))
    assert not is_same_probe(first, parse("p:kprobes/testevent kernel_clone abcd=\\0x1"))
    # A bitfield compares as its container type, x8 differs from u8.
    a = parse("p:e vfs_read x=+0(%di):b3@2/8")
    assert compare_arg_types(a, parse("p:e vfs_read x=+0(%di):u8")) == 0
    assert compare_arg_types(a, parse("p:e vfs_read x=+0(%di):x8")) == 1
    # Address probes all look like "unknown+0".
    assert is_same_probe(parse("p 0xffffffff81200000"), parse("p 0xffffffff81200004"))
