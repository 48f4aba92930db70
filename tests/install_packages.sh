#!/usr/bin/env bash
# The Debian packages kprobefs and its tests need, installed when missing.  libfuse2 is
# the library fusepy loads; Debian's `fuse` package (fusermount) is not needed: the
# daemon runs as root, where libfuse2 mounts with mount(2) and kprobefs unmounts with
# umount(2).  It must not be installed: it Breaks fuse3, and apt would remove fuse3 and
# what depends on it.  libfuse2 and fuse3 install side by side.
# trace-cmd, linux-perf and perf-tools-unstable: the unmodified tools tests/test_exec.py
# runs through `kprobefs exec`; gawk: perf-tools' opensnoop and funcslower read
# trace_pipe with gawk (Debian's default awk, mawk, lacks what their scripts use).
# iputils-ping: the ftracetest inter-event cases ping 127.0.0.1 to make a task sleep and
# wake on the host (its wakeups are mirrored into the emulated kernel).
set -euo pipefail
PACKAGES=(gcc make binutils libfuse2 systemd trace-cmd linux-perf perf-tools-unstable gawk
          iputils-ping)
if [ "${1:-}" = "--list" ]; then
    echo "${PACKAGES[*]}"
    exit 0
fi
need=()
for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
    echo "installing Debian packages: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # --no-remove: fail rather than take anything away from the system.
    apt-get install -y -qq --no-remove "${need[@]}" >/dev/null
fi
