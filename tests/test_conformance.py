"""Conformance: Linux 6.1's ftrace selftests for kprobes, dynamic events and trace
instances, unmodified, against a real mount: the results of ``ftracetest`` itself under
``kprobefs exec --kernel-scratch`` (tests/conformance_runner.py, run_ftracetest).

When the torture tests are in the same session, this reads their run of the whole
suite (one run, not two); alone (``pytest -m conformance``), it runs ftracetest on
just ``test.d/kprobe``, ``test.d/dynevent`` and ``test.d/instances``.  Every case prints
one line with its result as it ends.  Each case has an expected result below: what
Linux 6.1 with this kernel's configuration reports.  Skipped without FUSE or root,
except under CI=true.  Case by case, by the project's runner:
``python3 tests/conformance_runner.py [CASE-GLOB...]``.
"""

from __future__ import annotations

import os
import signal

import pytest

import conformance_runner as runner

pytestmark = [pytest.mark.conformance, pytest.mark.fuse]

#: The expected result of every case of test.d/kprobe, test.d/dynevent and
#: test.d/instances in 6.1.
EXPECTED = {
    "kprobe/add_and_remove.tc": "PASS",
    "kprobe/busy_check.tc": "PASS",
    "kprobe/kprobe_args.tc": "PASS",
    "kprobe/kprobe_args_comm.tc": "PASS",
    "kprobe/kprobe_args_string.tc": "PASS",
    "kprobe/kprobe_args_symbol.tc": "PASS",
    "kprobe/kprobe_args_syntax.tc": "PASS",
    "kprobe/kprobe_args_type.tc": "PASS",
    "kprobe/kprobe_args_user.tc": "PASS",      # --kernel-scratch: its /dev/null and /tmp
    "kprobe/kprobe_eventname.tc": "PASS",
    "kprobe/kprobe_ftrace.tc": "PASS",
    "kprobe/kprobe_module.tc": "PASS",         # exec's modprobe and rmmod
    "kprobe/kprobe_multiprobe.tc": "PASS",
    "kprobe/kprobe_non_uniq_symbol.tc": "PASS",
    "kprobe/kprobe_syntax_errors.tc": "PASS",
    "kprobe/kretprobe_args.tc": "PASS",
    "kprobe/kretprobe_maxactive.tc": "PASS",
    "kprobe/kretprobe_return_suffix.tc": "PASS",
    "kprobe/multiple_kprobes.tc": "PASS",
    "kprobe/probepoint.tc": "PASS",
    "kprobe/profile.tc": "PASS",
    "kprobe/uprobe_syntax_errors.tc": "UNSUPPORTED",     # no uprobe_events
    "dynevent/add_remove_eprobe.tc": "PASS",    # its cd is mirrored (kprobefs exec)
    "dynevent/add_remove_kprobe.tc": "PASS",
    "dynevent/add_remove_synth.tc": "PASS",
    "dynevent/clear_select_events.tc": "PASS",
    "dynevent/eprobes_syntax_errors.tc": "PASS",
    "dynevent/generic_clear_event.tc": "PASS",
    "dynevent/test_duplicates.tc": "PASS",
    "instances/instance-event.tc": "PASS",
    "instances/instance.tc": "PASS",
}


def _skip_or_fail(reason: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"conformance cannot run under CI=true: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def run(request) -> runner.FtracetestRun:
    """ftracetest's run: the whole suite's when the torture tests share this session,
    else one of CASE_DIRS only."""
    whole = any(item.get_closest_marker("torture") for item in request.session.items)
    done, _selftests, reason = runner.shared_ftracetest(
        *runner.session_ftracetest(whole),
        report=runner.line_printer(request.config, "ftracetest"))
    if reason:
        _skip_or_fail(reason)
    return done


def test_every_case_has_an_expectation(run):
    ran = {case for case in run.results if case.split("/", 1)[0] in runner.CASE_DIRS}
    assert ran == set(EXPECTED), run.output[-3000:]


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_ftracetest_case(run, case):
    result = run.results.get(case)
    assert result is not None, f"{case} was not run\n{run.output[-3000:]}"
    assert result == EXPECTED[case], f"{case}: {result}\n{run.log(case)[-6000:]}"


def test_a_case_run_under_nohup_still_stops_its_loops_with_sighup(tmp_path):
    """The instance cases stop their background loops with ``kill -1``: a runner
    started under nohup (SIGHUP ignored, which children inherit) starts each case with
    SIGHUP at its default action, or those cases hang."""
    out = tmp_path / "out"
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        status, _ = runner._run_limited(
            ["sh", "-c", "sleep 5 & p=$!; kill -1 $p; wait $p; echo $?"], out, 20)
    finally:
        signal.signal(signal.SIGHUP, before)
    assert status == 0
    assert out.read_text().split()[-1] == "129"     # 128 + SIGHUP: the sleep was hung up
