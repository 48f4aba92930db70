"""The steps of ``trace`` text made in bulk (output.TraceFormatter) that are not a map.

A full buffer holds tens of thousands of records, and a Python statement per record costs
more than its line's formatting.  The formatter makes each column of the lines with
``map`` and ``zip`` over all of a CPU's records, the texts of a column looked up by
value, so that Python runs only where a value is new.  What is left: where the seconds
of the timestamps change (second_ranges) and the merge of the CPUs' lines by time
(merge_lines).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import chain, compress, islice, repeat
from operator import add, floordiv, le, ne
from typing import Sequence

__all__ = ["second_ranges", "merge_lines"]

_NS_PER_S = 1_000_000_000


def second_ranges(stamps: Sequence[int]) -> list[tuple[int, int, int]]:
    """(start, end, second) of each stretch of ``stamps`` (nanoseconds) whose timestamp
    prints with one seconds part (microseconds rounded as format_timestamp rounds
    them), in order: a few stretches found by bisection when the stamps are in time
    order, else wherever the second changes."""
    count = len(stamps)
    if not count:
        return []
    if all(map(le, stamps, islice(stamps, 1, None))):
        out, start = [], 0
        while start < count:
            second = (stamps[start] + 500) // _NS_PER_S
            end = bisect_left(stamps, (second + 1) * _NS_PER_S - 500, start)
            out.append((start, end, second))
            start = end
        return out
    seconds = list(map(floordiv, map(add, stamps, repeat(500)), repeat(_NS_PER_S)))
    starts = [0, *compress(range(1, count), map(ne, seconds, islice(seconds, 1, None)))]
    return list(zip(starts, starts[1:] + [count], map(seconds.__getitem__, starts)))


def merge_lines(lines: Sequence[list[str]], stamps: Sequence[Sequence[int]],
                width: int = 1) -> str:
    """The lines of several runs (``lines[r]``, ``width`` texts a line one after
    another, in time order, ``stamps[r]`` their timestamps) joined in timestamp order,
    a tie going to the earlier run: the order a stable sort of all of them by
    timestamp gives.  Taken a stretch of one run at a time (where the next run's line
    falls, by bisection) while the stretches are long, as CPUs' records mostly are (a
    task runs a while on one CPU); the rest, when they turn out short (or a run is out
    of time order), by that sort."""
    parts: list = []
    at = [0] * len(lines)
    live = [r for r in range(len(lines)) if lines[r]]
    steps = sum(map(len, stamps)) >> 8
    if not all(all(map(le, stamps[r], islice(stamps[r], 1, None))) for r in live):
        steps = 0               # a run out of time order: the sort alone
    while len(live) > 1 and steps > 0:
        steps -= 1
        _stamp, r = min([(stamps[i][at[i]], i) for i in live])
        mine, start = stamps[r], at[r]
        end = len(mine)
        for other in live:
            if other != r:
                head = stamps[other][at[other]]
                # the other run's next line comes after this run's of its time when
                # it is a later run, before them when an earlier one
                end = min(end, bisect_right(mine, head, start) if other > r
                          else bisect_left(mine, head, start))
        parts.append(lines[r][start * width:end * width])
        at[r] = end
        if end == len(mine):
            live.remove(r)
    rest = [lines[r][at[r] * width:] for r in live]
    if len(rest) == 1:
        parts += rest
    elif rest:
        rest_lines = list(chain.from_iterable(rest))
        if width > 1:           # a tuple a line
            rest_lines = list(zip(*[iter(rest_lines)] * width))
        rest_stamps = list(chain.from_iterable(stamps[r][at[r]:] for r in live))
        order = map(rest_lines.__getitem__, sorted(range(len(rest_stamps)),
                                                   key=rest_stamps.__getitem__))
        parts.append(chain.from_iterable(order) if width > 1 else order)
    return "".join(chain.from_iterable(parts))
