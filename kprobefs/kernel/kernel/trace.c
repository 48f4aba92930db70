/* 6.1's kernel/trace/trace.c lock: held while a trace array's tracer, buffers or
 * options change and while instances come and go.  The host's tracer does that work;
 * hostfs takes this for the writes that ask for it (fs/hostfs.c). */
#include "kernel.h"

DEFINE_MUTEX(trace_types_lock);
