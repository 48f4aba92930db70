/* stat() and newfstatat(). */
#include "fs.h"
#include "syscalls.h"
#include "uaccess.h"

/* struct stat as the x86_64 ABI lays it out. */
struct stat {
	unsigned long st_dev;
	unsigned long st_ino;
	unsigned long st_nlink;
	unsigned int st_mode;
	unsigned int st_uid;
	unsigned int st_gid;
	unsigned int __pad0;
	unsigned long st_rdev;
	long st_size;
	long st_blksize;
	long st_blocks;
	unsigned long st_atime;
	unsigned long st_atime_nsec;
	unsigned long st_mtime;
	unsigned long st_mtime_nsec;
	unsigned long st_ctime;
	unsigned long st_ctime_nsec;
	long __unused[3];
};

#define STATX_BASIC_STATS 0x7ff

static void generic_fillattr(struct inode *inode, struct kstat *stat)
{
	stat->dev = inode->i_sb->s_dev;
	stat->ino = inode->i_ino;
	stat->mode = inode->i_mode;
	stat->nlink = inode->i_nlink;
	stat->size = READ_ONCE(inode->i_size);
	stat->mtime = inode->i_mtime;
	stat->blksize = PAGE_SIZE;
	stat->blocks = (stat->size + 511) >> 9;
}

int vfs_getattr(const struct path *path, struct kstat *stat, u32 request_mask,
		unsigned int query_flags)
{
	struct inode *inode = path->dentry->d_inode;

	if (!inode)
		return -ENOENT;
	memset(stat, 0, sizeof(*stat));
	generic_fillattr(inode, stat);
	return 0;
}

static int vfs_statx(int dfd, const char __user *filename, int flags, struct kstat *stat,
		     u32 request_mask)
{
	unsigned int lookup_flags = 0;
	struct path path;
	int error, empty = 0;

	if (flags & ~(AT_SYMLINK_NOFOLLOW | AT_EMPTY_PATH))
		return -EINVAL;
	if (!(flags & AT_SYMLINK_NOFOLLOW))
		lookup_flags |= LOOKUP_FOLLOW;
	if (flags & AT_EMPTY_PATH)
		lookup_flags |= LOOKUP_EMPTY;
	error = user_path_at_empty(dfd, filename, lookup_flags, &path, &empty);
	if (error)
		return error;
	error = vfs_getattr(&path, stat, request_mask, flags);
	path_put(&path);
	return error;
}

int vfs_fstatat(int dfd, const char __user *filename, struct kstat *stat, int flags)
{
	return vfs_statx(dfd, filename, flags, stat, STATX_BASIC_STATS);
}

static int cp_new_stat(struct kstat *stat, struct stat __user *statbuf)
{
	struct stat tmp;

	memset(&tmp, 0, sizeof(tmp));
	tmp.st_dev = stat->dev;
	tmp.st_ino = stat->ino;
	tmp.st_nlink = stat->nlink;
	tmp.st_mode = stat->mode;
	tmp.st_size = stat->size;
	tmp.st_blksize = stat->blksize;
	tmp.st_blocks = stat->blocks;
	tmp.st_atime = tmp.st_mtime = tmp.st_ctime = stat->mtime / 1000000000;
	tmp.st_atime_nsec = tmp.st_mtime_nsec = tmp.st_ctime_nsec = stat->mtime % 1000000000;
	return copy_to_user(statbuf, &tmp, sizeof(tmp)) ? -EFAULT : 0;
}

SYSCALL_DECL(newstat)
{
	struct kstat stat;
	int error = vfs_fstatat(AT_FDCWD, (const char __user *)regs->di, &stat, 0);

	if (error)
		return error;
	return cp_new_stat(&stat, (struct stat __user *)regs->si);
}

SYSCALL_DECL(newfstatat)
{
	struct kstat stat;
	int error = vfs_fstatat((int)regs->di, (const char __user *)regs->si, &stat,
				(int)regs->r10);

	if (error)
		return error;
	return cp_new_stat(&stat, (struct stat __user *)regs->dx);
}
