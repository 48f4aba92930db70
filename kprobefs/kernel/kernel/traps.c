/* Exception handlers.  The host delivers a fault by building a pt_regs frame and
 * entering the matching asm_exc_* stub; these handlers fix the fault up through the
 * exception table or kill the task (an oops), and the kernel keeps running. */
#include "sched.h"
#include "uaccess.h"

extern const struct exception_table_entry __start___ex_table[], __stop___ex_table[];

/* 6.1's kernel/extable.c has it: held while kernel text changes.  The host patches the
 * text (probes, ftrace sites); hostfs takes it for the writes that do (fs/hostfs.c). */
DEFINE_MUTEX(text_mutex);

/* The exception table is sorted by address (the linker keeps object order, and within
 * an object entries follow the code), so a binary search would do; the table is small
 * and may be unsorted across objects, so scan it. */
const struct exception_table_entry *search_exception_tables(unsigned long addr)
{
	const struct exception_table_entry *e;

	for (e = __start___ex_table; e < __stop___ex_table; e++)
		if (e->insn == addr)
			return e;
	return NULL;
}
NOKPROBE_SYMBOL(search_exception_tables);

int fixup_exception(struct pt_regs *regs, int trapnr, unsigned long error_code,
		    unsigned long fault_addr)
{
	const struct exception_table_entry *e = search_exception_tables(regs->ip);

	if (!e)
		return 0;
	regs->ip = e->fixup;
	return 1;
}
NOKPROBE_SYMBOL(fixup_exception);

/* ---- the die notifier chain, as kprobes' old x86 code hooked into it ---------------- */
struct notifier_block {
	int (*notifier_call)(struct notifier_block *nb, unsigned long action, void *data);
	struct notifier_block *next;
	int priority;
};
struct die_args {
	struct pt_regs *regs;
	const char *str;
	long err;
	int trapnr;
	int signr;
};
#define NOTIFY_DONE 0x0000
#define NOTIFY_STOP_MASK 0x8000
#define NOTIFY_STOP (NOTIFY_STOP_MASK | 0x0001)
enum die_val { DIE_OOPS = 1, DIE_INT3, DIE_DEBUG, DIE_PAGE_FAULT, DIE_TRAP, DIE_GPF };

static struct notifier_block *die_chain;

int notifier_call_chain(struct notifier_block **nl, unsigned long val, void *v,
			int nr_to_call, int *nr_calls)
{
	int ret = NOTIFY_DONE;
	struct notifier_block *nb = READ_ONCE(*nl);

	while (nb && nr_to_call) {
		struct notifier_block *next_nb = READ_ONCE(nb->next);

		ret = nb->notifier_call(nb, val, v);
		if (nr_calls)
			(*nr_calls)++;
		if (ret & NOTIFY_STOP_MASK)
			break;
		nb = next_nb;
		nr_to_call--;
	}
	return ret;
}
NOKPROBE_SYMBOL(notifier_call_chain);

int register_die_notifier(struct notifier_block *nb)
{
	struct notifier_block **nl = &die_chain;

	while (*nl && (*nl)->priority >= nb->priority)
		nl = &(*nl)->next;
	nb->next = *nl;
	*nl = nb;
	return 0;
}

int notify_die(enum die_val val, const char *str, struct pt_regs *regs, long err,
	       int trap, int sig)
{
	struct die_args args = { regs, str, err, trap, sig };

	return notifier_call_chain(&die_chain, val, &args, -1, NULL);
}
NOKPROBE_SYMBOL(notify_die);

unsigned long oops_count;

static void show_regs(struct pt_regs *regs)
{
	printk(KERN_EMERG "RIP: %016lx RSP: %016lx EFLAGS: %08lx\n", regs->ip, regs->sp,
	       regs->flags);
	printk(KERN_EMERG "RAX: %016lx RBX: %016lx RCX: %016lx\n", regs->ax, regs->bx,
	       regs->cx);
	printk(KERN_EMERG "RDX: %016lx RSI: %016lx RDI: %016lx\n", regs->dx, regs->si,
	       regs->di);
}

/* An unrecoverable kernel-mode fault: report it and kill the current task. */
void __noreturn die(const char *str, struct pt_regs *regs, long err, int signr)
{
	struct task_struct *tsk = current;

	notify_die(DIE_OOPS, str, regs, err, 0, signr);
	oops_count++;
	printk(KERN_EMERG "Oops: %s: %04lx [#%lu] CPU: %d PID: %d Comm: %s\n", str, err,
	       oops_count, smp_processor_id(), tsk->pid, tsk->comm);
	show_regs(regs);
	if (tsk->flags & PF_IDLE)
		panic("Attempted to kill the idle task!");
	make_task_dead(signr);
}
NOKPROBE_SYMBOL(die);

#define SIGTRAP 5
#define SIGBUS 7
#define SIGKILL 9
#define SIGSEGV 11
#define SIGFPE 8
#define SIGILL 4

void exc_page_fault(struct pt_regs *regs, unsigned long error_code)
{
	unsigned long address;

	__asm__ __volatile__("movq %%cr2, %0" : "=r"(address));
	if (notify_die(DIE_PAGE_FAULT, "page fault", regs, error_code, 14, SIGSEGV) ==
	    NOTIFY_STOP)
		return;
	if (fixup_exception(regs, 14, error_code, address))
		return;
	printk(KERN_EMERG "BUG: unable to handle page fault for address: %016lx\n", address);
	die("page fault", regs, error_code, SIGKILL);
}
NOKPROBE_SYMBOL(exc_page_fault);

void exc_general_protection(struct pt_regs *regs, unsigned long error_code)
{
	if (fixup_exception(regs, 13, error_code, 0))
		return;
	die("general protection fault", regs, error_code, SIGSEGV);
}
NOKPROBE_SYMBOL(exc_general_protection);

void exc_invalid_op(struct pt_regs *regs)
{
	printk(KERN_EMERG "kernel BUG at %016lx!\n", regs->ip);
	die("invalid opcode", regs, 0, SIGILL);
}
NOKPROBE_SYMBOL(exc_invalid_op);

void exc_divide_error(struct pt_regs *regs)
{
	die("divide error", regs, 0, SIGFPE);
}
NOKPROBE_SYMBOL(exc_divide_error);

/* The host's lockup detector, delivered as an NMI with the seconds in the error-code
 * slot: the current task has been in the kernel that long without finishing (a spin
 * with no hypercall, or a system call the host gave up on).  Reported the way Linux's
 * soft-lockup watchdog reports one, then the task is killed as by an oops.  The host
 * never sends it to an idle task. */
void exc_nmi(struct pt_regs *regs, unsigned long seconds)
{
	struct task_struct *tsk = current;

	printk(KERN_EMERG "watchdog: BUG: soft lockup - CPU#%d stuck for %lus! [%s:%d]\n",
	       smp_processor_id(), seconds, tsk->comm, tsk->pid);
	die("soft lockup", regs, 0, SIGKILL);
}
NOKPROBE_SYMBOL(exc_nmi);

/* An int3 no kprobe claimed.  Its ip points past the int3. */
void exc_int3(struct pt_regs *regs)
{
	if (notify_die(DIE_INT3, "int3", regs, 0, 3, SIGTRAP) == NOTIFY_STOP)
		return;
	die("int3", regs, 0, SIGTRAP);
}
NOKPROBE_SYMBOL(exc_int3);

void exc_debug(struct pt_regs *regs)
{
	if (notify_die(DIE_DEBUG, "debug", regs, 0, 1, SIGTRAP) == NOTIFY_STOP)
		return;
	regs->flags &= ~0x100UL;
}
NOKPROBE_SYMBOL(exc_debug);

void __noreturn panic(const char *fmt, ...)
{
	static char buf[256];
	__builtin_va_list args;

	__builtin_va_start(args, fmt);
	vsnprintf(buf, sizeof(buf), fmt, args);
	__builtin_va_end(args);
	printk(KERN_EMERG "Kernel panic - not syncing: %s\n", buf);
	for (;;)
		hypercall(HC_PANIC, buf, 0, 0, 0);
}
