/* Every trace header, for kernel/trace_events.c's stages (no include guard: read once
 * a stage). */
#include "trace/events/sched.h"
#include "trace/events/syscalls.h"
#include "trace/events/net.h"
#include "trace/events/skb.h"
#include "trace/events/kmem.h"
