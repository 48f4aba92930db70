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
#define MODULE_PARM_DESC(name, s) __MODULE_INFO(parm, name##_parm, #name ":" s)

/* Module parameters: "parmtype=NAME:TYPE" in .modinfo, as Linux's modinfo has it, and
 * "parmvar=NAME:VARIABLE" naming the variable the loader writes NAME=VALUE into before
 * init runs (Linux keeps a __param table of kernel_params instead).  TYPE is int,
 * uint, long, ulong, bool or string (module_param_string: a char array, the value
 * NUL-terminated in it; ENOSPC when it does not fit).  The pointer kept beside them
 * takes the variable's address, so gcc keeps it a variable even if nothing writes it. */
#define __module_param(name, var, type) \
	__MODULE_INFO(parmtype, name##_type, #name ":" type); \
	__MODULE_INFO(parmvar, name##_var, #name ":" #var); \
	static void *__used __param_##name = &(var)
#define module_param_named(name, var, type, perm) __module_param(name, var, #type)
#define module_param(name, type, perm) module_param_named(name, name, type, perm)
#define module_param_string(name, string, len, perm) __module_param(name, string, "string")

/* What the module events report of a module; the host's loader keeps the module
 * itself and hands these to kernel/module.c. */
struct module_trace {
	const char *name;
	unsigned int taints;
	int refcnt;
};

#endif
