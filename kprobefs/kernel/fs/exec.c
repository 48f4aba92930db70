/* execve(2), as far as this kernel runs programs.  A task here is the shadow of a host
 * process, and the host runs the program: an exec the host reports is this system call,
 * which gives the task its new name from the file name, as begin_new_exec() does
 * (__set_task_comm(current, kbasename(bprm->filename), true)).  No image is loaded. */
#include "fs.h"
#include "sched.h"
#include "syscalls.h"

static const char *kbasename(const char *path)
{
	const char *tail = strrchr(path, '/');

	return tail ? tail + 1 : path;
}

static noinline int do_execveat_common(int fd, struct filename *filename,
				       const char __user *const __user *argv,
				       const char __user *const __user *envp, int flags)
{
	if (IS_ERR(filename))
		return PTR_ERR(filename);
	__set_task_comm(current, kbasename(filename->name), true);
	putname(filename);
	return 0;
}

noinline int do_execve(struct filename *filename,
		       const char __user *const __user *argv,
		       const char __user *const __user *envp)
{
	return do_execveat_common(AT_FDCWD, filename, argv, envp, 0);
}

SYSCALL_DECL(execve)
{
	return do_execve(getname((const char __user *)regs->di),
			 (const char __user *const __user *)regs->si,
			 (const char __user *const __user *)regs->dx);
}
