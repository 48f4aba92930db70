"""The systemd unit: systemd-analyze accepts it, and it runs the daemon the way the
daemon expects (Type=notify, foreground, /run/kprobefs).  The READY=1/STOPPING=1
exchange itself is tested in test_fs_mount.py against a test-made notify socket."""

import configparser
import gc
import os
import shlex
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from kprobefs.cli import build_parser
from kprobefs.daemon import sd_notify

UNIT = Path(__file__).resolve().parents[1] / "systemd" / "kprobefs.service"
INSTALLED = "/usr/local/bin/kprobefs"


def _unit():
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read(UNIT)
    return parser


def test_unit_runs_the_daemon_in_the_foreground_with_notify():
    unit = _unit()
    service = unit["Service"]
    assert service["Type"] == "notify"
    assert service["Restart"] == "on-failure"
    argv = shlex.split(service["ExecStart"])
    assert argv[0] == INSTALLED
    args = build_parser().parse_args(argv[1:])
    assert args.command == "mount" and args.foreground
    assert args.mountpoint == "/run/kprobefs"
    # a crash must not leave a dead mount behind
    assert "fusermount -u -z /run/kprobefs" in service["ExecStopPost"]


def test_systemd_analyze_verify_accepts_the_unit(tmp_path):
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    unit = UNIT
    if not os.access(INSTALLED, os.X_OK):
        # verify checks that ExecStart's program exists; where kprobefs is not installed
        # system-wide, point it at a stand-in so that the rest of the unit is checked.
        stand_in = tmp_path / "kprobefs"
        stand_in.write_text("#!/bin/sh\nexit 0\n")
        stand_in.chmod(0o755)
        unit = tmp_path / "kprobefs.service"
        unit.write_text(UNIT.read_text().replace(INSTALLED, str(stand_in)))
    r = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0 and "Failed to" in r.stderr and "kprobefs" not in r.stderr:
        pytest.skip(f"systemd-analyze cannot run here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == "", r.stderr


def test_sd_notify_paths_and_abstract_names(tmp_path):
    path = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(path)
        assert sd_notify("READY=1", {"NOTIFY_SOCKET": path})
        assert s.recv(64) == b"READY=1"
    name = f"kprobefs-unit-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind("\0" + name)
        assert sd_notify("STOPPING=1", {"NOTIFY_SOCKET": "@" + name})
        assert s.recv(64) == b"STOPPING=1"
    assert not sd_notify("READY=1", {})
    assert not sd_notify("READY=1", {"NOTIFY_SOCKET": str(tmp_path / "nobody")})


def test_the_cli_daemon_keeps_what_boot_made_out_of_the_collector(monkeypatch, tmp_path):
    """The daemon process freezes boot's objects before it serves (gc.freeze): a full
    collection then walks only what requests made since, not the kernel image's tables.
    Booting and serving are faked; the order is the CLI's."""
    from kprobefs import cli
    from kprobefs.daemon import Daemon

    seen = []
    monkeypatch.setattr(cli, "check_fuse", lambda: None)
    monkeypatch.setattr(Daemon, "boot",
                        lambda self: seen.append(("boot", gc.get_freeze_count())))
    monkeypatch.setattr(Daemon, "serve",
                        lambda self: seen.append(("serve", gc.get_freeze_count())))
    gc.unfreeze()
    try:
        assert cli.main(["mount", "-f", str(tmp_path / "mnt")]) == 0
    finally:
        gc.unfreeze()
    assert seen[0] == ("boot", 0) and seen[1][0] == "serve" and seen[1][1] > 0
