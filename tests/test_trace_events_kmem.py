"""kmem:kmalloc and kmem:kfree, the kernel's allocator tracepoints, with Linux 6.1's
fields and print formats: the call site is kmalloc's caller, the gfp flags print by
their 6.1 names (GFP_KERNEL|__GFP_ZERO), and the hist keys ftracetest uses on them
(call_site.sym, bytes_req.log2) read the records."""

import re

from kprobefs.machine.abi import AT_FDCWD, O_CREAT, O_RDWR

from test_trace_events import COMMON, lines_of, traced  # noqa: F401  (fixture)
from test_tracer_e2e import read, write

KMALLOC_FIELDS = """\
\tfield:unsigned long call_site;\toffset:8;\tsize:8;\tsigned:0;
\tfield:const void * ptr;\toffset:16;\tsize:8;\tsigned:0;
\tfield:size_t bytes_req;\toffset:24;\tsize:8;\tsigned:0;
\tfield:size_t bytes_alloc;\toffset:32;\tsize:8;\tsigned:0;
\tfield:unsigned long gfp_flags;\toffset:40;\tsize:8;\tsigned:0;
\tfield:int node;\toffset:48;\tsize:4;\tsigned:1;

"""
KMALLOC_PRINT_HEAD = ('print fmt: "call_site=%pS ptr=%p bytes_req=%zu bytes_alloc=%zu '
                      'gfp_flags=%s node=%d accounted=%s", (void *)REC->call_site, '
                      'REC->ptr, REC->bytes_req, REC->bytes_alloc, (REC->gfp_flags) ? '
                      '__print_flags(REC->gfp_flags, "|", {')
KMALLOC_PRINT_TAIL = (' ) : "none", REC->node, (1 && (REC->gfp_flags & ( unsigned long)'
                      '(( gfp_t)0x400000u))) ? "true" : "false"\n')
KFREE = """\
\tfield:unsigned long call_site;\toffset:8;\tsize:8;\tsigned:0;
\tfield:const void * ptr;\toffset:16;\tsize:8;\tsigned:0;

print fmt: "call_site=%pS ptr=%p", (void *)REC->call_site, REC->ptr
"""


def test_kmalloc_and_kfree_formats_are_linux_6_1s(traced):
    _kernel, _tracer, root = traced
    event_id = int(read(root, "events/kmem/kmalloc/id"))
    text = read(root, "events/kmem/kmalloc/format")
    head = f"name: kmalloc\nID: {event_id}\nformat:\n" + COMMON + KMALLOC_FIELDS
    assert text.startswith(head + KMALLOC_PRINT_HEAD) and text.endswith(KMALLOC_PRINT_TAIL)
    # every gfp name of 6.1's table, in its order
    names = re.findall(r'"((?:__)?GFP_\w+)"\}', text)
    assert names[:3] == ["GFP_TRANSHUGE", "GFP_TRANSHUGE_LIGHT", "GFP_HIGHUSER_MOVABLE"]
    assert names[-1] == "__GFP_ZEROTAGS" and len(names) == 36
    assert "{( unsigned long)((( gfp_t)(0x400u|0x800u)) | (( gfp_t)0x40u) | " \
           "(( gfp_t)0x80u)), \"GFP_KERNEL\"}" in text
    event_id = int(read(root, "events/kmem/kfree/id"))
    assert read(root, "events/kmem/kfree/format") == (
        f"name: kfree\nID: {event_id}\nformat:\n" + COMMON + KFREE)


def test_allocations_are_recorded_with_their_callers(traced):
    kernel, _tracer, root = traced
    write(root, "set_event", "kmem:*")
    task = kernel.spawn("alloc")
    kernel.syscall(task, "fork")
    fd = kernel.syscall(task, "openat", AT_FDCWD, b"/tmp/kmem\0", O_CREAT | O_RDWR, 0o644)
    kernel.syscall(task, "close", fd)
    kernel.syscall(task, "unlinkat", AT_FDCWD, b"/tmp/kmem\0", 0)
    write(root, "set_event", "")
    allocs = lines_of(root, "kmalloc")
    assert any(re.search(r"kmalloc: call_site=dup_task_struct\+0x[0-9a-f]+/0x[0-9a-f]+ "
                         r"ptr=[0-9a-f]{16} bytes_req=\d+ bytes_alloc=\d+ "
                         r"gfp_flags=GFP_KERNEL\|__GFP_ZERO node=-1 accounted=false$", l)
               for l in allocs), allocs[:5]
    for line in allocs:
        req, alloc = map(int, re.search(r"bytes_req=(\d+) bytes_alloc=(\d+)", line).groups())
        assert req <= alloc
    assert any(re.search(r"kfree: call_site=\w+\+0x[0-9a-f]+/0x[0-9a-f]+ ptr=[0-9a-f]{16}$",
                         l) for l in lines_of(root, "kfree"))


def test_hist_keys_on_kmalloc(traced):
    kernel, _tracer, root = traced
    write(root, "events/kmem/kmalloc/trigger", "hist:keys=call_site.sym")
    write(root, "events/kmem/kmalloc/trigger", "hist:keys=bytes_req.log2")
    kernel.syscall(kernel.spawn("alloc"), "fork")
    hist = read(root, "events/kmem/kmalloc/hist")
    assert re.search(r"\{ call_site: \[[0-9a-f]+\] dup_task_struct *\}", hist), hist
    assert re.search(r"\{ bytes_req: ~ 2\^\d+ *\} hitcount: +\d+", hist), hist
