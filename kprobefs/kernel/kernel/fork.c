/* Process creation: kernel_clone() and copy_process(), as in Linux 6.1's kernel/fork.c. */
#include "sched.h"
#include "trace/events/sched.h"
#include "fs.h"
#include "syscalls.h"
#include "uaccess.h"
#include "mm.h"

#define CLONE_VM 0x00000100
#define CLONE_FS 0x00000200
#define CLONE_FILES 0x00000400
#define CLONE_THREAD 0x00010000
#define CLONE_SETTID_MASK 0

unsigned long total_forks;
int nr_threads;
DEFINE_SPINLOCK(tasklist_lock);
LIST_HEAD(task_list_head);

static struct task_struct *alloc_task_struct_node(void)
{
	return kzalloc(sizeof(struct task_struct), GFP_KERNEL);
}

static void *alloc_thread_stack_node(struct task_struct *tsk)
{
	void *stack = alloc_pages_exact(THREAD_SIZE, GFP_KERNEL | __GFP_ZERO);

	tsk->stack = stack;
	if (stack)
		__atomic_add_fetch(&nr_kernel_stack_pages, THREAD_SIZE / PAGE_SIZE,
				   __ATOMIC_RELAXED);
	return stack;
}

void put_task_stack(struct task_struct *tsk)
{
	if (tsk->stack && tsk != &init_task && !(tsk->flags & PF_IDLE)) {
		free_pages_exact(tsk->stack, THREAD_SIZE);
		tsk->stack = NULL;
		__atomic_sub_fetch(&nr_kernel_stack_pages, THREAD_SIZE / PAGE_SIZE,
				   __ATOMIC_RELAXED);
	}
}

static noinline struct task_struct *dup_task_struct(struct task_struct *orig)
{
	struct task_struct *tsk = alloc_task_struct_node();

	if (!tsk)
		return NULL;
	if (!alloc_thread_stack_node(tsk)) {
		kfree(tsk);
		return NULL;
	}
	memcpy(tsk->comm, orig->comm, TASK_COMM_LEN);
	/* sched_fork(): the child keeps its parent's policy and nice, not a boost. */
	tsk->prio = orig->normal_prio;
	tsk->static_prio = orig->static_prio;
	tsk->normal_prio = orig->normal_prio;
	tsk->policy = orig->policy;
	tsk->rt_priority = orig->rt_priority;
	memcpy(tsk->sig_action, orig->sig_action, sizeof(tsk->sig_action));
	tsk->flags = orig->flags & ~(PF_IDLE | PF_EXITING);
	INIT_LIST_HEAD(&tsk->run_list);
	INIT_LIST_HEAD(&tsk->children);
	INIT_LIST_HEAD(&tsk->sibling);
	INIT_LIST_HEAD(&tsk->tasks);
	INIT_LIST_HEAD(&tsk->pid_chain);
	INIT_LIST_HEAD(&tsk->kretprobe_instances);
	INIT_LIST_HEAD(&tsk->kretprobe_native_instances);
	init_waitqueue_head(&tsk->wait_chldexit);
	return tsk;
}

static noinline int copy_mm(u64 clone_flags, struct task_struct *tsk)
{
	struct mm_struct *mm;
	long base;

	if (tsk->flags & PF_KTHREAD)
		return 0;
	mm = kzalloc(sizeof(*mm), GFP_KERNEL);
	if (!mm)
		return -ENOMEM;
	base = hypercall(HC_TASK_NEW, tsk->pid, current->pid, (unsigned long)tsk, 0);
	if (base < 0) {
		kfree(mm);
		return (int)base;
	}
	mm->start = base;
	mm->size = 16UL << 20;
	atomic_set(&mm->users, 1);
	tsk->mm = mm;
	return 0;
}

static noinline int copy_files(u64 clone_flags, struct task_struct *tsk)
{
	int err = 0;
	struct files_struct *old = current->files;

	if (!old)
		return 0;
	if (clone_flags & CLONE_FILES) {
		atomic_inc(&old->count);
		return 0;
	}
	tsk->files = dup_fd(old, &err);
	return err;
}

static noinline int copy_fs(u64 clone_flags, struct task_struct *tsk)
{
	struct fs_struct *fs = current->fs;

	if (!fs)
		return 0;
	if (clone_flags & CLONE_FS) {
		atomic_inc(&fs->users);
		return 0;
	}
	tsk->fs = copy_fs_struct(fs);
	return tsk->fs ? 0 : -ENOMEM;
}

/* The new task's first switch lands in ret_from_fork with fn/arg in rbx/r12. */
static noinline void copy_thread(struct task_struct *p, struct kernel_clone_args *args)
{
	struct inactive_task_frame {
		unsigned long r15, r14, r13, r12, bx, bp, ret_addr;
	} *frame;
	struct pt_regs *childregs = task_pt_regs(p);

	frame = (struct inactive_task_frame *)childregs - 1;
	memset(frame, 0, sizeof(*frame));
	frame->ret_addr = (unsigned long)ret_from_fork;
	frame->bx = (unsigned long)args->fn;
	frame->r12 = (unsigned long)args->fn_arg;
	p->thread.sp = (unsigned long)frame;
	if (!args->fn) {
		*childregs = *task_pt_regs(current);
		childregs->ax = 0;
	} else {
		memset(childregs, 0, sizeof(*childregs));
	}
}

static void free_mm(struct mm_struct *mm)
{
	kfree(mm);
}

static noinline struct task_struct *copy_process(struct kernel_clone_args *args)
{
	struct task_struct *p;
	pid_t pid;
	int retval;

	p = dup_task_struct(current);
	if (!p)
		return ERR_PTR(-ENOMEM);
	pid = alloc_pid(p, args->set_tid, args->set_tid_size);
	if (pid < 0) {
		retval = pid;
		goto bad_fork_free;
	}
	p->pid = pid;
	p->tgid = pid;
	p->exit_signal = args->exit_signal;
	p->start_time = ktime_get_ns();
	if (args->fn)
		p->flags |= PF_KTHREAD;
	else
		p->flags &= ~PF_KTHREAD;
	retval = copy_files(args->flags, p);
	if (retval)
		goto bad_fork_free_pid;
	retval = copy_fs(args->flags, p);
	if (retval)
		goto bad_fork_cleanup_files;
	retval = copy_mm(args->flags, p);
	if (retval)
		goto bad_fork_cleanup_fs;
	copy_thread(p, args);

	_raw_spin_lock(&tasklist_lock);
	p->real_parent = current;
	list_add_tail(&p->sibling, &current->children);
	list_add_tail(&p->tasks, &task_list_head);
	nr_threads++;
	total_forks++;
	_raw_spin_unlock(&tasklist_lock);
	return p;

bad_fork_cleanup_fs:
	exit_fs(p);
bad_fork_cleanup_files:
	exit_files(p);
bad_fork_free_pid:
	free_pid(p);
bad_fork_free:
	put_task_stack(p);
	kfree(p);
	return ERR_PTR(retval);
}

noinline pid_t kernel_clone(struct kernel_clone_args *args)
{
	struct task_struct *p;
	pid_t nr;

	p = copy_process(args);
	if (IS_ERR(p))
		return PTR_ERR(p);
	trace_sched_process_fork(current, p);
	trace_event_pid_fork(current, p);
	nr = p->pid;
	wake_up_new_task(p);
	return nr;
}

/* Start a kernel thread running fn(arg). */
pid_t kernel_thread(int (*fn)(void *), void *arg, const char *name)
{
	struct kernel_clone_args args = { .fn = fn, .fn_arg = arg, .exit_signal = 17 };
	pid_t pid = kernel_clone(&args);

	if (pid > 0)
		__set_task_comm(find_task_by_vpid(pid), name, false);
	return pid;
}

SYSCALL_DECL(fork)
{
	struct kernel_clone_args args = { .exit_signal = 17 };

	return kernel_clone(&args);
}

SYSCALL_DECL(clone)
{
	struct kernel_clone_args args = {
		.flags = regs->di & ~0xffUL,
		.exit_signal = regs->di & 0xff,
	};

	return kernel_clone(&args);
}

struct clone_args {
	u64 flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls;
	u64 set_tid, set_tid_size, cgroup;
};

SYSCALL_DECL(clone3)
{
	struct clone_args uargs;
	pid_t tids[1];
	size_t size = regs->si;
	struct kernel_clone_args args = { 0 };

	if (size < 64 || size > sizeof(uargs))
		return -EINVAL;
	memset(&uargs, 0, sizeof(uargs));
	if (copy_from_user(&uargs, (const void __user *)regs->di, size))
		return -EFAULT;
	if (uargs.set_tid_size > 1)
		return -EINVAL;
	if (uargs.set_tid_size) {
		if (copy_from_user(tids, (const void __user *)uargs.set_tid, sizeof(tids)))
			return -EFAULT;
		args.set_tid = tids;
		args.set_tid_size = 1;
	}
	args.flags = uargs.flags;
	args.exit_signal = (int)uargs.exit_signal;
	return kernel_clone(&args);
}
