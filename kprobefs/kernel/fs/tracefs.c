/* tracefs: the host tracer serves the files, but event directories are also made on
 * the kernel side, as Linux's trace_events code does: the tracer calls
 * tracefs_create_dir() for each new event directory and tracefs_remove() when the
 * event goes, so probes on these functions see the same traffic as on Linux. */
#include "fs.h"

#define HOSTFS_TRACE_ROOT 2

static struct dentry *tracefs_root;	/* root of the /sys/kernel/tracing mount */
unsigned long tracefs_nr_dirs, tracefs_nr_files;

void tracefs_init(struct dentry *root)
{
	tracefs_root = root;
}

static struct dentry *trace_mount(struct file_system_type *fs_type, int flags,
				  const char *dev_name, void *data)
{
	return hostfs_mount_id(fs_type, HOSTFS_TRACE_ROOT, TRACEFS_MAGIC);
}

struct file_system_type trace_fs_type = {
	.name = "tracefs",
	.mount = trace_mount,
};

static struct dentry *start_creating(const char *name, struct dentry *parent)
{
	if (!parent)
		parent = tracefs_root;
	if (!parent) {
		pr_err("tracefs: Tracefs is not mounted, cannot create %s\n", name);
		return ERR_PTR(-ENOENT);
	}
	if (parent->d_sb->s_magic != TRACEFS_MAGIC)
		return ERR_PTR(-EINVAL);
	return parent;
}

static struct dentry *__create_dir(const char *name, struct dentry *parent,
				   const struct inode_operations *ops)
{
	struct dentry *dentry;

	parent = start_creating(name, parent);
	if (IS_ERR(parent))
		return NULL;
	dentry = hostfs_create_dentry(parent, name, S_IFDIR | 0755, DCACHE_TRACEFS, NULL, NULL);
	if (IS_ERR(dentry)) {
		pr_err("tracefs: could not create directory %s: %ld\n", name, PTR_ERR(dentry));
		return NULL;
	}
	if (ops)
		dentry->d_inode->i_op = ops;
	inc_nlink(parent->d_inode);
	tracefs_nr_dirs++;
	return dentry;
}

/* A directory called name under parent (the tracefs root when NULL); NULL on error. */
struct dentry *tracefs_create_dir(const char *name, struct dentry *parent)
{
	return __create_dir(name, parent, NULL);
}

/* A file called name under parent; with fops it is served by the kernel (data lands in
 * i_private), without it by the host like every other tracefs file.  NULL on error. */
struct dentry *tracefs_create_file(const char *name, umode_t mode, struct dentry *parent,
				   void *data, const struct file_operations *fops)
{
	struct dentry *dentry;

	if (!(mode & S_IFMT))
		mode |= S_IFREG;
	if (!S_ISREG(mode))
		return NULL;
	parent = start_creating(name, parent);
	if (IS_ERR(parent))
		return NULL;
	dentry = hostfs_create_dentry(parent, name, mode, DCACHE_TRACEFS, fops, data);
	if (IS_ERR(dentry))
		return NULL;
	tracefs_nr_files++;
	return dentry;
}

/* Takes a tracefs-made child of dentry with a reference, or NULL when none is left. */
static struct dentry *next_tracefs_child(struct dentry *dentry)
{
	struct dentry *child;

	spin_lock(&dcache_lock);
	list_for_each_entry(child, &dentry->d_subdirs, d_child) {
		if ((child->d_flags & (DCACHE_TRACEFS | DCACHE_PINNED)) ==
		    (DCACHE_TRACEFS | DCACHE_PINNED)) {
			dget(child);
			spin_unlock(&dcache_lock);
			return child;
		}
	}
	spin_unlock(&dcache_lock);
	return NULL;
}

/* Removes dentry and, first, everything tracefs made below it (depth first). */
void tracefs_remove(struct dentry *dentry)
{
	struct dentry *child;
	bool pinned;

	if (IS_ERR_OR_NULL(dentry))
		return;
	while ((child = next_tracefs_child(dentry)) != NULL) {
		tracefs_remove(child);
		dput(child);
	}
	spin_lock(&dcache_lock);
	pinned = (dentry->d_flags & (DCACHE_TRACEFS | DCACHE_PINNED)) ==
		 (DCACHE_TRACEFS | DCACHE_PINNED);
	if (pinned)
		dentry->d_flags = (dentry->d_flags & ~(DCACHE_PINNED | DCACHE_HASHED)) |
				  DCACHE_DEAD;
	spin_unlock(&dcache_lock);
	if (!pinned)
		return;
	if (d_is_dir(dentry)) {
		drop_nlink(dentry->d_parent->d_inode);
		tracefs_nr_dirs--;
	} else {
		tracefs_nr_files--;
	}
	dput(dentry);	/* the pin */
}
