"""Conformance: Linux 6.1's ftrace selftests for kprobes, dynamic events and trace
instances, unmodified, against a real mount (tests/conformance_runner.py runs them the
way ftracetest does, with its second pass of the cases flagged ``instance``).

``pytest -m conformance`` runs only these; every case prints one line with its result.
Each case has an expected result below: what Linux 6.1 with this kernel's configuration
reports.  Skipped without FUSE or root, except under CI=true.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import conformance_runner as runner

pytestmark = [pytest.mark.conformance, pytest.mark.fuse]

#: The expected result of every case of test.d/kprobe and test.d/dynevent in 6.1.
EXPECTED = {
    "kprobe/add_and_remove.tc": "PASS",
    "kprobe/busy_check.tc": "PASS",
    "kprobe/kprobe_args.tc": "PASS",
    "kprobe/kprobe_args_comm.tc": "PASS",
    "kprobe/kprobe_args_string.tc": "PASS",
    "kprobe/kprobe_args_symbol.tc": "PASS",
    "kprobe/kprobe_args_syntax.tc": "PASS",
    "kprobe/kprobe_args_type.tc": "PASS",
    "kprobe/kprobe_args_user.tc": "PASS",
    "kprobe/kprobe_eventname.tc": "PASS",
    "kprobe/kprobe_ftrace.tc": "PASS",
    "kprobe/kprobe_module.tc": "PASS",
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
    "instances/instance-event.tc": "PASS",      # its sched_switch writes fail: no such event
    "instances/instance.tc": "PASS",
}

def _skip_or_fail(reason: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"conformance cannot run under CI=true: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def results(request, tmp_path_factory):
    """Every case's result, run in ftracetest's order against one mount; each result
    line is printed as the case finishes."""
    selftests, reason = runner.prepare()
    if reason:
        _skip_or_fail(reason)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    log_dir = Path(os.environ.get("KPROBEFS_CONFORMANCE_LOGS") or
                   tmp_path_factory.mktemp("conformance"))
    log_dir.mkdir(parents=True, exist_ok=True)
    out = {}
    with runner.Mount(log_dir / "daemon.log") as mount:
        for case in runner.with_instance_pass(selftests, runner.list_cases(selftests)):
            result = runner.run_case(mount.path, selftests, case, log_dir)
            out[case] = result
            if reporter is not None and capture is not None:
                with capture.global_and_fixture_disabled():
                    reporter.write_line(f"ftracetest {result.line()}")
    out["__cases__"] = set(runner.with_instance_pass(selftests, runner.list_cases(selftests)))
    return out


def test_every_case_has_an_expectation(results):
    assert results["__cases__"] == set(EXPECTED)


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_ftracetest_case(results, case):
    result = results.get(case)
    assert result is not None, f"{case} was not run"
    expected = EXPECTED[case]
    assert result.result == expected, f"{case}: {result.result}\n{result.log[-6000:]}"


def test_a_case_run_under_nohup_still_stops_its_loops_with_sighup(tmp_path):
    """The instance cases stop their background loops with ``kill -1``: a runner
    started under nohup (SIGHUP ignored, which children inherit) starts each case with
    SIGHUP at its default action, or those cases hang."""
    import signal
    out = tmp_path / "out"
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        status, _ = runner._run_limited(
            ["sh", "-c", "sleep 5 & p=$!; kill -1 $p; wait $p; echo $?"], out, 20)
    finally:
        signal.signal(signal.SIGHUP, before)
    assert status == 0
    assert out.read_text().split()[-1] == "129"     # 128 + SIGHUP: the sleep was hung up
