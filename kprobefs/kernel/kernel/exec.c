/* execve() and execveat(), as far as a kernel without user images goes (Linux 6.1's
 * fs/exec.c): the file is found through the VFS and must be a regular file, argv and
 * envp are walked (a bad pointer is EFAULT, too many strings E2BIG), then the task takes
 * the program's name as its comm and sched_process_exec fires.  There is no image to
 * load: the task goes on waiting for system calls, now as the new program. */
#include "sched.h"
#include "trace/events/sched.h"
#include "fs.h"
#include "syscalls.h"
#include "uaccess.h"

/* This kernel's own bound on the strings walked: a task's user window is 16 MiB. */
#define EXEC_ARG_LIMIT (1 << 16)

/* The number of strings in a NULL-ended user array of string pointers (a NULL array
 * has none), or -EFAULT / -E2BIG. */
static int count_strings(const char __user *const __user *argv)
{
	int i;

	if (!argv)
		return 0;
	for (i = 0; i < EXEC_ARG_LIMIT; i++) {
		const char __user *p;

		if (get_user(p, argv + i))
			return -EFAULT;
		if (!p)
			return i;
		if (strnlen_user(p, PAGE_SIZE * 32) <= 0)
			return -EFAULT;
	}
	return -E2BIG;
}

static const char *kbasename(const char *path)
{
	const char *tail = strrchr(path, '/');

	return tail ? tail + 1 : path;
}

static noinline int do_execveat_common(int fd, struct filename *filename,
				       const char __user *const __user *argv,
				       const char __user *const __user *envp, int flags)
{
	char fdpath[64 + 16];
	const char *bprm_filename = filename->name;
	struct path path;
	struct inode *inode;
	pid_t old_pid = current->pid;
	int retval;

	if (flags & ~(AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW))
		return -EINVAL;
	retval = count_strings(argv);
	if (retval < 0)
		return retval;
	retval = count_strings(envp);
	if (retval < 0)
		return retval;
	if (!filename->name[0] && !(flags & AT_EMPTY_PATH))
		return -ENOENT;
	retval = filename_lookup(fd, filename,
				 (flags & AT_SYMLINK_NOFOLLOW) ? 0 : LOOKUP_FOLLOW, &path);
	if (retval)
		return retval;
	inode = d_inode(path.dentry);
	retval = -ELOOP;	/* AT_SYMLINK_NOFOLLOW and the name is a symlink */
	if (inode && S_ISLNK(inode->i_mode))
		goto out;
	retval = -EACCES;
	if (!inode || !S_ISREG(inode->i_mode) || !(inode->i_mode & 0111))
		goto out;
	/* bprm->filename: the name as given, or /dev/fd/N[/name] relative to a descriptor. */
	if (fd != AT_FDCWD && filename->name[0] != '/') {
		if (filename->name[0])
			snprintf(fdpath, sizeof(fdpath), "/dev/fd/%d/%s", fd, filename->name);
		else
			snprintf(fdpath, sizeof(fdpath), "/dev/fd/%d", fd);
		bprm_filename = fdpath;
	}
	__set_task_comm(current, kbasename(filename->name), true);
	flush_signal_handlers(current);
	trace_sched_process_exec(current, old_pid, bprm_filename);
	retval = 0;
out:
	path_put(&path);
	return retval;
}

SYSCALL_DECL(execve)
{
	struct filename *filename = getname((const char __user *)regs->di);
	int ret;

	if (IS_ERR(filename))
		return PTR_ERR(filename);
	ret = do_execveat_common(AT_FDCWD, filename,
				 (const char __user *const __user *)regs->si,
				 (const char __user *const __user *)regs->dx, 0);
	putname(filename);
	return ret;
}

SYSCALL_DECL(execveat)
{
	int flags = (int)regs->r8;
	struct filename *filename = getname_flags((const char __user *)regs->si,
						  flags & AT_EMPTY_PATH ? LOOKUP_EMPTY : 0,
						  NULL);
	int ret;

	if (IS_ERR(filename))
		return PTR_ERR(filename);
	ret = do_execveat_common((int)regs->di, filename,
				 (const char __user *const __user *)regs->dx,
				 (const char __user *const __user *)regs->r10, flags);
	putname(filename);
	return ret;
}

/* For the host: a program it knows to exist (a mirrored host process exec'd it, or the
 * workload runs it) as an empty executable file at path in the rootfs, with its
 * directories, so that an execve of path finds it.  0, or the first error other than
 * EEXIST (path must be absolute). */
long host_binary_create(const char *path)
{
	struct fs_struct *saved_fs = current->fs;
	size_t i, len = strlen(path);
	char *dir;
	int err = 0;

	if (path[0] != '/' || len >= PATH_MAX)
		return -EINVAL;
	dir = kmalloc(PATH_MAX, GFP_KERNEL);
	if (!dir)
		return -ENOMEM;
	/* An upcall runs on an idle task, which has no fs: walk from init_fs, as Linux's
	 * kernel threads do. */
	if (!saved_fs)
		current->fs = &init_fs;
	for (i = 1; i < len && (!err || err == -EEXIST); i++) {
		if (path[i] != '/')
			continue;
		memcpy(dir, path, i);
		dir[i] = '\0';
		err = init_mkdir(dir, 0755);
	}
	if (!err || err == -EEXIST)
		err = init_mknod(path, S_IFREG | 0755, 0);
	current->fs = saved_fs;
	kfree(dir);
	return err == -EEXIST ? 0 : err;
}
