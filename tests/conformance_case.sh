#!/bin/sh
# Runs one ftrace selftest case against a kprobefs mount, the way the kernel's own
# runner does, and prints its result code on the last line of stdout:
#   0 pass, 1 fail, 2 unresolved, 3 untested, 4 unsupported, 5 xfail.
#
# Usage: conformance_case.sh SELFTEST_DIR CASE_FILE LOG_FILE [instance]
# With "instance", the case runs as ftracetest's second pass runs the cases flagged
# "# flags: instance": in a fresh instances/ftracetest.XXXXXX directory, removed after.
#
# Run it under `kprobefs exec --kernel-scratch MOUNT --`: in its private mount namespace
# the mount is /sys/kernel/tracing, listed as tracefs in /proc/mounts, where this script
# finds it as ftracetest does; the emulated kernel's kallsyms and version are
# /proc/kallsyms and /proc/version, which the cases read for the kernel's symbols and
# banner; modprobe and rmmod load and unload the emulated kernel's modules; and
# /dev/null and /tmp are the emulated kernel's, so that the files a case opens there to
# trace its own opens (kprobe_args_user.tc: echo > /dev/null, ln -s in $TMPDIR) are
# opened by the emulated kernel, as on the machine the case was written for.  So
# SELFTEST_DIR, CASE_FILE and LOG_FILE must be outside /tmp.

# The case helpers (exit_unsupported and friends) report a result by sending this shell
# the real-time signal 36 + code and then exiting 0; a case that exits non-zero fails.

SELFTEST_DIR=$1
CASE=$2

# The case's output goes to the log; fd 9 keeps stdout for the result.
exec 9>&1 >>"$3" 2>&1
testlog=/proc/self/fd/1

TRACING_DIR=`grep tracefs /proc/mounts | cut -f2 -d' ' | head -1`
[ -n "$TRACING_DIR" ] || { echo "no tracefs in /proc/mounts"; exit 96; }
INSTANCE_DIR=
if [ "$4" = instance ]; then
    INSTANCE_DIR=`mktemp -d "$TRACING_DIR/instances/ftracetest.XXXXXX"` || exit 95
    TRACING_DIR=$INSTANCE_DIR
fi
export TMPDIR="$(mktemp -d /tmp/kprobefs-ftracetest.XXXXXX)"
export FTRACETEST_ROOT=$SELFTEST_DIR

RESULT=0
RUNNER_PID=$$
for code in 1 2 3 4 5; do
    trap "RESULT=$code" $((36 + code))
done

exit_pass() { exit 0; }
exit_fail() { exit 1; }
exit_unresolved() { kill -s 38 $RUNNER_PID; exit 0; }
exit_untested() { kill -s 39 $RUNNER_PID; exit 0; }
exit_unsupported() { kill -s 40 $RUNNER_PID; exit 0; }
exit_xfail() { kill -s 41 $RUNNER_PID; exit 0; }

# Reads the "# requires:" line; its words are re-split by eval so quoted patterns with
# blanks stay one argument, then each is checked by check_requires (test.d/functions).
case_requires() {
    eval check_requires "$(grep "^#[ \t]*requires:" "$1" | cut -f2- -d:)"
}

. "$SELFTEST_DIR/test.d/functions"

(cd "$TRACING_DIR" || exit 1
 read PID _ < /proc/self/stat
 set -e
 set -x
 case_requires "$CASE"
 initialize_ftrace
 . "$CASE")
[ $? -ne 0 ] && RESULT=1

[ -z "$INSTANCE_DIR" ] || rmdir "$INSTANCE_DIR"
rm -rf "$TMPDIR"
echo "$RESULT" >&9
