#!/usr/bin/env bash
# The whole test suite, from a fresh machine: system packages, the Python install (the
# real wheel, not an editable one), then pytest.  Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

# trace-cmd, linux-perf and perf-tools-unstable: the unmodified tools tests/test_exec.py
# runs through `kprobefs exec`.
need=()
for pkg in gcc make binutils fuse libfuse2 systemd trace-cmd linux-perf perf-tools-unstable; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
    echo "installing Debian packages: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need[@]}" >/dev/null
fi

python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore ".[test]"
exec python3 -m pytest -q -p no:cacheprovider "$@"
