"""The committed kernel image and modules are exactly what their sources build, and they
ship in the wheel with the grammar files."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNEL = ROOT / "kprobefs" / "kernel"
SOURCES = ("Makefile", "kernel.lds", "*/*.c", "*/*.h", "*/*.S", "include/trace/*.h",
           "include/trace/events/*.h")
MODULES = ("modules/trace_printk.ko",)


def _copy_sources(dst: Path) -> None:
    for pattern in SOURCES:
        for src in KERNEL.glob(pattern):
            target = dst / src.relative_to(KERNEL)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


@pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("make") is None,
                    reason="needs gcc and make")
def test_image_rebuilds_byte_identically(tmp_path):
    _copy_sources(tmp_path)
    assert not (tmp_path / "vmlinux").exists()
    subprocess.run(["make", "-s", "-C", str(tmp_path)], check=True, capture_output=True)
    rebuilt = (tmp_path / "vmlinux").read_bytes()
    committed = (KERNEL / "vmlinux").read_bytes()
    assert rebuilt == committed, "kprobefs/kernel/vmlinux is stale: run make -C kprobefs/kernel"
    for module in MODULES:
        assert (tmp_path / module).read_bytes() == (KERNEL / module).read_bytes(), \
            f"kprobefs/kernel/{module} is stale: run make -C kprobefs/kernel"


def test_wheel_carries_the_image_and_grammar(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("kprobefs-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "kprobefs/kernel/vmlinux" in names
    assert "kprobefs/kernel/Makefile" in names
    assert "kprobefs/kernel/kernel/sched.c" in names
    assert "kprobefs/kernel/modules/trace_printk.c" in names
    assert "kprobefs/kernel/include/trace/events/sched.h" in names
    for module in MODULES:
        assert f"kprobefs/kernel/{module}" in names
    assert "kprobefs/grammar/kprobe_events.lark" in names
