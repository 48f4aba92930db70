"""Installing kprobefs's system packages leaves an installed fuse3 alone
(tests/install_packages.sh, which tests/run.sh runs and the README's set-up mirrors).

Debian 12's ``fuse`` package (fusermount for libfuse2) Breaks ``fuse3``: installing it
makes apt remove fuse3 and everything that depends on it.  kprobefs needs only
``libfuse2``, which installs beside fuse3, and unmounts with umount(2) as root.

The first test asks apt for a simulation (``apt-get -s``: nothing changes): the package
list together with fuse3 must be installable.  The second really installs fuse3 and then
the list, and checks fuse3 is still there; it changes the machine, so it runs under
CI=true (CI machines are root, with network) or with KPROBEFS_APT_TESTS=1.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
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
