/* hostfs: a filesystem whose nodes live in the host.  Lookups, opens, reads, writes and
 * directory listings become hypercalls; a node is known by the id the host gives it,
 * kept in i_private.  The host's tree changes behind the kernel's back (probe events
 * come and go), so a cached hostfs dentry is asked about again on every walk
 * (d_revalidate) and unused ones are not kept at all; but a name the host says stays
 * while the kernel runs (HOSTFS_PERMANENT: tracefs's own files, not an event's or an
 * instance's) is pinned at its first lookup and never asked about again, as tracefs
 * keeps its dentries.
 *
 * debugfs (/sys/kernel/debug), tracefs (/sys/kernel/tracing) and proc (/proc) are
 * hostfs instances rooted at host nodes 1, 2 and 3. */
#include "fs.h"
#include "uaccess.h"

#define HOSTFS_DEBUG_ROOT 1
#define HOSTFS_TRACE_ROOT 2
#define HOSTFS_PROC_ROOT 3
#define HOSTFS_READ_CHUNK (128 * 1024)
#define HOSTFS_WRITE_MAX (1024 * 1024)	/* one write() reaches the host as one call */
#define HOSTFS_DIRENT_SIZE 264		/* name[256], then the u32 mode */
#define HOSTFS_PERMANENT 0x80000000u	/* a lookup's mode flag: the name stays */

static const struct inode_operations hostfs_dir_inode_operations;
const struct file_operations hostfs_file_operations, hostfs_dir_operations;

struct hostfs_stats {
	unsigned long lookups, revalidations, stale, opens, reads, writes, bytes_read,
		bytes_written, errors;
} hostfs_stats;

/* The kernel mutexes a host-served operation holds, named by the host at lookup
 * (machine/abi.py: mutexes_word): one bit each, taken in this order (6.1's nesting)
 * and let go in the reverse order, across the operation's hypercall and the kernel work
 * it queues, as 6.1's handlers hold them across the work the host does here.  A second
 * writer of an event's enable waits in mutex_lock() while the first one's write is
 * served. */
enum {
	HOSTFS_EVENT_MUTEX,
	HOSTFS_TRACE_TYPES_LOCK,
	HOSTFS_MODULE_MUTEX,
	HOSTFS_KPROBE_MUTEX,
	HOSTFS_FTRACE_LOCK,
	HOSTFS_TEXT_MUTEX,
	HOSTFS_NR_MUTEXES
};
#define HOSTFS_MUTEXES_WRITE(w) ((w) & 0xff)	/* of a directory: mkdir and rmdir */
#define HOSTFS_MUTEXES_READ(w) (((w) >> 8) & 0xff)
#define HOSTFS_MUTEXES_OPEN(w) (((w) >> 16) & 0xff)
#define HOSTFS_MUTEXES_TRUNC(w) (((w) >> 24) & 0x7f)
#define HOSTFS_WORK_UNLOCKED 0x80000000u	/* queued work runs after they are let go */

extern struct mutex event_mutex, trace_types_lock, module_mutex, ftrace_lock, text_mutex;
static struct mutex *hostfs_mutexes[HOSTFS_NR_MUTEXES] = {
	[HOSTFS_EVENT_MUTEX] = &event_mutex,
	[HOSTFS_TRACE_TYPES_LOCK] = &trace_types_lock,
	[HOSTFS_MODULE_MUTEX] = &module_mutex,
	[HOSTFS_FTRACE_LOCK] = &ftrace_lock,
	[HOSTFS_TEXT_MUTEX] = &text_mutex,
};

/* kprobe_mutex is static to its file, as in 6.1: that file hands it over at boot. */
void hostfs_set_kprobe_mutex(struct mutex *lock)
{
	hostfs_mutexes[HOSTFS_KPROBE_MUTEX] = lock;
}

static void hostfs_lock(unsigned int bits)
{
	int i;

	for (i = 0; i < HOSTFS_NR_MUTEXES; i++)
		if ((bits & (1u << i)) && hostfs_mutexes[i])
			mutex_lock(hostfs_mutexes[i]);
}

static void hostfs_unlock(unsigned int bits)
{
	int i;

	for (i = HOSTFS_NR_MUTEXES - 1; i >= 0; i--)
		if ((bits & (1u << i)) && hostfs_mutexes[i])
			mutex_unlock(hostfs_mutexes[i]);
}

/* Makes a hostfs file operation's hypercall and runs the kernel work it queued, with
 * the mutexes in bits held (see HOSTFS_WORK_UNLOCKED).  The fifth argument tells the
 * host that mutexes are held: it then lets the other CPUs run before this one goes on,
 * as they would on Linux while the operation's work is done. */
static long hostfs_call(unsigned int bits, bool work_unlocked, long nr, long a1, long a2,
			long a3, long a4)
{
	long ret;

	hostfs_lock(bits);
	ret = hypercall5(nr, a1, a2, a3, a4, bits != 0);
	if (work_unlocked) {
		hostfs_unlock(bits);
		return host_work_run(ret);
	}
	ret = host_work_run(ret);
	hostfs_unlock(bits);
	return ret;
}

static inline long hostfs_node(const struct inode *inode)
{
	return (long)inode->i_private;
}

/* Host-backed (as opposed to a tracefs file the kernel made with its own fops). */
static inline bool hostfs_inode_is_host(const struct inode *inode)
{
	return inode->i_fop == &hostfs_file_operations || inode->i_fop == &hostfs_dir_operations;
}

static void hostfs_set_ops(struct inode *inode, long id, u32 mode)
{
	inode->i_mode = mode;
	inode->i_private = (void *)id;
	inode->i_size = 0;	/* as tracefs: size unknown until read */
	if (S_ISDIR(mode)) {
		inode->i_op = &hostfs_dir_inode_operations;
		inode->i_fop = &hostfs_dir_operations;
	} else {
		inode->i_op = NULL;
		inode->i_fop = &hostfs_file_operations;
	}
}

static struct inode *hostfs_iget(struct super_block *sb, long id, u32 mode)
{
	struct inode *inode = new_inode(sb);

	if (!inode)
		return NULL;
	if (id > 0)
		inode->i_ino = id;
	hostfs_set_ops(inode, id, mode);
	return inode;
}

/* Asks the host for name in directory dir_id: child id (>0) and its mode, or -errno;
 * *permanent (unless NULL): whether the name stays while the kernel runs; *mutexes:
 * what its operations hold (HOSTFS_MUTEXES_*). */
static long hostfs_lookup_host(long dir_id, const char *name, u32 *mode, bool *permanent,
			       u32 *mutexes)
{
	long id;

	if (dir_id <= 0)
		return -ENOENT;
	*mode = 0;
	*mutexes = 0;
	id = hypercall(HC_HOSTFS_LOOKUP, dir_id, name, mode, mutexes);
	hostfs_stats.lookups++;
	if (permanent)
		*permanent = *mode & HOSTFS_PERMANENT;
	*mode &= ~HOSTFS_PERMANENT;
	if (id > 0 && !S_ISDIR(*mode) && !S_ISREG(*mode))
		*mode = S_IFREG | (*mode & 07777);
	return id;
}

static struct dentry *hostfs_lookup(struct inode *dir, struct dentry *dentry,
				    unsigned int flags)
{
	struct inode *inode = NULL;
	bool permanent;
	u32 mode, mutexes;
	long id;

	if (dentry->d_name.len > NAME_MAX)
		return ERR_PTR(-ENAMETOOLONG);
	id = hostfs_lookup_host(hostfs_node(dir), dentry->d_name.name, &mode, &permanent,
				&mutexes);
	if (id < 0 && id != -ENOENT) {
		hostfs_stats.errors++;
		return ERR_PTR(id);
	}
	if (id > 0) {
		inode = hostfs_iget(dir->i_sb, id, mode);
		if (!inode)
			return ERR_PTR(-ENOMEM);
		inode->i_mutexes = mutexes;
	}
	d_add(dentry, inode);
	if (id > 0 && permanent) {
		spin_lock(&dcache_lock);
		dentry->d_flags |= DCACHE_HOST_KEPT;
		spin_unlock(&dcache_lock);
		dget(dentry);	/* the reference that keeps it */
	}
	return NULL;
}

/* 1 while the host still has this name with the same node id and type. */
static int hostfs_d_revalidate(struct dentry *dentry, unsigned int flags)
{
	struct inode *inode = dentry->d_inode;
	struct dentry *parent = dentry->d_parent;
	u32 mode, mutexes;
	long id;

	if (IS_ROOT(dentry) || (dentry->d_flags & DCACHE_MOUNTPOINT))
		return 1;
	if ((dentry->d_flags & DCACHE_PINNED) && !(dentry->d_flags & DCACHE_TRACEFS))
		return 1;	/* a kernel-made automount point */
	if (dentry->d_flags & DCACHE_HOST_KEPT)
		return 1;	/* a name the host keeps while the kernel runs */
	if (!inode)
		return 0;
	if (!hostfs_inode_is_host(inode))
		return 1;	/* a tracefs file with kernel fops */
	hostfs_stats.revalidations++;
	id = hostfs_lookup_host(hostfs_node(parent->d_inode), dentry->d_name.name, &mode,
				NULL, &mutexes);
	if (id <= 0)
		goto stale;
	if ((mode & S_IFMT) != (inode->i_mode & S_IFMT))
		goto stale;
	if (!hostfs_node(inode) && (dentry->d_flags & DCACHE_TRACEFS)) {
		/* made by tracefs_create_dir() before the host knew the name */
		inode->i_ino = id;
		hostfs_set_ops(inode, id, mode);
		inode->i_mutexes = mutexes;
		return 1;
	}
	if (id != hostfs_node(inode))
		goto stale;
	inode->i_mode = mode;
	inode->i_mutexes = mutexes;
	return 1;
stale:
	hostfs_stats.stale++;
	return 0;
}

static const struct dentry_operations hostfs_dentry_operations = {
	.d_revalidate = hostfs_d_revalidate,
};

/* ---- files ---------------------------------------------------------------------- */

static int hostfs_open(struct inode *inode, struct file *file)
{
	unsigned int bits = HOSTFS_MUTEXES_OPEN(inode->i_mutexes);
	long handle;

	if (hostfs_node(inode) <= 0)
		return -ENOENT;
	if ((file->f_flags & O_TRUNC) && (file->f_mode & FMODE_WRITE))
		bits |= HOSTFS_MUTEXES_TRUNC(inode->i_mutexes);
	handle = hostfs_call(bits, inode->i_mutexes & HOSTFS_WORK_UNLOCKED, HC_HOSTFS_OPEN,
			     hostfs_node(inode), file->f_flags, current->pid, 0);
	hostfs_stats.opens++;
	if (handle < 0)
		return (int)handle;
	if (!handle)
		return -EIO;
	file->private_data = (void *)handle;
	return 0;
}

static int hostfs_release(struct inode *inode, struct file *file)
{
	long handle = (long)file->private_data;

	if (handle > 0)
		host_work_run(hypercall(HC_HOSTFS_RELEASE, handle, 0, 0, 0));
	file->private_data = NULL;
	return 0;
}

static void *hostfs_alloc_bounce(size_t size)
{
	if (size <= 4000)
		return kmalloc(size ? size : 1, GFP_KERNEL);
	return alloc_pages_exact(size, GFP_KERNEL);
}

static void hostfs_free_bounce(void *buf, size_t size)
{
	if (size <= 4000)
		kfree(buf);
	else
		free_pages_exact(buf, size);
}

/* Bounces through a kernel buffer, at most HOSTFS_READ_CHUNK per host call; stops at a
 * short read.  An error after some data returns the data. */
static ssize_t hostfs_read(struct file *file, char __user *buf, size_t count, loff_t *ppos)
{
	long handle = (long)file->private_data;
	u32 mutexes = file_inode(file)->i_mutexes;
	size_t bufsz = min(count, (size_t)HOSTFS_READ_CHUNK);
	ssize_t copied = 0;
	char *kbuf;

	if (!count)
		return 0;
	kbuf = hostfs_alloc_bounce(bufsz);
	if (!kbuf)
		return -ENOMEM;
	while (count) {
		size_t chunk = min(count, bufsz);
		long n = hostfs_call(HOSTFS_MUTEXES_READ(mutexes), mutexes & HOSTFS_WORK_UNLOCKED,
				     HC_HOSTFS_READ, handle, (long)kbuf, chunk, *ppos);

		hostfs_stats.reads++;
		if (n < 0) {
			if (!copied)
				copied = n;
			break;
		}
		if (n == 0)
			break;
		if ((size_t)n > chunk)
			n = chunk;
		if (copy_to_user(buf + copied, kbuf, n)) {
			if (!copied)
				copied = -EFAULT;
			break;
		}
		copied += n;
		count -= n;
		*ppos += n;
		hostfs_stats.bytes_read += n;
		if ((size_t)n < chunk)
			break;
	}
	hostfs_free_bounce(kbuf, bufsz);
	return copied;
}

/* Up to HOSTFS_WRITE_MAX bytes go to the host in a single call, because the host acts
 * on each write() as a whole (a kprobe_events line must not arrive in pieces). */
static ssize_t hostfs_write(struct file *file, const char __user *buf, size_t count,
			    loff_t *ppos)
{
	long handle = (long)file->private_data;
	u32 mutexes = file_inode(file)->i_mutexes;
	size_t bufsz = min(count, (size_t)HOSTFS_WRITE_MAX);
	ssize_t written = 0;
	char *kbuf;

	kbuf = hostfs_alloc_bounce(bufsz);
	if (!kbuf)
		return -ENOMEM;
	do {
		size_t chunk = min(count, bufsz);
		long n;

		if (copy_from_user(kbuf, buf + written, chunk)) {
			if (!written)
				written = -EFAULT;
			break;
		}
		n = hostfs_call(HOSTFS_MUTEXES_WRITE(mutexes), mutexes & HOSTFS_WORK_UNLOCKED,
				HC_HOSTFS_WRITE, handle, (long)kbuf, chunk, *ppos);
		hostfs_stats.writes++;
		if (n < 0) {
			if (!written)
				written = n;
			break;
		}
		if ((size_t)n > chunk)
			n = chunk;
		written += n;
		count -= n;
		*ppos += n;
		hostfs_stats.bytes_written += n;
		if ((size_t)n < chunk)
			break;
	} while (count);
	hostfs_free_bounce(kbuf, bufsz);
	return written;
}

const struct file_operations hostfs_file_operations = {
	.llseek = generic_file_llseek,
	.read = hostfs_read,
	.write = hostfs_write,
	.open = hostfs_open,
	.release = hostfs_release,
};

/* ---- directories ---------------------------------------------------------------- */

static int hostfs_readdir(struct file *file, void *arg)
{
	struct dir_context *ctx = arg;
	struct dentry *dentry = file->f_path.dentry;
	struct inode *inode = file_inode(file);
	long dir_id = hostfs_node(inode);
	char *kbuf;
	int err = 0;

	if (ctx->pos == 0) {
		if (!dir_emit(ctx, ".", 1, inode->i_ino, DT_DIR))
			return 0;
		ctx->pos = 1;
	}
	if (ctx->pos == 1) {
		struct dentry *parent = dentry->d_parent;

		if (!dir_emit(ctx, "..", 2, parent->d_inode->i_ino, DT_DIR))
			return 0;
		ctx->pos = 2;
	}
	if (dir_id <= 0)
		return 0;
	kbuf = kmalloc(HOSTFS_DIRENT_SIZE, GFP_KERNEL);
	if (!kbuf)
		return -ENOMEM;
	for (;;) {
		long id;
		u32 mode;

		memset(kbuf, 0, HOSTFS_DIRENT_SIZE);
		id = hypercall(HC_HOSTFS_READDIR, dir_id, ctx->pos - 2, kbuf, 0);
		if (id < 0)
			err = (int)id;
		if (id <= 0)
			break;
		kbuf[NAME_MAX] = 0;
		mode = *(u32 *)(kbuf + 256);
		if (!dir_emit(ctx, kbuf, strlen(kbuf), id, fs_umode_to_dtype(mode)))
			break;
		ctx->pos++;
	}
	kfree(kbuf);
	return err;
}

const struct file_operations hostfs_dir_operations = {
	.llseek = generic_file_llseek,
	.read = generic_read_dir,
	.iterate = hostfs_readdir,
};

/* mkdir and rmdir ask the host, which makes or removes the directory where the node
 * allows it (tracefs's instances/) and answers -EPERM elsewhere.  No create, unlink
 * or symlink: the VFS answers -EACCES/-EPERM for them. */
static int hostfs_mkdir(struct inode *dir, struct dentry *dentry, umode_t mode)
{
	struct inode *inode;
	u32 hmode = 0;
	long id;

	if (dentry->d_name.len > NAME_MAX)
		return -ENAMETOOLONG;
	hostfs_lock(HOSTFS_MUTEXES_WRITE(dir->i_mutexes));
	id = hypercall5(HC_HOSTFS_MKDIR, hostfs_node(dir), (long)dentry->d_name.name, mode,
			(long)&hmode, HOSTFS_MUTEXES_WRITE(dir->i_mutexes) != 0);
	hostfs_unlock(HOSTFS_MUTEXES_WRITE(dir->i_mutexes));
	if (id < 0) {
		hostfs_stats.errors++;
		return (int)id;
	}
	if (!id || !S_ISDIR(hmode))
		return 0;	/* made, and gone again already: the dentry stays negative */
	inode = hostfs_iget(dir->i_sb, id, hmode);
	if (!inode)
		return -ENOMEM;
	d_instantiate(dentry, inode);
	return 0;
}

static int hostfs_rmdir(struct inode *dir, struct dentry *dentry)
{
	long ret;

	hostfs_lock(HOSTFS_MUTEXES_WRITE(dir->i_mutexes));
	ret = hypercall5(HC_HOSTFS_RMDIR, hostfs_node(dir), (long)dentry->d_name.name, 0, 0,
			 HOSTFS_MUTEXES_WRITE(dir->i_mutexes) != 0);
	hostfs_unlock(HOSTFS_MUTEXES_WRITE(dir->i_mutexes));

	if (ret < 0)
		hostfs_stats.errors++;
	return (int)ret;
}

static const struct inode_operations hostfs_dir_inode_operations = {
	.lookup = hostfs_lookup,
	.mkdir = hostfs_mkdir,
	.rmdir = hostfs_rmdir,
};

/* ---- kernel-made names (tracefs_create_dir(), the debugfs automount) ------------ */

/* Adds a name under parent that the kernel, not the host, decides exists; pinned until
 * tracefs_remove().  A host file takes the host's id when it has the name already;
 * fops (with data) makes a file served by the kernel itself. */
struct dentry *hostfs_create_dentry(struct dentry *parent, const char *name, umode_t mode,
				    unsigned int dflags, const struct file_operations *fops,
				    void *data)
{
	struct qstr q = { .name = name, .len = strlen(name) };
	struct inode *dir, *inode;
	struct dentry *dentry, *old;
	long id = 0;
	u32 hmode = 0, mutexes = 0;

	if (!parent || !d_is_dir(parent))
		return ERR_PTR(-ENOTDIR);
	if (!q.len || q.len > NAME_MAX || strchr(name, '/'))
		return ERR_PTR(-EINVAL);
	dir = parent->d_inode;
	if (!fops && hostfs_inode_is_host(dir)) {
		id = hostfs_lookup_host(hostfs_node(dir), name, &hmode, NULL, &mutexes);
		if (id <= 0 || (hmode & S_IFMT) != (mode & S_IFMT)) {
			id = 0;
			hmode = mode;
		}
	} else {
		hmode = mode;
	}

	inode_lock(dir);
	old = d_lookup(parent, &q);
	if (old) {
		if (old->d_flags & (DCACHE_PINNED | DCACHE_MOUNTPOINT)) {
			inode_unlock(dir);
			dput(old);
			return ERR_PTR(-EEXIST);
		}
		d_drop(old);	/* a host name somebody is using: ours replaces it */
		if (old->d_flags & DCACHE_HOST_KEPT) {
			old->d_flags &= ~DCACHE_HOST_KEPT;
			dput(old);	/* the reference that kept it */
		}
		dput(old);
	}
	dentry = d_alloc(parent, &q);
	if (!dentry) {
		inode_unlock(dir);
		return ERR_PTR(-ENOMEM);
	}
	inode = hostfs_iget(dir->i_sb, id, hmode);
	if (!inode) {
		inode_unlock(dir);
		dput(dentry);
		return ERR_PTR(-ENOMEM);
	}
	inode->i_mutexes = mutexes;
	if (fops) {
		inode->i_op = NULL;
		inode->i_fop = fops;
		inode->i_private = data;
	}
	d_add(dentry, inode);
	spin_lock(&dcache_lock);
	dentry->d_flags |= DCACHE_PINNED | dflags;	/* the d_alloc reference is the pin */
	spin_unlock(&dcache_lock);
	inode_unlock(dir);
	return dentry;
}

struct dentry *debugfs_create_automount(const char *name, struct dentry *parent)
{
	return hostfs_create_dentry(parent, name, S_IFDIR | 0700, 0, NULL, NULL);
}

/* ---- superblocks ------------------------------------------------------------------ */

static int hostfs_fill_super(struct super_block *sb, long root_id)
{
	/* debugfs and tracefs roots are root-only; /proc is world-readable. */
	umode_t mode = sb->s_magic == PROC_SUPER_MAGIC ? 0555 : 0700;
	struct inode *inode = hostfs_iget(sb, root_id, S_IFDIR | mode);

	sb->s_d_op = &hostfs_dentry_operations;
	sb->s_fs_info = (void *)root_id;
	sb->s_root = d_make_root(inode);
	return sb->s_root ? 0 : -ENOMEM;
}

struct dentry *hostfs_mount_id(struct file_system_type *fs_type, long root_id,
			       unsigned long magic)
{
	struct super_block *sb;
	int err;

	if (root_id <= 0)
		return ERR_PTR(-EINVAL);
	sb = sget_fc(fs_type, magic);
	if (IS_ERR(sb))
		return ERR_CAST(sb);
	err = hostfs_fill_super(sb, root_id);
	if (err) {
		kfree(sb);
		return ERR_PTR(err);
	}
	return sb->s_root;
}

/* "hostfs": data is the host node to root the mount at. */
static struct dentry *hostfs_mount(struct file_system_type *fs_type, int flags,
				   const char *dev_name, void *data)
{
	return hostfs_mount_id(fs_type, (long)data, HOSTFS_MAGIC);
}

static struct dentry *debug_mount(struct file_system_type *fs_type, int flags,
				  const char *dev_name, void *data)
{
	return hostfs_mount_id(fs_type, HOSTFS_DEBUG_ROOT, DEBUGFS_MAGIC);
}

static struct dentry *proc_mount(struct file_system_type *fs_type, int flags,
				 const char *dev_name, void *data)
{
	return hostfs_mount_id(fs_type, HOSTFS_PROC_ROOT, PROC_SUPER_MAGIC);
}

struct file_system_type hostfs_fs_type = {
	.name = "hostfs",
	.mount = hostfs_mount,
};

struct file_system_type debug_fs_type = {
	.name = "debugfs",
	.mount = debug_mount,
};

struct file_system_type proc_fs_type = {
	.name = "proc",
	.mount = proc_mount,
};
