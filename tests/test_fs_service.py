"""The systemd units, root's and a user's (systemctl --user): systemd-analyze accepts
them, and they run the daemon the way the daemon expects (Type=notify, foreground, at
/run/kprobefs or the user's $XDG_RUNTIME_DIR/kprobefs).  The READY=1/STOPPING=1
exchange itself is tested in test_fs_mount.py and test_nonroot_mount.py against a
test-made notify socket."""

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

SYSTEMD = Path(__file__).resolve().parents[1] / "systemd"
INSTALLED = "/usr/local/bin/kprobefs"
#: unit: (its file, the command it runs, where it mounts, systemd-analyze's scope)
UNITS = {
    "system": (SYSTEMD / "kprobefs.service", INSTALLED, "/run/kprobefs", []),
    "user": (SYSTEMD / "kprobefs-user.service", "%h/.local/bin/kprobefs", "%t/kprobefs",
             ["--user"]),
}


def _unit(path: Path):
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read(path)
    return parser


@pytest.mark.parametrize("unit", UNITS)
def test_unit_runs_the_daemon_in_the_foreground_with_notify(unit):
    path, command, mountpoint, _scope = UNITS[unit]
    service = _unit(path)["Service"]
    assert service["Type"] == "notify"
    assert service["Restart"] == "on-failure"
    argv = shlex.split(service["ExecStart"])
    assert argv[0] == command
    args = build_parser().parse_args(argv[1:])
    assert args.command == "mount" and args.foreground
    assert args.mountpoint == mountpoint
    # a crash must not leave a dead mount behind
    assert f"fusermount -u -z {mountpoint}" in service["ExecStopPost"]
    # a missing prerequisite's status (kprobefs.daemon) is no reason to try again
    assert "3" in service["RestartPreventExitStatus"].split()


@pytest.mark.parametrize("unit", UNITS)
def test_systemd_analyze_verify_accepts_the_unit(tmp_path, unit):
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    path, command, _mountpoint, scope = UNITS[unit]
    if not os.access(command, os.X_OK):
        # verify checks that ExecStart's program exists; where kprobefs is not installed
        # there, point it at a stand-in so that the rest of the unit is checked.
        stand_in = tmp_path / "kprobefs"
        stand_in.write_text("#!/bin/sh\nexit 0\n")
        stand_in.chmod(0o755)
        path = tmp_path / path.name
        path.write_text(UNITS[unit][0].read_text().replace(command, str(stand_in)))
    # a user's manager needs its runtime directory (%t)
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    r = subprocess.run([tool, *scope, "verify", str(path)], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, XDG_RUNTIME_DIR=str(runtime)))
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
    monkeypatch.setattr(cli, "check_fuse", lambda allow_other=False: None)
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
