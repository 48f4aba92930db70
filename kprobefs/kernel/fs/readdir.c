/* getdents64(): iterate_dir() drives a filesystem's ->iterate, which hands each entry
 * to filldir64() for copying into the user's buffer. */
#include "fs.h"
#include "syscalls.h"
#include "uaccess.h"

struct linux_dirent64 {
	u64 d_ino;
	s64 d_off;
	unsigned short d_reclen;
	unsigned char d_type;
	char d_name[];
};

struct getdents_callback64 {
	struct dir_context ctx;
	struct linux_dirent64 __user *current_dir;
	int prev_reclen;
	int count;
	int error;
};

int iterate_dir(struct file *file, struct dir_context *ctx)
{
	struct inode *inode = file_inode(file);
	int res = -ENOTDIR;

	if (!file->f_op->iterate)
		goto out;
	res = -ENOENT;
	if (S_ISDIR(inode->i_mode) && !inode->i_nlink)
		goto out;	/* removed directory */
	ctx->pos = file->f_pos;
	res = file->f_op->iterate(file, ctx);
	file->f_pos = ctx->pos;
out:
	return res;
}

/* Appends one record; false stops the iteration (buffer full or a fault). */
static bool filldir64(struct dir_context *ctx, const char *name, int namlen, loff_t offset,
		      u64 ino, unsigned int d_type)
{
	struct getdents_callback64 *buf = container_of(ctx, struct getdents_callback64, ctx);
	struct linux_dirent64 __user *dirent, *prev;
	struct linux_dirent64 head;
	int reclen = ALIGN(offsetof(struct linux_dirent64, d_name) + namlen + 1, sizeof(u64));
	int prev_reclen;
	char zero = 0;

	buf->error = -EINVAL;	/* nothing fits: the buffer is too small */
	if (reclen > buf->count)
		return false;
	prev_reclen = buf->prev_reclen;
	dirent = buf->current_dir;
	prev = (void __user *)((char __user *)dirent - prev_reclen);
	/* The previous record's d_off is the position after it, which is ours. */
	if (prev_reclen && put_user((u64)offset, &prev->d_off))
		goto efault;
	head.d_ino = ino;
	head.d_off = 0;
	head.d_reclen = reclen;
	head.d_type = d_type;
	if (copy_to_user(dirent, &head, offsetof(struct linux_dirent64, d_name)))
		goto efault;
	if (copy_to_user(dirent->d_name, name, namlen) ||
	    copy_to_user(dirent->d_name + namlen, &zero, 1))
		goto efault;
	buf->error = 0;
	buf->prev_reclen = reclen;
	buf->current_dir = (void __user *)((char __user *)dirent + reclen);
	buf->count -= reclen;
	return true;
efault:
	buf->error = -EFAULT;
	return false;
}

SYSCALL_DECL(getdents64)
{
	unsigned int fd = (unsigned int)regs->di;
	struct linux_dirent64 __user *dirent = (void __user *)regs->si;
	unsigned int count = (unsigned int)regs->dx;
	struct getdents_callback64 buf = {
		.ctx.actor = filldir64,
		.count = count,
		.current_dir = dirent,
	};
	struct file *f;
	int error;

	if (!access_ok(dirent, count))
		return -EFAULT;
	f = fget(fd);
	if (!f)
		return -EBADF;
	error = iterate_dir(f, &buf.ctx);
	if (error >= 0)
		error = buf.error;
	if (buf.prev_reclen) {
		struct linux_dirent64 __user *lastdirent;
		u64 d_off = buf.ctx.pos;

		lastdirent = (void __user *)((char __user *)buf.current_dir - buf.prev_reclen);
		if (put_user(d_off, &lastdirent->d_off))
			error = -EFAULT;
		else
			error = count - buf.count;
	}
	fput(f);
	return error;
}
