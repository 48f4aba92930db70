"""The register file in Unicorn's memory (machine/_fastuc.py): found and checked
through the API, the same registers as the API in a hook, writes that the code after
the hook sees, snapshots that put the flags back, and the API where no file is found."""

import ctypes
import struct

import pytest
from unicorn import UC_ARCH_X86, UC_HOOK_CODE, UC_MODE_64, Uc
from unicorn.x86_const import (
    UC_X86_REG_R13, UC_X86_REG_RAX, UC_X86_REG_RBX, UC_X86_REG_RFLAGS, UC_X86_REG_RIP,
    UC_X86_REG_RSI,
)

from kprobefs.machine import Kernel, _fastuc
from kprobefs.machine._fastuc import (GPR_INDEX, RIP_INDEX, FastRegs, RegSet,
                                      known_register_file, register_file)

CODE, DATA = 0x1000, 0x5000


def _store(reg_bits: int, disp: int) -> bytes:
    """mov [disp32], <reg> for the register with ModRM reg field reg_bits (r8+ need
    REX.R: reg_bits >= 8)."""
    rex = 0x48 | (4 if reg_bits >= 8 else 0)
    return bytes([rex, 0x89, 0x04 | (reg_bits & 7) << 3, 0x25]) + struct.pack("<I", disp)


def _machine(code: bytes) -> Uc:
    uc = Uc(UC_ARCH_X86, UC_MODE_64)
    uc.mem_map(0, 0x10000)
    uc.mem_write(CODE, code)
    uc.reg_write(UC_X86_REG_RAX, 0x1111)
    uc.reg_write(UC_X86_REG_RBX, 0x2222)
    return uc


def _run(uc: Uc, code: bytes) -> None:
    uc.emu_start(CODE, CODE + len(code))


def test_found_and_the_same_registers_as_the_api_in_a_hook():
    code = b"\x90\x90" + _store(0, DATA)
    uc = _machine(code)
    rf = register_file(uc)
    assert rf is not None and known_register_file(uc) is rf
    assert register_file(uc) is rf                     # found once per Uc
    seen = []

    def hook(uc_, address, _size, _ud):
        seen.append(({r: rf.words[i] for r, i in GPR_INDEX.items()},
                     {r: uc_.reg_read(r) for r in GPR_INDEX},
                     rf.words[RIP_INDEX], uc_.reg_read(UC_X86_REG_RIP), address))

    uc.hook_add(UC_HOOK_CODE, hook, begin=CODE + 1, end=CODE + 1)
    _run(uc, code)
    (ours, api, rip, api_rip, address), = seen
    assert ours == api and ours[UC_X86_REG_RBX] == 0x2222
    assert rip == api_rip == address == CODE + 1


def test_writes_in_a_hook_are_what_the_code_after_it_sees():
    code = b"\x90" + _store(0, DATA) + _store(13, DATA + 8) + _store(6, DATA + 16)
    uc = _machine(code)
    register_file(uc)
    fast = FastRegs(uc)
    pair = RegSet(uc, [UC_X86_REG_R13, UC_X86_REG_RSI])

    def hook(*_):
        fast.set(UC_X86_REG_RAX, 0xABCD)
        pair.write((0x1313, 0x5151))
        assert fast.get(UC_X86_REG_RAX) == 0xABCD and pair.read() == (0x1313, 0x5151)

    uc.hook_add(UC_HOOK_CODE, hook, begin=CODE, end=CODE)
    _run(uc, code)
    assert struct.unpack("<3Q", uc.mem_read(DATA, 24)) == (0xABCD, 0x1313, 0x5151)


def test_a_snapshot_puts_registers_and_flags_back():
    # cmp rax, rax (ZF=1, CF=0); the hook; setz [DATA]; setc [DATA+1]; mov [DATA+8], rbx
    code = (b"\x48\x39\xc0" + b"\x90" + b"\x0f\x94\x04\x25" + struct.pack("<I", DATA)
            + b"\x0f\x92\x04\x25" + struct.pack("<I", DATA + 1) + _store(3, DATA + 8))
    uc = _machine(code)
    rf = register_file(uc)

    def hook(uc_, *_):
        state = rf.snapshot()
        uc_.reg_write(UC_X86_REG_RFLAGS, 0x3)          # CF set, ZF clear
        uc_.reg_write(UC_X86_REG_RBX, 0xBAD)
        rf.restore(state)

    uc.hook_add(UC_HOOK_CODE, hook, begin=CODE + 3, end=CODE + 3)
    _run(uc, code)
    assert uc.mem_read(DATA, 2) == b"\x01\x00"
    assert struct.unpack("<Q", uc.mem_read(DATA + 8, 8))[0] == 0x2222


def test_without_a_register_file_the_api_serves():
    code = b"\x90" + _store(13, DATA)
    uc = _machine(code)
    assert known_register_file(uc) is None           # never looked for
    fast, regs = FastRegs(uc), RegSet(uc, [UC_X86_REG_RAX, UC_X86_REG_RBX])
    assert fast._words is None and regs.read == regs._api_read

    def hook(*_):
        assert regs.read() == (0x1111, 0x2222)
        fast.set(UC_X86_REG_R13, 0x7777)

    uc.hook_add(UC_HOOK_CODE, hook, begin=CODE, end=CODE)
    _run(uc, code)
    assert struct.unpack("<Q", uc.mem_read(DATA, 8))[0] == 0x7777


@pytest.mark.parametrize("with_file", [True, False])
def test_a_reader_and_a_writer_are_get_and_set(with_file):
    """FastRegs.reader/writer: one register's get() and set() (a write counted in
    REG_WRITES), through the register file or the API alike."""
    code = b"\x90" + _store(0, DATA)
    uc = _machine(code)
    if with_file:
        register_file(uc)
    fast = FastRegs(uc)
    rax, set_rax, rip = (fast.reader(UC_X86_REG_RAX), fast.writer(UC_X86_REG_RAX),
                         fast.reader(UC_X86_REG_RIP))
    seen = []

    def hook(*_):
        writes = _fastuc.REG_WRITES[0]
        seen.append((rax(), rip()))
        set_rax(-1)
        seen.append((fast.get(UC_X86_REG_RAX), _fastuc.REG_WRITES[0] - writes))

    uc.hook_add(UC_HOOK_CODE, hook, begin=CODE, end=CODE)
    _run(uc, code)
    assert seen == [(0x1111, CODE), (2 ** 64 - 1, 1)]
    assert struct.unpack("<Q", uc.mem_read(DATA, 8))[0] == 2 ** 64 - 1


def test_a_place_that_only_looks_like_the_registers_is_refused(monkeypatch):
    """The search finds the sixteen marks; the checks then write through that place and
    read back through the API, so a copy of the values elsewhere is not taken."""
    uc = _machine(b"\x90")
    copies = []

    def copy_of_the_marks(_uc, _fd, pattern):
        buf = ctypes.create_string_buffer(pattern, _fastuc.SNAPSHOT_SIZE)
        copies.append(buf)
        return ctypes.addressof(buf)

    monkeypatch.setattr(_fastuc, "_locate", copy_of_the_marks)
    before = uc.reg_read(UC_X86_REG_RBX)
    assert register_file(uc) is None and copies
    assert known_register_file(uc) is None
    assert uc.reg_read(UC_X86_REG_RBX) == before     # the registers are put back


def test_the_kernel_uses_it():
    k = Kernel(cpus=1, seed=0)
    assert k.register_file is not None and k.fast._words is k.register_file.words
    assert k.save_cpu_state == k.register_file.snapshot


def test_contexts_and_the_stop_keep_the_gil_and_do_what_the_binding_does():
    """FastRegs.context_update/context_restore are Uc's (a CPU switch through them
    gives each context its registers back), and emu_stop in a hook ends the run
    there; all through PyDLL, which keeps the GIL."""
    code = bytes([0x48, 0xFF, 0xC0]) * 4        # inc rax, four times
    uc = _machine(code)
    fast = FastRegs(uc)
    assert isinstance(fast._save, ctypes._CFuncPtr) and \
        fast._save._flags_ & ctypes._FUNCFLAG_PYTHONAPI
    first, second = uc.context_save(), uc.context_save()
    uc.reg_write(UC_X86_REG_RAX, 7)
    fast.context_update(first)
    uc.reg_write(UC_X86_REG_RAX, 9)
    fast.context_update(second)
    fast.context_restore(first)
    assert uc.reg_read(UC_X86_REG_RAX) == 7
    fast.context_restore(second)
    assert uc.reg_read(UC_X86_REG_RAX) == 9
    hits = []

    def hook(_uc, address, _size, _data):
        hits.append(address)
        if len(hits) == 2:
            fast.emu_stop()
    uc.hook_add(UC_HOOK_CODE, hook)
    uc.reg_write(UC_X86_REG_RAX, 0)
    _run(uc, code)
    assert hits == [CODE, CODE + 3] and uc.reg_read(UC_X86_REG_RAX) == 1
