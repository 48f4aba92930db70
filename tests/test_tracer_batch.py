"""Lines merged by time and stretches of one second (tracing/buffers/batch.py), against
the plain ways: a stable sort of every line, each stamp's second."""

import random

import pytest

from kprobefs.tracing.buffers.batch import merge_lines, second_ranges


def sorted_merge(lines, stamps):
    pairs = [(stamp, line) for run, times in zip(lines, stamps)
             for line, stamp in zip(run, times)]
    return "".join(line for _stamp, line in sorted(pairs, key=lambda pair: pair[0]))


@pytest.mark.parametrize("stretch", [1, 3, 300, 5000])
@pytest.mark.parametrize("nruns", [1, 2, 3])
def test_merged_lines_are_a_stable_sort_of_them(stretch, nruns):
    # runs of ever later stamps, a stretch of one CPU at a time, with ties among them
    rng = random.Random(stretch * 10 + nruns)
    lines = [[] for _ in range(nruns)]
    stamps = [[] for _ in range(nruns)]
    now = 0
    for n in range(20_000 // stretch + 1):
        run = rng.randrange(nruns)
        for _ in range(rng.randrange(1, 2 * stretch)):
            now += rng.choice((0, 0, 1, 5))
            stamps[run].append(now)
            lines[run].append(f"{run}:{now}:{len(lines[run])}\n")
    assert merge_lines(lines, stamps) == sorted_merge(lines, stamps)
    assert merge_lines([[]] + lines, [[]] + stamps) == sorted_merge(lines, stamps)
    assert merge_lines(texts_of(lines), stamps, 4) == sorted_merge(lines, stamps)


def texts_of(lines):
    """Each run's lines as four texts a line (output.LINE_TEXTS), some empty."""
    return [[text for line in run for text in (line[:2], "", line[2:-1], line[-1])]
            for run in lines]


def test_events_are_told_apart_by_identity():
    # output._by_id: kprobe events hash by identity; others may be equal one to
    # another (NamedTuples) or not hashable: each event object stays one entry
    from collections import namedtuple
    from kprobefs.tracing.buffers.output import _by_id

    class Plain:
        pass

    class Unhashable:
        __hash__ = None

    Named = namedtuple("Named", "name")
    a, b = Plain(), Plain()
    same1, same2 = Named("x"), Named("x")
    odd = Unhashable()
    for events in ([a, b, a], [same1, same2, a], [odd, a, odd], [], [a, b] * 40,
                   [same1, same2, a] * 30, [odd, a] * 40):
        assert _by_id(events) == {id(ev): ev for ev in events}


def test_runs_out_of_time_order_merge_as_the_sort_does():
    rng = random.Random(7)
    stamps = [[rng.randrange(1000) for _ in range(3000)] for _ in range(2)]
    stamps[1].sort()
    lines = [[f"{r}:{i}\n" for i in range(len(run))] for r, run in enumerate(stamps)]
    assert merge_lines(lines, stamps) == sorted_merge(lines, stamps)
    assert merge_lines(texts_of(lines), stamps, 4) == sorted_merge(lines, stamps)


@pytest.mark.parametrize("in_order", [True, False])
def test_second_ranges_are_where_the_rounded_second_is_one(in_order):
    rng = random.Random(in_order)
    stamps = sorted(rng.randrange(5 * 10**9) for _ in range(2000)) + [
        10**9 - 501, 10**9 - 500, 10**9 - 499, 6 * 10**9 - 500]
    if in_order:
        stamps.sort()
    else:
        rng.shuffle(stamps)
    ranges = second_ranges(stamps)
    assert [start for start, _end, _second in ranges] == [0] + [
        end for _start, end, _second in ranges[:-1]]
    assert ranges[-1][1] == len(stamps)
    for start, end, second in ranges:
        assert start < end
        assert {(ts + 500) // 1000 // 1_000_000 for ts in stamps[start:end]} == {second}
    # each stretch as long as the second stays
    assert all(a[2] != b[2] for a, b in zip(ranges, ranges[1:]))
    if in_order:
        assert [second for _start, _end, second in ranges] == [0, 1, 2, 3, 4, 6]
    assert second_ranges([]) == []
