/* struct file allocation and the final fput(). */
#include "fs.h"

#define NR_FILE_MAX 8192
static atomic_t nr_files;

/* An unopened file with one reference; f_mode from the access mode in flags. */
struct file *alloc_empty_file(int flags, const struct cred *cred)
{
	struct file *f;

	if (atomic_read(&nr_files) >= NR_FILE_MAX) {
		pr_warn("VFS: file-max limit %d reached\n", NR_FILE_MAX);
		return ERR_PTR(-ENFILE);
	}
	f = kzalloc(sizeof(*f), GFP_KERNEL);
	if (unlikely(!f))
		return ERR_PTR(-ENOMEM);
	atomic_set(&f->f_count, 1);
	f->f_flags = flags;
	f->f_mode = ((flags + 1) & O_ACCMODE);
	atomic_inc(&nr_files);
	return f;
}

/* An opened file on a dentry that lives in no directory (sockets). */
struct file *alloc_file_pseudo(struct inode *inode, const char *name, int flags,
			       const struct file_operations *fops)
{
	struct qstr this = { .name = name, .len = strlen(name) };
	struct dentry *dentry;
	struct file *file;

	dentry = d_alloc_pseudo(inode->i_sb, &this);
	if (!dentry)
		return ERR_PTR(-ENOMEM);
	d_instantiate(dentry, inode);
	file = alloc_empty_file(flags, NULL);
	if (IS_ERR(file)) {
		dentry->d_inode = NULL;	/* the inode stays the caller's */
		dput(dentry);
		return file;
	}
	file->f_path.dentry = dentry;
	file->f_inode = inode;
	file->f_op = fops;
	file->f_mode |= FMODE_OPENED;
	if ((file->f_mode & FMODE_READ) && fops->read)
		file->f_mode |= FMODE_CAN_READ;
	if ((file->f_mode & FMODE_WRITE) && fops->write)
		file->f_mode |= FMODE_CAN_WRITE;
	return file;
}

static void __fput(struct file *file)
{
	struct dentry *dentry = file->f_path.dentry;
	struct inode *inode = file->f_inode;

	if ((file->f_mode & FMODE_OPENED) && file->f_op && file->f_op->release)
		file->f_op->release(inode, file);
	if (dentry)
		dput(dentry);
	__atomic_sub_fetch(&nr_files.counter, 1, __ATOMIC_SEQ_CST);
	kfree(file);
}

void fput(struct file *file)
{
	if (atomic_dec_and_test(&file->f_count))
		__fput(file);
}
