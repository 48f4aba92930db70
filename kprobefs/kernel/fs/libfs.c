/* Helpers for filesystems that keep their whole tree in the dcache (ramfs, sysfs). */
#include "fs.h"
#include "uaccess.h"

ssize_t generic_read_dir(struct file *filp, char __user *buf, size_t siz, loff_t *ppos)
{
	return -EISDIR;
}

/* A name the dcache does not have does not exist: hash it as negative. */
struct dentry *simple_lookup(struct inode *dir, struct dentry *dentry, unsigned int flags)
{
	if (dentry->d_name.len > NAME_MAX)
		return ERR_PTR(-ENAMETOOLONG);
	d_add(dentry, NULL);
	return NULL;
}

/* Keeps a new name alive until unlink/rmdir: the filesystem's own reference. */
void simple_pin(struct dentry *dentry)
{
	dget(dentry);
	spin_lock(&dcache_lock);
	dentry->d_flags |= DCACHE_PINNED | DCACHE_HASHED;
	spin_unlock(&dcache_lock);
}

static void simple_unpin(struct dentry *dentry)
{
	spin_lock(&dcache_lock);
	dentry->d_flags &= ~DCACHE_PINNED;
	spin_unlock(&dcache_lock);
	dput(dentry);
}

int simple_unlink(struct inode *dir, struct dentry *dentry)
{
	struct inode *inode = dentry->d_inode;

	dir->i_mtime = inode->i_mtime = ktime_get_ns();
	drop_nlink(inode);
	simple_unpin(dentry);
	return 0;
}

int simple_rmdir(struct inode *dir, struct dentry *dentry)
{
	if (!simple_empty(dentry))
		return -ENOTEMPTY;
	drop_nlink(dentry->d_inode);
	simple_unlink(dir, dentry);
	drop_nlink(dir);
	return 0;
}

/* ramfs's rename: a target that exists is replaced (a directory only by a directory,
 * and only when empty); the link counts follow the directories' ".." entries. */
int simple_rename(struct inode *old_dir, struct dentry *old_dentry, struct inode *new_dir,
		  struct dentry *new_dentry, unsigned int flags)
{
	struct inode *inode = old_dentry->d_inode;
	bool they_are_dirs = d_is_dir(old_dentry);

	if (flags & ~RENAME_NOREPLACE)
		return -EINVAL;
	if (!d_is_negative(new_dentry)) {
		if (!simple_empty(new_dentry))
			return -ENOTEMPTY;
		if (they_are_dirs) {
			drop_nlink(new_dentry->d_inode);
			drop_nlink(old_dir);
		}
		simple_unlink(new_dir, new_dentry);
	} else if (they_are_dirs) {
		drop_nlink(old_dir);
		inc_nlink(new_dir);
	}
	old_dir->i_mtime = new_dir->i_mtime = inode->i_mtime = ktime_get_ns();
	return 0;
}

/* The file type bits of an inode, as getdents64 reports them. */
static inline unsigned char dt_type(const struct inode *inode)
{
	return (inode->i_mode >> 12) & 15;
}

/* The inode number ".." reports: a mounted root's parent is its mountpoint's parent. */
static unsigned long parent_ino(struct dentry *dentry)
{
	struct dentry *d = dentry;

	while (IS_ROOT(d)) {
		struct dentry *mp = lookup_mountpoint(d);

		if (!mp)
			return d->d_inode->i_ino;
		d = mp;
	}
	return d->d_parent->d_inode->i_ino;
}

struct positive_entry {
	char name[NAME_MAX + 1];
	int len;
	u64 ino;
	unsigned char type;
};

/* Copies out the skip-th live child of parent; false when there are fewer. */
static bool scan_positives(struct dentry *parent, loff_t skip, struct positive_entry *e)
{
	struct dentry *child;
	bool found = false;

	spin_lock(&dcache_lock);
	list_for_each_entry(child, &parent->d_subdirs, d_child) {
		if (!child->d_inode || d_unhashed(child))
			continue;
		if (skip-- > 0)
			continue;
		e->len = child->d_name.len;
		memcpy(e->name, child->d_name.name, e->len + 1);
		e->ino = child->d_inode->i_ino;
		e->type = dt_type(child->d_inode);
		found = true;
		break;
	}
	spin_unlock(&dcache_lock);
	return found;
}

/* Positions: 0 is ".", 1 is "..", n >= 2 the (n-2)th live child in creation order. */
int dcache_readdir(struct file *file, void *arg)
{
	struct dir_context *ctx = arg;
	struct dentry *dentry = file->f_path.dentry;
	struct positive_entry e;

	if (ctx->pos == 0) {
		if (!dir_emit(ctx, ".", 1, dentry->d_inode->i_ino, dt_type(dentry->d_inode)))
			return 0;
		ctx->pos = 1;
	}
	if (ctx->pos == 1) {
		if (!dir_emit(ctx, "..", 2, parent_ino(dentry), DT_DIR))
			return 0;
		ctx->pos = 2;
	}
	while (scan_positives(dentry, ctx->pos - 2, &e)) {
		if (!dir_emit(ctx, e.name, e.len, e.ino, e.type))
			break;
		ctx->pos++;
	}
	return 0;
}

static loff_t dcache_dir_lseek(struct file *file, loff_t offset, int whence)
{
	switch (whence) {
	case SEEK_CUR:
		offset += file->f_pos;
		/* fall through */
	case SEEK_SET:
		if (offset >= 0)
			break;
		/* fall through */
	default:
		return -EINVAL;
	}
	file->f_pos = offset;
	return offset;
}

const struct file_operations simple_dir_operations = {
	.llseek = dcache_dir_lseek,
	.read = generic_read_dir,
	.iterate = dcache_readdir,
};

int sysfs_emit(char *buf, const char *fmt, ...)
{
	__builtin_va_list args;
	int len;

	__builtin_va_start(args, fmt);
	len = vsnprintf(buf, PAGE_SIZE, fmt, args);
	__builtin_va_end(args);
	return len < (int)PAGE_SIZE ? len : (int)PAGE_SIZE - 1;
}
