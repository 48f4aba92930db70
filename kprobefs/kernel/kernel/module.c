/* The module events.  Modules are placed, relocated and removed by the host's loader
 * (kprobefs/machine/module.py); it calls these in process context where 6.1's
 * load_module(), free_module(), try_module_get() and module_put() fire the events. */
#include "kernel.h"
#include "trace/events/module.h"

/* Held while a module is formed or taken apart (6.1's load_module and delete_module);
 * hostfs takes it for the loads and unloads written to kprobefs/modules. */
DEFINE_MUTEX(module_mutex);

/* After the module is formed, before its init runs. */
long module_trace_load(const char *name, unsigned int taints)
{
	struct module_trace mod = { .name = name, .taints = taints };

	trace_module_load(&mod);
	return 0;
}

/* The module's memory is about to go (after exit, or a failed init). */
long module_trace_free(const char *name)
{
	struct module_trace mod = { .name = name };

	trace_module_free(&mod);
	return 0;
}

/* A reference was taken (get != 0) or dropped at ip; refcnt is the count after it. */
long module_trace_refcnt(const char *name, int refcnt, unsigned long ip, int get)
{
	struct module_trace mod = { .name = name, .refcnt = refcnt };

	if (get)
		trace_module_get(&mod, ip);
	else
		trace_module_put(&mod, ip);
	return 0;
}
