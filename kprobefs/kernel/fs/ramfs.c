/* ramfs, the root filesystem: everything lives in memory.  A regular file's data is
 * one kmalloc'd buffer (pages once it is large) that grows as the file does; directories
 * are their dentries; symlinks keep their body in i_link.  Character devices (/dev/null,
 * /dev/zero) are dispatched by device number. */
#include "fs.h"
#include "uaccess.h"

#define RAMFS_MAX_FILE_SIZE (64L << 20)

struct dentry *simple_lookup(struct inode *dir, struct dentry *dentry, unsigned int flags);
void simple_pin(struct dentry *dentry);
int simple_unlink(struct inode *dir, struct dentry *dentry);
int simple_rmdir(struct inode *dir, struct dentry *dentry);
int simple_rename(struct inode *old_dir, struct dentry *old_dentry, struct inode *new_dir,
		  struct dentry *new_dentry, unsigned int flags);

static const struct inode_operations ramfs_dir_inode_operations;
static const struct inode_operations ramfs_file_inode_operations;
static const struct inode_operations ramfs_symlink_inode_operations;

/* ---- regular files ---------------------------------------------------------------- */

/* Makes room for size bytes; caller holds the inode lock. */
static int ramfs_grow(struct inode *inode, size_t size)
{
	size_t cap = inode->i_capacity;
	char *data;

	if (size <= cap)
		return 0;
	cap = max(max(cap * 2, size), (size_t)64);
	if (cap > 4000)
		cap = ALIGN(cap + 16, PAGE_SIZE) - 16;	/* fill the pages kmalloc takes */
	data = kmalloc(cap, GFP_KERNEL);
	if (!data)
		return -ENOSPC;
	if (inode->i_private) {
		memcpy(data, inode->i_private, inode->i_size);
		kfree(inode->i_private);
	}
	inode->i_private = data;
	inode->i_capacity = cap;
	return 0;
}

static ssize_t ramfs_file_read(struct file *file, char __user *buf, size_t count,
			       loff_t *ppos)
{
	struct inode *inode = file_inode(file);
	loff_t pos = *ppos;
	size_t n, left;

	inode_lock(inode);
	if (pos >= inode->i_size) {
		inode_unlock(inode);
		return 0;
	}
	n = min(count, (size_t)(inode->i_size - pos));
	left = copy_to_user(buf, (char *)inode->i_private + pos, n);
	inode_unlock(inode);
	if (left == n)
		return -EFAULT;
	n -= left;
	*ppos = pos + n;
	return n;
}

static ssize_t ramfs_file_write(struct file *file, const char __user *buf, size_t count,
				loff_t *ppos)
{
	struct inode *inode = file_inode(file);
	char *data;
	loff_t pos;
	size_t left;
	int err;

	inode_lock(inode);
	pos = (file->f_flags & O_APPEND) ? inode->i_size : *ppos;
	if (pos >= RAMFS_MAX_FILE_SIZE) {
		inode_unlock(inode);
		return -EFBIG;
	}
	if (count > (size_t)(RAMFS_MAX_FILE_SIZE - pos))
		count = RAMFS_MAX_FILE_SIZE - pos;
	if (!count) {
		inode_unlock(inode);
		return 0;
	}
	err = ramfs_grow(inode, pos + count);
	if (err) {
		inode_unlock(inode);
		return err;
	}
	data = inode->i_private;
	if (pos > inode->i_size)
		memset(data + inode->i_size, 0, pos - inode->i_size);
	left = copy_from_user(data + pos, buf, count);
	count -= left;
	if (count && pos + (loff_t)count > inode->i_size)
		i_size_write(inode, pos + count);
	inode_unlock(inode);
	if (!count)
		return -EFAULT;
	*ppos = pos + count;
	return count;
}

/* Cut or extend (with zeroes) to ia_size; caller holds the inode lock. */
static int ramfs_setattr(struct user_namespace *mnt_userns, struct dentry *dentry,
			 struct iattr *attr)
{
	struct inode *inode = dentry->d_inode;
	int err;

	if (attr->ia_valid & ATTR_MODE)
		inode->i_mode = (inode->i_mode & S_IFMT) | (attr->ia_mode & 07777);
	if (!(attr->ia_valid & ATTR_SIZE))
		return 0;
	if (!S_ISREG(inode->i_mode))
		return -EINVAL;
	if (attr->ia_size > RAMFS_MAX_FILE_SIZE)
		return -EFBIG;
	if (attr->ia_size > inode->i_size) {
		err = ramfs_grow(inode, attr->ia_size);
		if (err)
			return err;
		memset((char *)inode->i_private + inode->i_size, 0,
		       attr->ia_size - inode->i_size);
	}
	i_size_write(inode, attr->ia_size);
	inode->i_mtime = ktime_get_ns();
	return 0;
}

const struct file_operations ramfs_file_operations = {
	.llseek = generic_file_llseek,
	.read = ramfs_file_read,
	.write = ramfs_file_write,
};

static const struct inode_operations ramfs_file_inode_operations = {
	.setattr = ramfs_setattr,
};

/* ---- character devices ------------------------------------------------------------ */

static ssize_t read_null(struct file *file, char __user *buf, size_t count, loff_t *ppos)
{
	return 0;
}

static ssize_t write_null(struct file *file, const char __user *buf, size_t count,
			  loff_t *ppos)
{
	return count;
}

static loff_t null_lseek(struct file *file, loff_t offset, int orig)
{
	return file->f_pos = 0;
}

static ssize_t read_zero(struct file *file, char __user *buf, size_t count, loff_t *ppos)
{
	size_t left = clear_user(buf, count);

	if (left == count && count)
		return -EFAULT;
	return count - left;
}

static const struct file_operations null_fops = {
	.llseek = null_lseek,
	.read = read_null,
	.write = write_null,
};

static const struct file_operations zero_fops = {
	.llseek = null_lseek,
	.read = read_zero,
	.write = write_null,
};

struct memdev {
	const char *name;
	umode_t mode;
	const struct file_operations *fops;
};

static const struct memdev devlist[] = {
	[3] = { "null", 0666, &null_fops },
	[5] = { "zero", 0666, &zero_fops },
	[11] = { "kmsg", 0644, &devkmsg_fops },
};

/* Major 1: pick the file operations by minor, then open through them. */
static int memory_open(struct inode *inode, struct file *filp)
{
	unsigned int minor = MINOR((unsigned long)inode->i_private);
	const struct memdev *dev;

	if (minor >= ARRAY_SIZE(devlist))
		return -ENXIO;
	dev = &devlist[minor];
	if (!dev->fops)
		return -ENXIO;
	filp->f_op = dev->fops;
	if (filp->f_op->open)
		return filp->f_op->open(inode, filp);
	return 0;
}

static int chrdev_open(struct inode *inode, struct file *filp)
{
	unsigned int rdev = (unsigned long)inode->i_private;

	switch (MAJOR(rdev)) {
	case 1:
		return memory_open(inode, filp);
	default:
		return -ENXIO;
	}
}

static const struct file_operations def_chr_fops = {
	.open = chrdev_open,
};

void init_special_inode(struct inode *inode, umode_t mode, unsigned int rdev)
{
	inode->i_mode = mode;
	if (S_ISCHR(mode)) {
		inode->i_fop = &def_chr_fops;
		inode->i_private = (void *)(unsigned long)rdev;
	} else {
		pr_warn("init_special_inode: bogus i_mode (%o) for inode %lu\n", mode,
			inode->i_ino);
	}
}

/* ---- inodes and directories ------------------------------------------------------- */

struct inode *ramfs_get_inode(struct super_block *sb, const struct inode *dir, umode_t mode)
{
	struct inode *inode = new_inode(sb);

	if (!inode)
		return NULL;
	inode->i_mode = mode;
	switch (mode & S_IFMT) {
	case S_IFREG:
		inode->i_op = &ramfs_file_inode_operations;
		inode->i_fop = &ramfs_file_operations;
		break;
	case S_IFDIR:
		inode->i_op = &ramfs_dir_inode_operations;
		inode->i_fop = &simple_dir_operations;
		inc_nlink(inode);	/* "." */
		break;
	case S_IFLNK:
		inode->i_op = &ramfs_symlink_inode_operations;
		break;
	default:
		init_special_inode(inode, mode, 0);
		break;
	}
	return inode;
}

static int ramfs_mknod(struct inode *dir, struct dentry *dentry, umode_t mode,
		       unsigned int dev)
{
	struct inode *inode = ramfs_get_inode(dir->i_sb, dir, mode);

	if (!inode)
		return -ENOSPC;
	if (S_ISCHR(mode))
		init_special_inode(inode, mode, dev);
	d_instantiate(dentry, inode);
	simple_pin(dentry);
	dir->i_mtime = ktime_get_ns();
	return 0;
}

static int ramfs_mkdir(struct inode *dir, struct dentry *dentry, umode_t mode)
{
	int retval = ramfs_mknod(dir, dentry, mode | S_IFDIR, 0);

	if (!retval)
		inc_nlink(dir);
	return retval;
}

static int ramfs_create(struct inode *dir, struct dentry *dentry, umode_t mode, bool excl)
{
	return ramfs_mknod(dir, dentry, mode | S_IFREG, 0);
}

static int ramfs_symlink(struct inode *dir, struct dentry *dentry, const char *symname)
{
	struct inode *inode;
	size_t len = strlen(symname);

	if (len + 1 > PAGE_SIZE)
		return -ENAMETOOLONG;
	inode = ramfs_get_inode(dir->i_sb, dir, S_IFLNK | 0777);
	if (!inode)
		return -ENOSPC;
	inode->i_link = kstrdup(symname, GFP_KERNEL);
	if (!inode->i_link) {
		iput(inode);
		return -ENOMEM;
	}
	inode->i_size = len;
	d_instantiate(dentry, inode);
	simple_pin(dentry);
	dir->i_mtime = ktime_get_ns();
	return 0;
}

static const char *simple_get_link(struct dentry *dentry, struct inode *inode)
{
	return inode->i_link;
}

static const struct inode_operations ramfs_symlink_inode_operations = {
	.get_link = simple_get_link,
};

static const struct inode_operations ramfs_dir_inode_operations = {
	.lookup = simple_lookup,
	.create = ramfs_create,
	.mkdir = ramfs_mkdir,
	.rmdir = simple_rmdir,
	.unlink = simple_unlink,
	.rename = simple_rename,
	.symlink = ramfs_symlink,
	.mknod = ramfs_mknod,
};

static void ramfs_free_inode(struct inode *inode)
{
	/* Character devices keep their number, not a buffer, in i_private. */
	if (S_ISREG(inode->i_mode) || S_ISDIR(inode->i_mode))
		kfree(inode->i_private);
	kfree(inode->i_link);
	kfree(inode);
}

static const struct super_operations ramfs_ops = {
	.destroy_inode = ramfs_free_inode,
};

int ramfs_fill_super(struct super_block *sb)
{
	struct inode *inode;

	sb->s_op = &ramfs_ops;
	inode = ramfs_get_inode(sb, NULL, S_IFDIR | 0755);
	sb->s_root = d_make_root(inode);
	if (!sb->s_root)
		return -ENOMEM;
	return 0;
}

static struct dentry *ramfs_mount(struct file_system_type *fs_type, int flags,
				  const char *dev_name, void *data)
{
	struct super_block *sb = sget_fc(fs_type, RAMFS_MAGIC);
	int err;

	if (IS_ERR(sb))
		return ERR_CAST(sb);
	err = ramfs_fill_super(sb);
	if (err) {
		kfree(sb);
		return ERR_PTR(err);
	}
	return sb->s_root;
}

struct file_system_type ramfs_fs_type = {
	.name = "ramfs",
	.mount = ramfs_mount,
};
