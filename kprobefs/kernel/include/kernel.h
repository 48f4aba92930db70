/* Core definitions of the kprobefs emulated kernel: types, compiler attributes, lists,
 * errno values, the hypercall ABI and the helpers every file uses.
 *
 * The kernel runs on Unicorn in ring 0 only; "user space" is the low half of the single
 * address space, where the host maps a window of pages for each task. */
#ifndef _KPF_KERNEL_H
#define _KPF_KERNEL_H

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long u64;
typedef signed char s8;
typedef short s16;
typedef int s32;
typedef long s64;
typedef unsigned long size_t;
typedef long ssize_t;
typedef long loff_t;
typedef int pid_t;
typedef unsigned short umode_t;
typedef unsigned int gfp_t;
typedef _Bool bool;
typedef unsigned long uintptr_t;
#define true 1
#define false 0
#define NULL ((void *)0)
#define __user
#define __force

#define __always_inline inline __attribute__((always_inline))
#define noinline __attribute__((noinline))
#define __noreturn __attribute__((noreturn))
#define notrace __attribute__((no_instrument_function))
#define __used __attribute__((used))
#define __section(s) __attribute__((section(s)))
#define __aligned(n) __attribute__((aligned(n)))
#define __packed __attribute__((packed))
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)
#define barrier() __asm__ __volatile__("" ::: "memory")
#define READ_ONCE(x) (*(const volatile typeof(x) *)&(x))
#define WRITE_ONCE(x, v) (*(volatile typeof(x) *)&(x) = (v))
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define offsetof(t, m) __builtin_offsetof(t, m)
#define container_of(ptr, type, member) \
	((type *)((char *)(ptr) - offsetof(type, member)))
#define min(a, b) ((a) < (b) ? (a) : (b))
#define max(a, b) ((a) > (b) ? (a) : (b))
#define ALIGN(x, a) (((x) + (a) - 1) & ~((typeof(x))(a) - 1))
#define BUILD_BUG_ON(c) _Static_assert(!(c), #c)

/* NOKPROBE_SYMBOL(fn) records fn in the table the loader turns into the kprobe
 * blacklist, as Linux's _kbl_addr section does. */
#define NOKPROBE_SYMBOL(fname) \
	static unsigned long __used __section("_kprobe_blacklist") \
	_kbl_addr_##fname = (unsigned long)fname

#define PAGE_SHIFT 12
#define PAGE_SIZE (1UL << PAGE_SHIFT)
#define THREAD_SIZE (16UL * 1024)
#define TASK_SIZE_MAX 0x00007ffffffff000UL
#define PAGE_OFFSET 0xffff888000000000UL
#define __va(pa) ((void *)((unsigned long)(pa) + PAGE_OFFSET))
#define __pa(va) ((unsigned long)(va) - PAGE_OFFSET)

#define EPERM 1
#define ENOENT 2
#define ESRCH 3
#define EINTR 4
#define EIO 5
#define ENXIO 6
#define E2BIG 7
#define EBADF 9
#define ECHILD 10
#define EAGAIN 11
#define ENOMEM 12
#define EACCES 13
#define EFAULT 14
#define EBUSY 16
#define EEXIST 17
#define EXDEV 18
#define ENOTDIR 20
#define EISDIR 21
#define EINVAL 22
#define ENFILE 23
#define EMFILE 24
#define ENOSPC 28
#define ESPIPE 29
#define EROFS 30
#define EPIPE 32
#define ERANGE 34
#define ENAMETOOLONG 36
#define ENOSYS 38
#define ENOTEMPTY 39
#define ELOOP 40
#define ENOTSOCK 88
#define EOPNOTSUPP 95
#define EAFNOSUPPORT 97
#define EADDRINUSE 98
#define EINVAL_LAST 4095
#define MAX_ERRNO 4095
#define IS_ERR_VALUE(x) unlikely((unsigned long)(x) >= (unsigned long)-MAX_ERRNO)
static inline void *ERR_PTR(long error) { return (void *)error; }
static inline long PTR_ERR(const void *ptr) { return (long)ptr; }
static inline bool IS_ERR(const void *ptr) { return IS_ERR_VALUE((unsigned long)ptr); }
static inline bool IS_ERR_OR_NULL(const void *ptr)
{
	return !ptr || IS_ERR_VALUE((unsigned long)ptr);
}

/* ---- doubly linked lists ---------------------------------------------------------- */
struct list_head {
	struct list_head *next, *prev;
};
#define LIST_HEAD_INIT(name) { &(name), &(name) }
#define LIST_HEAD(name) struct list_head name = LIST_HEAD_INIT(name)
static inline void INIT_LIST_HEAD(struct list_head *l) { l->next = l; l->prev = l; }
static inline void __list_add(struct list_head *n, struct list_head *prev,
			      struct list_head *next)
{
	next->prev = n;
	n->next = next;
	n->prev = prev;
	prev->next = n;
}
static inline void list_add(struct list_head *n, struct list_head *head)
{
	__list_add(n, head, head->next);
}
static inline void list_add_tail(struct list_head *n, struct list_head *head)
{
	__list_add(n, head->prev, head);
}
static inline void list_del_init(struct list_head *e)
{
	e->next->prev = e->prev;
	e->prev->next = e->next;
	INIT_LIST_HEAD(e);
}
static inline bool list_empty(const struct list_head *h) { return h->next == h; }
#define list_entry(ptr, type, member) container_of(ptr, type, member)
#define list_first_entry(ptr, type, member) list_entry((ptr)->next, type, member)
#define list_for_each_entry(pos, head, member) \
	for (pos = list_entry((head)->next, typeof(*pos), member); \
	     &pos->member != (head); \
	     pos = list_entry(pos->member.next, typeof(*pos), member))
#define list_for_each_entry_safe(pos, n, head, member) \
	for (pos = list_entry((head)->next, typeof(*pos), member), \
	     n = list_entry(pos->member.next, typeof(*pos), member); \
	     &pos->member != (head); \
	     pos = n, n = list_entry(n->member.next, typeof(*n), member))

/* ---- spinlocks (real atomics: the CPUs interleave at instruction granularity) ------ */
typedef struct {
	volatile int locked;
} spinlock_t;
#define __SPIN_LOCK_UNLOCKED { 0 }
#define DEFINE_SPINLOCK(x) spinlock_t x = __SPIN_LOCK_UNLOCKED
/* The CPUs take turns on one host thread, switching at hypercalls: a CPU that finds a
 * lock taken yields so that the holder can run and release it. */
static __always_inline void cpu_relax_yield(void);
static __always_inline void spin_lock(spinlock_t *l)
{
	while (__atomic_exchange_n(&l->locked, 1, __ATOMIC_ACQUIRE))
		while (READ_ONCE(l->locked))
			cpu_relax_yield();
}
static __always_inline void spin_unlock(spinlock_t *l)
{
	__atomic_store_n(&l->locked, 0, __ATOMIC_RELEASE);
}
static __always_inline int spin_trylock(spinlock_t *l)
{
	return !__atomic_exchange_n(&l->locked, 1, __ATOMIC_ACQUIRE);
}
typedef struct { volatile long counter; } atomic_long_t;
typedef struct { volatile int counter; } atomic_t;

/* kernel/locking.c: the out-of-line lock API.  A mutex is 6.1's: the owner task in one
 * word (its low bits flags), and a FIFO of tasks asleep waiting for it. */
struct task_struct;
struct mutex {
	atomic_long_t owner;		/* task_struct * | MUTEX_FLAG_* */
	spinlock_t wait_lock;
	struct list_head wait_list;	/* struct mutex_waiter, the first to have come first */
};
#define __MUTEX_INITIALIZER(name) { .owner = { 0 }, .wait_lock = __SPIN_LOCK_UNLOCKED, \
				    .wait_list = LIST_HEAD_INIT(name.wait_list) }
#define DEFINE_MUTEX(name) struct mutex name = __MUTEX_INITIALIZER(name)
#define mutex_init(lock) __mutex_init((lock), #lock, NULL)
void _raw_spin_lock(spinlock_t *lock);
int _raw_spin_trylock(spinlock_t *lock);
void _raw_spin_unlock(spinlock_t *lock);
void __mutex_init(struct mutex *lock, const char *name, void *key);
void mutex_lock(struct mutex *lock);
int mutex_lock_interruptible(struct mutex *lock);
int mutex_lock_killable(struct mutex *lock);
int mutex_trylock(struct mutex *lock);
void mutex_unlock(struct mutex *lock);
bool mutex_is_locked(struct mutex *lock);
bool mutex_owned_by_current(struct mutex *lock);
/* lockdep_assert_held() without lockdep: a warning when current does not own lock. */
#define lockdep_assert_held(lock) WARN_ON(!mutex_owned_by_current(lock))
static __always_inline void atomic_inc(atomic_t *v) { __atomic_add_fetch(&v->counter, 1, __ATOMIC_SEQ_CST); }
static __always_inline int atomic_dec_and_test(atomic_t *v)
{
	return __atomic_sub_fetch(&v->counter, 1, __ATOMIC_SEQ_CST) == 0;
}
static __always_inline int atomic_read(const atomic_t *v) { return READ_ONCE(v->counter); }
static __always_inline void atomic_set(atomic_t *v, int i) { WRITE_ONCE(v->counter, i); }

/* ---- hypercalls: `int $0x81`, rax = number, rdi/rsi/rdx/r10/r8 = arguments ---------- */
#define HYPERCALL_VECTOR 0x81
enum hypercall_nr {
	HC_IDLE = 1,		/* this CPU has nothing to run; returns a wake-up word */
	HC_SYSCALL_DONE = 2,	/* (ret): the current task returns to user mode */
	HC_TASK_NEW = 3,	/* (pid, parent pid, task): returns the user window base */
	HC_TASK_EXIT = 4,	/* (pid, exit code): the task is dead */
	HC_IRET = 5,		/* (pt_regs *): return from an exception frame */
	/* 6 was HC_CLOCK: ktime_get_ns reads the TSC itself (ktime_tsc) */
	HC_CONSOLE = 7,		/* (buf, len): a printk line, for the host log */
	HC_PANIC = 8,		/* (msg): the kernel cannot go on */
	/* The last argument of OPEN, READ, WRITE, MKDIR and RMDIR ("held"): whether the
	 * kernel holds mutexes across the call (fs/hostfs.c: hostfs_call). */
	HC_HOSTFS_LOOKUP = 16,	/* (dir id, name, &mode, &mutexes): child id or -errno */
	HC_HOSTFS_OPEN = 17,	/* (node id, f_flags, pid, 0, held): handle or -errno */
	HC_HOSTFS_READ = 18,	/* (handle, kbuf, count, pos, held): bytes or -errno */
	HC_HOSTFS_WRITE = 19,	/* (handle, kbuf, count, pos, held): bytes or -errno */
	HC_HOSTFS_RELEASE = 20,	/* (handle) */
	HC_HOSTFS_READDIR = 21,	/* (dir id, index, kbuf 256): child id, 0 at end */
	HC_UPCALL_DONE = 22,	/* (ret): an upcall the host asked for has returned */
	HC_BOOTED = 23,		/* start_kernel finished on the boot CPU */
	HC_YIELD = 24,		/* let another CPU run (a spin-wait) */
	HC_TRACE_COMM = 25,	/* (cpu): save the current task's comm for the trace */
	HC_TRACE_PAGE_FULL = 26,	/* (cpu): take the staged page; 0 = drop the event */
	HC_TRACE_WAKE = 27,	/* (cpu): a record was staged while a reader waits */
	HC_WORK_NEXT = 28,	/* (struct host_work *): 1 = run it, 0 = no work left */
	HC_WORK_DONE = 29,	/* (its return value, the op's result): the op's result */
	HC_TRACE_EVENT = 30,	/* (cpu, record, data length): a static event's record for
				 * the trace instances it is enabled in (TNP_HOST) */
	HC_HOSTFS_MKDIR = 40,	/* (dir id, name, mode, &mode, held): new child id or -errno */
	HC_HOSTFS_RMDIR = 41,	/* (dir id, name, 0, 0, held): 0 or -errno */
	HC_SELF_IPI = 42,	/* (vector): interrupt this CPU (the local APIC's self-IPI) */
	HC_TASK_FREE = 43,	/* (pid): the task is reaped (release_task) */
	HC_FTRACE_DIRECT = 50,	/* (1 register / 0 unregister, ip, addr): 0 or -errno */
	HC_KRETPROBE_MISSED = 51,	/* (id): a native kretprobe entry found no instance */
};

/* Kernel work the host asks for in process context (see kernel/host_work.c). */
struct host_work {
	unsigned long fn;
	unsigned long args[6];
	char data[512];		/* string arguments point in here */
};
long host_work_run(long result);

/* Wake-up words HC_IDLE returns (low byte = kind, rest = argument). */
#define IDLE_WAKE_TASK 1	/* wake the task whose pid is in bits 8.. */
#define IDLE_UPCALL 3		/* run the upcall in this CPU's upcall slot */

static __always_inline long hypercall5(long nr, long a1, long a2, long a3, long a4,
				       long a5)
{
	long ret;
	register long r10 __asm__("r10") = a4;
	register long r8 __asm__("r8") = a5;
	__asm__ __volatile__("int $0x81"
			     : "=a"(ret)
			     : "a"(nr), "D"(a1), "S"(a2), "d"(a3), "r"(r10), "r"(r8)
			     : "memory", "cc");
	return ret;
}
#define hypercall(nr, a1, a2, a3, a4) hypercall5(nr, (long)(a1), (long)(a2), \
						 (long)(a3), (long)(a4), 0)

static __always_inline void cpu_relax_yield(void)
{
	hypercall(HC_YIELD, 0, 0, 0, 0);
}

/* ---- lib ------------------------------------------------------------------------- */
/* A `rep movs` or `rep stos` of BULK_STRING_BYTES or more runs at an instruction listed
 * in __bulk_string: the emulator takes one iteration of a rep instruction a turn of its
 * loop, so the host carries out such an instruction whole, with its registers left as
 * the last iteration leaves them, where every page it touches is mapped for the access
 * (else the instruction runs, and faults, as any other).  Shorter ones stay with the
 * emulator, which does them faster than a call to the host. */
#define BULK_STRING_BYTES 16384
#define _ASM_BULK_STRING(insn) \
	".pushsection __bulk_string,\"a\"\n\t.balign 8\n\t.quad " #insn "\n\t.popsection\n\t"
void *memcpy(void *dst, const void *src, size_t n);
void *memset(void *s, int c, size_t n);
void *memmove(void *dst, const void *src, size_t n);
int memcmp(const void *a, const void *b, size_t n);
size_t strlen(const char *s);
size_t strnlen(const char *s, size_t max);
int strcmp(const char *a, const char *b);
int strncmp(const char *a, const char *b, size_t n);
char *strchr(const char *s, int c);
char *strrchr(const char *s, int c);
size_t strscpy(char *dst, const char *src, size_t size);
int kstrtol(const char *s, unsigned int base, long *res);
unsigned long simple_strtoul(const char *cp, char **endp, unsigned int base);
int vsnprintf(char *buf, size_t size, const char *fmt, __builtin_va_list args);
int snprintf(char *buf, size_t size, const char *fmt, ...);
int scnprintf(char *buf, size_t size, const char *fmt, ...);
u32 jhash(const void *key, u32 length, u32 initval);
u16 ip_fast_csum(const void *iph, unsigned int ihl);
u32 crc32_le(u32 crc, const u8 *p, size_t len);

/* ---- printk ------------------------------------------------------------------------ */
#define KERN_EMERG "<0>"
#define KERN_ERR "<3>"
#define KERN_WARNING "<4>"
#define KERN_INFO "<6>"
#define KERN_DEBUG "<7>"
int printk(const char *fmt, ...);
#define pr_info(fmt, ...) printk(KERN_INFO fmt, ##__VA_ARGS__)
#define pr_err(fmt, ...) printk(KERN_ERR fmt, ##__VA_ARGS__)
#define pr_warn(fmt, ...) printk(KERN_WARNING fmt, ##__VA_ARGS__)
void __noreturn panic(const char *fmt, ...);
#define BUG() do { __asm__ __volatile__("ud2"); __builtin_unreachable(); } while (0)
#define BUG_ON(c) do { if (unlikely(c)) BUG(); } while (0)
#define WARN_ON(c) ({							\
	int __c = !!(c);							\
	if (unlikely(__c)) {							\
		printk(KERN_WARNING "WARNING at %s:%d\n", __FILE__, __LINE__);	\
	}									\
	__c;									\
})

/* ---- memory ------------------------------------------------------------------------ */
#include "gfp.h"
#define NUMA_NO_NODE (-1)
#define _RET_IP_ ((unsigned long)__builtin_return_address(0))
void *alloc_pages_exact(size_t size, gfp_t gfp);
void free_pages_exact(void *addr, size_t size);
void *kmalloc(size_t size, gfp_t flags);
void *kzalloc(size_t size, gfp_t flags);
void kfree(const void *p);
char *kstrdup(const char *s, gfp_t gfp);
void mem_init(unsigned long start_pa, unsigned long end_pa);
extern unsigned long totalram_pages, nr_free_pages_count;

/* orig_ax of a task's pt_regs when the host wakes it for a run of its host process,
 * with no system call (kprobefs/machine/kernel.py: run_user); -1 is "no call". */
#define HOST_RUN (-2L)

/* ---- ftrace direct calls (kernel/ftrace.c) ------------------------------------------ */
int register_ftrace_direct(unsigned long ip, unsigned long addr);
int unregister_ftrace_direct(unsigned long ip, unsigned long addr);

/* ---- time -------------------------------------------------------------------------- */
#define HZ 250
extern volatile unsigned long jiffies;
u64 ktime_get_ns(void);

#endif
