/* What a loadable module of the kprobefs kernel declares.  A module is a relocatable
 * object (compiled with -c and never linked, so its .ko is the compiler's output); the
 * host's loader (kprobefs/machine/module.py) places its sections in the module area,
 * resolves its undefined symbols against the kernel's global symbols, applies the
 * relocations and calls init_module(); cleanup_module() runs when it is unloaded.
 *
 * module_init()/module_exit() name those two entry points by alias, as Linux's do, so
 * kallsyms lists both names at one address.  MODULE_*() strings go to .modinfo, which
 * the loader reads and never maps. */
#ifndef _KPF_MODULE_H
#define _KPF_MODULE_H

#include "kernel.h"

#define module_init(fn) \
	int init_module(void) __attribute__((alias(#fn)));
#define module_exit(fn) \
	void cleanup_module(void) __attribute__((alias(#fn)));

#define __MODULE_INFO(tag, name, info) \
	static const char __modinfo_##name[] __used __section(".modinfo") \
	__aligned(1) = #tag "=" info
#define MODULE_LICENSE(s) __MODULE_INFO(license, license, s)
#define MODULE_AUTHOR(s) __MODULE_INFO(author, author, s)
#define MODULE_DESCRIPTION(s) __MODULE_INFO(description, description, s)

/* What the module events report of a module; the host's loader keeps the module
 * itself and hands these to kernel/module.c. */
struct module_trace {
	const char *name;
	unsigned int taints;
	int refcnt;
};

#endif
