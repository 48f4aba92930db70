/* open(), openat2(), close(), chdir() and truncation. */
#include "fs.h"
#include "syscalls.h"
#include "uaccess.h"

#define VALID_OPEN_FLAGS (O_RDONLY | O_WRONLY | O_RDWR | O_CREAT | O_EXCL | O_NOCTTY | \
			  O_TRUNC | O_APPEND | O_NONBLOCK | O_DIRECTORY | O_NOFOLLOW | \
			  O_CLOEXEC | O_LARGEFILE | O_PATH | 010000 | 020000 | 040000 | \
			  01000000 | 04000000 | __O_TMPFILE)
#define O_PATH_FLAGS (O_DIRECTORY | O_NOFOLLOW | O_PATH | O_CLOEXEC)
#define WILL_CREATE(flags) ((flags) & (O_CREAT | __O_TMPFILE))
#define S_IALLUGO 07777

int do_truncate(struct user_namespace *mnt_userns, struct dentry *dentry, loff_t length,
		unsigned int time_attrs, struct file *filp)
{
	struct inode *inode = dentry->d_inode;
	struct iattr newattrs = { .ia_valid = ATTR_SIZE | time_attrs, .ia_size = length };
	int error;

	if (length < 0)
		return -EINVAL;
	/* Files whose filesystem keeps no size (hostfs) have nothing to cut. */
	if (!inode->i_op || !inode->i_op->setattr)
		return 0;
	inode_lock(inode);
	error = inode->i_op->setattr(mnt_userns, dentry, &newattrs);
	inode_unlock(inode);
	return error;
}

/* Sets f_op and calls its ->open; on failure the file is left unopened. */
static int do_dentry_open(struct file *f, struct inode *inode,
			  int (*open)(struct inode *, struct file *))
{
	int error;

	f->f_inode = inode;
	f->f_mode |= FMODE_LSEEK | FMODE_PREAD | FMODE_PWRITE;
	f->f_op = inode->i_fop;
	if (unlikely(!f->f_op)) {
		error = -ENODEV;
		goto cleanup;
	}
	if (!open)
		open = f->f_op->open;
	if (open) {
		error = open(inode, f);
		if (error)
			goto cleanup;
	}
	f->f_mode |= FMODE_OPENED;
	if ((f->f_mode & FMODE_READ) && f->f_op->read)
		f->f_mode |= FMODE_CAN_READ;
	if ((f->f_mode & FMODE_WRITE) && f->f_op->write)
		f->f_mode |= FMODE_CAN_WRITE;
	/* ->open has seen them (hostfs passes O_TRUNC to the host); they mean no more. */
	f->f_flags &= ~(O_CREAT | O_EXCL | O_NOCTTY | O_TRUNC);
	return 0;

cleanup:
	f->f_op = NULL;
	f->f_inode = NULL;
	path_put(&f->f_path);
	f->f_path.dentry = NULL;
	return error;
}

int vfs_open(const struct path *path, struct file *file)
{
	file->f_path = *path;
	path_get(path);
	return do_dentry_open(file, path->dentry->d_inode, NULL);
}

static inline int build_open_flags(const struct open_how *how, struct open_flags *op)
{
	u64 flags = how->flags;
	int lookup_flags = 0;
	int acc_mode;

	flags &= ~(u64)O_CLOEXEC;
	/* open() and openat() cleared what is not valid; openat2() checks it all. */
	if (flags & ~(u64)VALID_OPEN_FLAGS)
		return -EINVAL;
	if (how->resolve & ~(u64)VALID_RESOLVE_FLAGS)
		return -EINVAL;
	if ((how->resolve & RESOLVE_BENEATH) && (how->resolve & RESOLVE_IN_ROOT))
		return -EINVAL;
	/* Lookups here do not implement the RESOLVE_ scopes and restrictions: a request for
	 * one fails as on a kernel that does not know it, rather than resolve unrestricted. */
	if (how->resolve)
		return -EINVAL;
	if (WILL_CREATE(flags)) {
		if (how->mode & ~(u64)S_IALLUGO)
			return -EINVAL;
		op->mode = how->mode | S_IFREG;
	} else if (how->mode) {
		return -EINVAL;
	} else {
		op->mode = 0;
	}
	if ((flags & (O_DIRECTORY | O_CREAT)) == (O_DIRECTORY | O_CREAT))
		return -EINVAL;

	acc_mode = "\004\002\006\006"[flags & O_ACCMODE];
	if ((flags & __O_TMPFILE) && (!(flags & O_DIRECTORY) || !(acc_mode & 0x2)))
		return -EINVAL;
	if ((flags & O_PATH) && (flags & ~(u64)O_PATH_FLAGS))
		return -EINVAL;
	if (flags & O_TRUNC)
		acc_mode |= 0x2;
	if (flags & O_APPEND)
		acc_mode |= 0x8;
	op->acc_mode = acc_mode;
	op->intent = LOOKUP_OPEN;
	if (flags & O_CREAT) {
		op->intent |= LOOKUP_CREATE;
		if (flags & O_EXCL) {
			op->intent |= LOOKUP_EXCL;
			flags |= O_NOFOLLOW;
		}
	}
	op->open_flag = (int)flags;
	if (flags & O_DIRECTORY)
		lookup_flags |= LOOKUP_DIRECTORY;
	if (!(flags & O_NOFOLLOW))
		lookup_flags |= LOOKUP_FOLLOW;
	op->lookup_flags = lookup_flags;
	return 0;
}

struct file *filp_open(const char *filename, int flags, umode_t mode)
{
	struct open_how how = { .flags = flags, .mode = (flags & O_CREAT) ? mode : 0 };
	struct open_flags op;
	struct filename *name;
	struct file *file;
	int err = build_open_flags(&how, &op);

	if (err)
		return ERR_PTR(err);
	name = getname_kernel(filename);
	if (IS_ERR(name))
		return ERR_CAST(name);
	file = do_filp_open(AT_FDCWD, name, &op);
	putname(name);
	return file;
}

/* The one place every open goes through: arg 2 is still the user's pointer. */
noinline long do_sys_openat2(int dfd, const char __user *filename, struct open_how *how)
{
	struct open_flags op;
	struct filename *tmp;
	int fd = build_open_flags(how, &op);

	if (fd)
		return fd;
	tmp = getname(filename);
	if (IS_ERR(tmp))
		return PTR_ERR(tmp);
	fd = get_unused_fd_flags(how->flags);
	if (fd >= 0) {
		/* No filesystem here makes unnamed files (->tmpfile). */
		struct file *f = how->flags & __O_TMPFILE ? ERR_PTR(-EOPNOTSUPP) :
				 do_filp_open(dfd, tmp, &op);

		if (IS_ERR(f)) {
			put_unused_fd(fd);
			fd = PTR_ERR(f);
		} else {
			fd_install(fd, f);
		}
	}
	putname(tmp);
	return fd;
}

static inline struct open_how build_open_how(int flags, umode_t mode)
{
	struct open_how how = {
		.flags = flags & VALID_OPEN_FLAGS,
		.mode = mode & S_IALLUGO,
	};

	if (!WILL_CREATE(how.flags))
		how.mode = 0;
	return how;
}

noinline long do_sys_open(int dfd, const char __user *filename, int flags, umode_t mode)
{
	struct open_how how = build_open_how(flags, mode);

	return do_sys_openat2(dfd, filename, &how);
}

SYSCALL_DECL(open)
{
	return do_sys_open(AT_FDCWD, (const char __user *)regs->di, (int)regs->si | O_LARGEFILE,
			   (umode_t)regs->dx);
}

SYSCALL_DECL(openat)
{
	return do_sys_open((int)regs->di, (const char __user *)regs->si,
			   (int)regs->dx | O_LARGEFILE, (umode_t)regs->r10);
}

SYSCALL_DECL(openat2)
{
	const struct open_how __user *uhow = (const struct open_how __user *)regs->dx;
	size_t usize = (size_t)regs->r10;
	struct open_how how;
	int err;

	if (unlikely(usize < OPEN_HOW_SIZE_VER0))
		return -EINVAL;
	if (unlikely(usize > PAGE_SIZE))
		return -E2BIG;
	err = copy_struct_from_user(&how, sizeof(how), uhow, usize);
	if (err)
		return err;
	if (!(how.flags & O_PATH))
		how.flags |= O_LARGEFILE;
	return do_sys_openat2((int)regs->di, (const char __user *)regs->si, &how);
}

SYSCALL_DECL(close)
{
	return close_fd((unsigned int)regs->di);
}

SYSCALL_DECL(chdir)
{
	struct path path;
	int error;

	error = user_path_at_empty(AT_FDCWD, (const char __user *)regs->di,
				   LOOKUP_FOLLOW | LOOKUP_DIRECTORY, &path, NULL);
	if (error)
		return error;
	if (!d_is_dir(path.dentry))
		error = -ENOTDIR;
	else
		set_fs_pwd(current->fs, &path);
	path_put(&path);
	return error;
}
