/* read(), write(), pread64(), pwrite64() and lseek(). */
#include "fs.h"
#include "syscalls.h"
#include "uaccess.h"

loff_t no_llseek(struct file *file, loff_t offset, int whence)
{
	return -ESPIPE;
}

static loff_t vfs_setpos(struct file *file, loff_t offset, loff_t maxsize)
{
	if (offset < 0 || offset > maxsize)
		return -EINVAL;
	if (offset != file->f_pos)
		file->f_pos = offset;
	return offset;
}

/* lseek for files whose size is i_size; SEEK_DATA/SEEK_HOLE treat the file as one
 * data extent followed by a hole at its end. */
loff_t generic_file_llseek(struct file *file, loff_t offset, int whence)
{
	loff_t eof = READ_ONCE(file->f_inode->i_size);

	switch (whence) {
	case SEEK_SET:
		break;
	case SEEK_END:
		offset += eof;
		break;
	case SEEK_CUR:
		if (offset == 0)
			return file->f_pos;
		offset += file->f_pos;
		break;
	case SEEK_DATA:
		if ((unsigned long)offset >= (unsigned long)eof)
			return -ENXIO;
		break;
	case SEEK_HOLE:
		if ((unsigned long)offset >= (unsigned long)eof)
			return -ENXIO;
		offset = eof;
		break;
	default:
		return -EINVAL;
	}
	return vfs_setpos(file, offset, MAX_LFS_FILESIZE);
}

loff_t vfs_llseek(struct file *file, loff_t offset, int whence)
{
	loff_t (*fn)(struct file *, loff_t, int) = no_llseek;

	if (file->f_mode & FMODE_LSEEK) {
		if (file->f_op->llseek)
			fn = file->f_op->llseek;
		else
			fn = generic_file_llseek;
	}
	return fn(file, offset, whence);
}

off_t ksys_lseek(unsigned int fd, off_t offset, unsigned int whence)
{
	struct file *f = fget(fd);
	off_t retval;

	if (!f)
		return -EBADF;
	retval = -EINVAL;
	if (whence <= SEEK_HOLE) {
		loff_t res = vfs_llseek(f, offset, whence);

		retval = res;
	}
	fput(f);
	return retval;
}

SYSCALL_DECL(lseek)
{
	return ksys_lseek((unsigned int)regs->di, (off_t)regs->si, (unsigned int)regs->dx);
}

/* What /proc/<pid>/io would show, summed over all tasks (task_struct has no room). */
struct task_io_accounting {
	unsigned long rchar, wchar, syscr, syscw;
} vfs_io_accounting;

static inline void add_rchar(ssize_t amt)
{
	__atomic_add_fetch(&vfs_io_accounting.rchar, amt, __ATOMIC_RELAXED);
}

static inline void add_wchar(ssize_t amt)
{
	__atomic_add_fetch(&vfs_io_accounting.wchar, amt, __ATOMIC_RELAXED);
}

int rw_verify_area(int read_write, struct file *file, const loff_t *ppos, size_t count)
{
	if (unlikely((ssize_t)count < 0))
		return -EINVAL;
	if (ppos) {
		loff_t pos = *ppos;

		if (unlikely(pos < 0))
			return -EINVAL;
		if (unlikely((loff_t)(pos + count) < 0))
			return -EINVAL;
	}
	return 0;
}

ssize_t vfs_read(struct file *file, char __user *buf, size_t count, loff_t *pos)
{
	ssize_t ret;

	if (!(file->f_mode & FMODE_READ))
		return -EBADF;
	if (!(file->f_mode & FMODE_CAN_READ))
		return -EINVAL;
	if (unlikely(!access_ok(buf, count)))
		return -EFAULT;
	ret = rw_verify_area(READ, file, pos, count);
	if (ret)
		return ret;
	if (count > MAX_RW_COUNT)
		count = MAX_RW_COUNT;
	ret = file->f_op->read(file, buf, count, pos);
	if (ret > 0)
		add_rchar(ret);
	__atomic_add_fetch(&vfs_io_accounting.syscr, 1, __ATOMIC_RELAXED);
	return ret;
}

ssize_t vfs_write(struct file *file, const char __user *buf, size_t count, loff_t *pos)
{
	ssize_t ret;

	if (!(file->f_mode & FMODE_WRITE))
		return -EBADF;
	if (!(file->f_mode & FMODE_CAN_WRITE))
		return -EINVAL;
	if (unlikely(!access_ok(buf, count)))
		return -EFAULT;
	ret = rw_verify_area(WRITE, file, pos, count);
	if (ret)
		return ret;
	if (count > MAX_RW_COUNT)
		count = MAX_RW_COUNT;
	ret = file->f_op->write(file, buf, count, pos);
	if (ret > 0) {
		if (file->f_inode)
			file->f_inode->i_mtime = ktime_get_ns();
		add_wchar(ret);
	}
	__atomic_add_fetch(&vfs_io_accounting.syscw, 1, __ATOMIC_RELAXED);
	return ret;
}

/* Sockets and other stream files have no position. */
static inline loff_t *file_ppos(struct file *file)
{
	return (file->f_mode & FMODE_LSEEK) ? &file->f_pos : NULL;
}

ssize_t ksys_read(unsigned int fd, char __user *buf, size_t count)
{
	struct file *f = fget(fd);
	ssize_t ret = -EBADF;

	if (f) {
		loff_t pos, *ppos = file_ppos(f);

		if (ppos) {
			pos = *ppos;
			ppos = &pos;
		}
		ret = vfs_read(f, buf, count, ppos);
		if (ret >= 0 && ppos)
			f->f_pos = pos;
		fput(f);
	}
	return ret;
}

ssize_t ksys_write(unsigned int fd, const char __user *buf, size_t count)
{
	struct file *f = fget(fd);
	ssize_t ret = -EBADF;

	if (f) {
		loff_t pos, *ppos = file_ppos(f);

		if (ppos) {
			pos = *ppos;
			ppos = &pos;
		}
		ret = vfs_write(f, buf, count, ppos);
		if (ret >= 0 && ppos)
			f->f_pos = pos;
		fput(f);
	}
	return ret;
}

SYSCALL_DECL(read)
{
	return ksys_read((unsigned int)regs->di, (char __user *)regs->si, (size_t)regs->dx);
}

SYSCALL_DECL(write)
{
	return ksys_write((unsigned int)regs->di, (const char __user *)regs->si,
			  (size_t)regs->dx);
}

/* At pos, leaving the file's position alone; ESPIPE for a file without positions. */
ssize_t ksys_pread64(unsigned int fd, char __user *buf, size_t count, loff_t pos)
{
	struct file *f;
	ssize_t ret = -EBADF;

	if (pos < 0)
		return -EINVAL;
	f = fget(fd);
	if (f) {
		ret = -ESPIPE;
		if (f->f_mode & FMODE_PREAD)
			ret = vfs_read(f, buf, count, &pos);
		fput(f);
	}
	return ret;
}

ssize_t ksys_pwrite64(unsigned int fd, const char __user *buf, size_t count, loff_t pos)
{
	struct file *f;
	ssize_t ret = -EBADF;

	if (pos < 0)
		return -EINVAL;
	f = fget(fd);
	if (f) {
		ret = -ESPIPE;
		if (f->f_mode & FMODE_PWRITE)
			ret = vfs_write(f, buf, count, &pos);
		fput(f);
	}
	return ret;
}

SYSCALL_DECL(pread64)
{
	return ksys_pread64((unsigned int)regs->di, (char __user *)regs->si, (size_t)regs->dx,
			    (loff_t)regs->r10);
}

SYSCALL_DECL(pwrite64)
{
	return ksys_pwrite64((unsigned int)regs->di, (const char __user *)regs->si,
			     (size_t)regs->dx, (loff_t)regs->r10);
}
