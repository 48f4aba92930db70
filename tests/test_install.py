"""Installing kprobefs: ./install.sh on Debian 12, the README's commands, the packaging.

./install.sh puts kprobefs in a virtual environment of its own (Debian 12's python3 is
externally managed, PEP 668: ``pip install`` into it is refused), links the command into
a directory on PATH and the man page where man finds it; ``--uninstall`` takes it all
away.  .ci/run runs the README's set-up and test commands as they are written.

Debian 12's ``fuse`` package (fusermount for libfuse2) Breaks ``fuse3``: installing it
makes apt remove fuse3 and everything that depends on it.  kprobefs needs only
``libfuse2``, which installs beside fuse3, and unmounts with umount(2) as root.  The
first fuse3 test asks apt for a simulation (``apt-get -s``: nothing changes): the
package list together with fuse3 must be installable.  The second really installs fuse3
and then the list, and checks fuse3 is still there; it changes the machine, so it runs
under CI=true (CI machines are root, with network) or with KPROBEFS_APT_TESTS=1.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TOP = HERE.parent
INSTALL = ["bash", str(HERE / "install_packages.sh")]
APT_ENV = dict(os.environ, DEBIAN_FRONTEND="noninteractive")


def _packages() -> list[str]:
    return subprocess.run(INSTALL + ["--list"], capture_output=True, text=True,
                          check=True).stdout.split()


def _need_apt() -> None:
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        pytest.skip("needs apt-get, as root")


def _installed(pkg: str) -> bool:
    done = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True,
                          text=True)
    return done.returncode == 0 and "install ok installed" in done.stdout


def test_the_package_list_has_no_fuse_and_installs_beside_fuse3():
    _need_apt()
    packages = _packages()
    assert "fuse" not in packages and "libfuse2" in packages
    done = subprocess.run(["apt-get", "-s", "install"] + packages + ["fuse3"],
                          capture_output=True, text=True, env=APT_ENV, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    removed = [line.split()[1] for line in done.stdout.splitlines()
               if line.startswith("Remv ")]
    assert not set(removed) & set(packages + ["fuse3", "libfuse3-3"]), removed


@pytest.mark.skipif(os.environ.get("CI") != "true"
                    and os.environ.get("KPROBEFS_APT_TESTS") != "1",
                    reason="changes the machine's packages: CI=true or KPROBEFS_APT_TESTS=1")
def test_installing_keeps_an_installed_fuse3():
    _need_apt()
    if not _installed("fuse3"):
        subprocess.run(["apt-get", "install", "-y", "-qq", "fuse3"], check=True,
                       env=APT_ENV, timeout=600, stdout=subprocess.DEVNULL)
    subprocess.run(INSTALL, check=True, timeout=1200)
    assert _installed("fuse3")
    assert _installed("libfuse2")


# Debian 12's default PATH for root: its own /usr/bin/python3 is the first python3.
DEBIAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SETUP = "./install.sh && kprobefs mount /run/kprobefs"
TEST = "bash tests/run.sh"


def _shell_lines(markdown: str) -> list[str]:
    """The lines of the ``sh`` and ``console`` blocks of a markdown text, prompts cut."""
    lines, inside = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            inside = not inside and line[3:].strip() in ("sh", "console", "bash")
            continue
        if inside:
            lines.append(line.removeprefix("$ ").strip())
    return lines


def test_ci_runs_the_readmes_setup_and_test_commands_as_written():
    readme = _shell_lines((TOP / "README.md").read_text())
    assert SETUP in readme and TEST in readme
    ci = [line.strip() for line in (TOP / ".ci" / "run").read_text().splitlines()]
    assert SETUP in ci and TEST in ci
    assert f"export PATH={DEBIAN_PATH}" in ci
    run = (HERE / "run.sh").read_text()
    assert "./install.sh --test" in run


def test_building_the_package_gives_no_packaging_warning(tmp_path):
    """setuptools warns of what it finds wrong in pyproject.toml (a deprecated license
    table, data directories that look like packages): none of it may appear."""
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-v",
                           "--disable-pip-version-check", "-w", str(tmp_path), str(TOP)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    output = done.stdout + done.stderr
    ours = [line for line in output.splitlines()
            if re.search(r"setuptools.*Warning|Deprecat|is absent from the", line)]
    assert not ours, "\n".join(ours)


@pytest.mark.skipif(os.environ.get("CI") != "true"
                    and os.environ.get("KPROBEFS_INSTALL_TESTS") != "1",
                    reason="installs into a new environment: CI=true or KPROBEFS_INSTALL_TESTS=1")
def test_install_sh_with_debians_python_then_uninstall(tmp_path):
    """With Debian's externally managed python3 first on PATH, ./install.sh makes its
    environment, links the command and the man page, and --uninstall removes them."""
    if not Path("/usr/bin/python3").exists() or shutil.which("dpkg-query") is None:
        pytest.skip("not a Debian machine")
    venv, bindir, mandir = tmp_path / "venv", tmp_path / "bin", tmp_path / "man8"
    env = dict(os.environ, PATH=DEBIAN_PATH, KPROBEFS_VENV=str(venv),
               KPROBEFS_BINDIR=str(bindir), KPROBEFS_MANDIR=str(mandir))
    for name in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):
        env.pop(name, None)
    done = subprocess.run(["./install.sh"], cwd=TOP, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    # No warning of the install's own making (pip's notes about this machine's own
    # package index settings are the machine's).
    warned = [line for line in (done.stdout + done.stderr).splitlines()
              if re.search(r"(?i)warn|deprecat", line)
              and "it is neither a file nor a directory" not in line]
    assert not warned, "\n".join(warned)
    base = subprocess.run([str(venv / "bin" / "python"), "-c",
                           "import sys; print(sys._base_executable)"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert os.path.realpath(base) == os.path.realpath("/usr/bin/python3")
    command = bindir / "kprobefs"
    assert os.path.realpath(command) == os.path.realpath(venv / "bin" / "kprobefs")
    helped = subprocess.run([str(command), "--help"], capture_output=True, text=True,
                            timeout=60, env=dict(env, PATH=f"{bindir}:{DEBIAN_PATH}"))
    assert helped.returncode == 0 and "mount" in helped.stdout
    page = mandir / "kprobefs.8"
    assert page.read_bytes() == (TOP / "docs" / "kprobefs.8").read_bytes()
    found = subprocess.run(["man", "-w", "kprobefs"], capture_output=True, text=True,
                           env=dict(env, MANPATH=str(tmp_path)))
    assert found.stdout.strip() == str(page), found.stderr
    done = subprocess.run(["./install.sh", "--uninstall"], cwd=TOP, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not venv.exists() and not command.exists() and not page.exists()


def test_install_sh_refuses_an_unknown_option():
    done = subprocess.run(["./install.sh", "--bogus"], cwd=TOP, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 2 and "unknown option" in done.stderr


@pytest.mark.skipif(os.environ.get("CI") != "true", reason="checks the suite's own install (CI=true)")
def test_the_documented_install_puts_the_man_page_where_man_finds_it():
    """tests/run.sh ran ./install.sh --test as root: `man kprobefs` works."""
    if os.geteuid() != 0 or shutil.which("man") is None:
        pytest.skip("needs root's install and man")
    found = subprocess.run(["man", "-w", "kprobefs"], capture_output=True, text=True,
                           env=dict(os.environ, PATH=DEBIAN_PATH))
    # Debian's /usr/local/man is a link to /usr/local/share/man
    assert os.path.realpath(found.stdout.strip()) == \
        os.path.realpath("/usr/local/share/man/man8/kprobefs.8"), found.stderr
