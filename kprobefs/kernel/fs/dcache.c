/* The dentry cache.  A dentry names an inode (or, while negative, the absence of one)
 * inside its parent directory.  Children hang off the parent's d_subdirs list (walked by
 * simple_empty() and the filesystems' readdir); d_lookup() finds them in one global hash
 * table keyed by the parent and the name, as Linux's d_hash() does, so a directory of
 * 10,000 kprobe events costs a lookup no more than a directory of ten.
 *
 * Lifetime: every child holds a reference on its parent; a filesystem that wants a name
 * to stay (ramfs, tracefs) pins it with DCACHE_PINNED and one extra reference.  There is
 * no LRU: a dentry whose last reference goes is freed at once, so negative and hostfs
 * dentries live only as long as somebody uses them. */
#include "fs.h"
#include "syscalls.h"
#include "uaccess.h"

DEFINE_SPINLOCK(dcache_lock);
unsigned long nr_dentry;

/* Every child dentry, from d_alloc() until it is freed, chained through d_hash_next in
 * the bucket of its salted name hash.  Unhashed (dropped, deleted) ones stay chained and
 * d_lookup() skips them, as it used to skip them on the parent's list. */
#define D_HASH_SHIFT	14
static struct dentry *dentry_hashtable[1 << D_HASH_SHIFT];

static inline struct dentry **d_hash(u32 hash)
{
	return &dentry_hashtable[(hash * 0x61c88647u) >> (32 - D_HASH_SHIFT)];
}

static void __d_hash_del(struct dentry *dentry)
{
	struct dentry **pp = d_hash(dentry->d_name.hash);

	while (*pp != dentry)
		pp = &(*pp)->d_hash_next;
	*pp = dentry->d_hash_next;
	dentry->d_hash_next = NULL;
}

/* The hash of a name component, salted by the parent so equal names in different
 * directories spread apart (as Linux's hash_name() does with the parent pointer). */
u32 full_name_hash(const void *salt, const char *name, unsigned int len)
{
	u32 hash = (u32)(unsigned long)salt ^ 0x9e3779b9u;
	unsigned int i;

	for (i = 0; i < len; i++)
		hash = (hash + (u8)name[i]) * 0x01000193u;
	return hash ^ (hash >> 15);
}

static struct dentry *__d_alloc(struct super_block *sb, const struct qstr *name)
{
	struct dentry *dentry = kzalloc(sizeof(*dentry), GFP_KERNEL);
	char *dname;

	if (!dentry)
		return NULL;
	if (name->len >= sizeof(dentry->d_iname)) {
		dname = kmalloc(name->len + 1, GFP_KERNEL);
		if (!dname) {
			kfree(dentry);
			return NULL;
		}
	} else {
		dname = dentry->d_iname;
	}
	memcpy(dname, name->name, name->len);
	dname[name->len] = 0;
	dentry->d_name.name = dname;
	dentry->d_name.len = name->len;
	dentry->d_name.hash = name->hash;
	atomic_set(&dentry->d_count, 1);
	dentry->d_parent = dentry;
	dentry->d_sb = sb;
	INIT_LIST_HEAD(&dentry->d_child);
	INIT_LIST_HEAD(&dentry->d_subdirs);
	__atomic_add_fetch(&nr_dentry, 1, __ATOMIC_RELAXED);
	return dentry;
}

/* A new, unhashed, negative child of parent; the caller owns the one reference. */
struct dentry *d_alloc(struct dentry *parent, const struct qstr *name)
{
	struct dentry *dentry = __d_alloc(parent->d_sb, name);

	if (!dentry)
		return NULL;
	spin_lock(&dcache_lock);
	dentry->d_parent = dget(parent);
	dentry->d_name.hash = full_name_hash(parent, name->name, name->len);
	list_add_tail(&dentry->d_child, &parent->d_subdirs);
	dentry->d_hash_next = *d_hash(dentry->d_name.hash);
	*d_hash(dentry->d_name.hash) = dentry;
	spin_unlock(&dcache_lock);
	return dentry;
}

struct dentry *d_alloc_name(struct dentry *parent, const char *name)
{
	struct qstr q = { .name = name, .len = strlen(name) };

	return d_alloc(parent, &q);
}

/* A dentry belonging to no directory: sockets, the roots of filesystems. */
struct dentry *d_alloc_pseudo(struct super_block *sb, const struct qstr *name)
{
	return __d_alloc(sb, name);
}

struct dentry *d_make_root(struct inode *root_inode)
{
	static const struct qstr slash = { .name = "/", .len = 1 };
	struct dentry *res;

	if (!root_inode)
		return NULL;
	res = d_alloc_pseudo(root_inode->i_sb, &slash);
	if (!res) {
		iput(root_inode);
		return NULL;
	}
	res->d_inode = root_inode;
	res->d_flags |= DCACHE_HASHED | DCACHE_PINNED;
	return res;
}

/* Gives inode (and the caller's reference on it) to a negative dentry. */
void d_instantiate(struct dentry *dentry, struct inode *inode)
{
	spin_lock(&dcache_lock);
	BUG_ON(dentry->d_inode);
	dentry->d_inode = inode;
	spin_unlock(&dcache_lock);
}

void d_add(struct dentry *dentry, struct inode *inode)
{
	spin_lock(&dcache_lock);
	dentry->d_inode = inode;
	dentry->d_flags |= DCACHE_HASHED;
	spin_unlock(&dcache_lock);
}

/* Make the name unfindable; users that already hold the dentry keep it. */
void d_drop(struct dentry *dentry)
{
	spin_lock(&dcache_lock);
	dentry->d_flags &= ~DCACHE_HASHED;
	spin_unlock(&dcache_lock);
}

/* The name was removed (unlink, rmdir): nobody finds it again, and its inode goes with
 * the last reference. */
void d_delete(struct dentry *dentry)
{
	spin_lock(&dcache_lock);
	dentry->d_flags = (dentry->d_flags & ~DCACHE_HASHED) | DCACHE_DEAD;
	spin_unlock(&dcache_lock);
}

/* Called with dcache_lock held and the count at zero: unlink the dentry from its parent,
 * then (lock dropped) free it.  Returns the parent, whose reference the caller drops. */
static struct dentry *__dentry_kill(struct dentry *dentry)
{
	struct dentry *parent = NULL;
	struct inode *inode = dentry->d_inode;

	dentry->d_flags &= ~DCACHE_HASHED;
	if (!IS_ROOT(dentry)) {
		parent = dentry->d_parent;
		list_del_init(&dentry->d_child);
		__d_hash_del(dentry);
	}
	dentry->d_inode = NULL;
	spin_unlock(&dcache_lock);

	if (inode)
		iput(inode);
	if (dentry->d_name.name != dentry->d_iname)
		kfree(dentry->d_name.name);
	kfree(dentry);
	__atomic_sub_fetch(&nr_dentry, 1, __ATOMIC_RELAXED);
	return parent;
}

/* Drops a reference.  The decrement to zero happens under dcache_lock, so d_lookup(),
 * which takes its references under the same lock, never revives a dying dentry. */
void dput(struct dentry *dentry)
{
	while (dentry) {
		spin_lock(&dcache_lock);
		if (!atomic_dec_and_test(&dentry->d_count)) {
			spin_unlock(&dcache_lock);
			return;
		}
		if (WARN_ON(dentry->d_flags & DCACHE_PINNED)) {
			spin_unlock(&dcache_lock);
			return;
		}
		dentry = __dentry_kill(dentry);
	}
}

/* rename: dentry takes target's name and place (its parent, its hash); target, unhashed,
 * keeps its own name for whoever still holds it. */
void d_move(struct dentry *dentry, struct dentry *target)
{
	unsigned int len = target->d_name.len;
	char *dname = len >= sizeof(dentry->d_iname) ? kmalloc(len + 1, GFP_KERNEL) : NULL;
	char *old_name = NULL;
	struct dentry *old_parent = NULL;

	if (!dname)
		dname = dentry->d_iname;	/* fits, or no memory: cut to the inline name */
	if (dname == dentry->d_iname && len >= sizeof(dentry->d_iname))
		len = sizeof(dentry->d_iname) - 1;
	spin_lock(&dcache_lock);
	target->d_flags &= ~DCACHE_HASHED;
	__d_hash_del(dentry);
	if (dentry->d_name.name != dentry->d_iname)
		old_name = (char *)dentry->d_name.name;
	memmove(dname, target->d_name.name, len);
	dname[len] = 0;
	dentry->d_name.name = dname;
	dentry->d_name.len = len;
	dentry->d_name.hash = target->d_name.hash;
	if (dentry->d_parent != target->d_parent) {
		old_parent = dentry->d_parent;
		dentry->d_parent = dget(target->d_parent);
		list_del_init(&dentry->d_child);
		list_add_tail(&dentry->d_child, &target->d_parent->d_subdirs);
	}
	dentry->d_hash_next = *d_hash(dentry->d_name.hash);
	*d_hash(dentry->d_name.hash) = dentry;
	spin_unlock(&dcache_lock);
	kfree(old_name);
	dput(old_parent);
}

static inline bool d_same_name(const struct dentry *dentry, const struct qstr *name)
{
	return dentry->d_name.len == name->len &&
	       !memcmp(dentry->d_name.name, name->name, name->len);
}

/* Finds a hashed child called name; returns it with a new reference, or NULL. */
static struct dentry *__d_lookup(const struct dentry *parent, const struct qstr *name)
{
	u32 hash = full_name_hash(parent, name->name, name->len);
	struct dentry *dentry;

	for (dentry = *d_hash(hash); dentry; dentry = dentry->d_hash_next) {
		if (dentry->d_name.hash != hash || dentry->d_parent != parent ||
		    d_unhashed(dentry))
			continue;
		if (!d_same_name(dentry, name))
			continue;
		return dget(dentry);
	}
	return NULL;
}

struct dentry *d_lookup(const struct dentry *parent, const struct qstr *name)
{
	struct dentry *dentry;

	spin_lock(&dcache_lock);
	dentry = __d_lookup(parent, name);
	spin_unlock(&dcache_lock);
	return dentry;
}

/* True when dentry has no positive, hashed child (ramfs rmdir's condition). */
bool simple_empty(struct dentry *dentry)
{
	struct dentry *child;
	bool ret = true;

	spin_lock(&dcache_lock);
	list_for_each_entry(child, &dentry->d_subdirs, d_child) {
		if (child->d_inode && !d_unhashed(child)) {
			ret = false;
			break;
		}
	}
	spin_unlock(&dcache_lock);
	return ret;
}

/* Writes the path of dentry, relative to root, at buf[*pos..]: the parent's path first,
 * then "/name".  A filesystem root continues at the dentry it is mounted on.  Genuinely
 * recursive, one frame per component (kretprobe maxactive tests rely on it). */
static noinline int prepend_path(const struct dentry *dentry, const struct dentry *root,
				 char *buf, int buflen, int *pos)
{
	const struct dentry *mp;
	int len, err;

	if (dentry == root)
		return 0;
	if (IS_ROOT(dentry)) {
		mp = lookup_mountpoint(dentry);
		if (!mp)
			return 0;	/* the root of everything, or a pseudo filesystem */
		return prepend_path(mp, root, buf, buflen, pos);
	}
	err = prepend_path(dentry->d_parent, root, buf, buflen, pos);
	if (err)
		return err;
	len = dentry->d_name.len;
	if (*pos + 1 + len >= buflen)
		return -ENAMETOOLONG;
	buf[(*pos)++] = '/';
	memcpy(buf + *pos, dentry->d_name.name, len);
	*pos += len;
	buf[*pos] = 0;
	return 0;
}

/* The path of path->dentry as seen from the caller's root, NUL-terminated at the start
 * of buf; " (deleted)" is appended for an unlinked name, as Linux does. */
char *d_path(const struct path *path, char *buf, int buflen)
{
	struct path root;
	int pos = 0, err;

	if (buflen < 2)
		return ERR_PTR(-ENAMETOOLONG);
	get_fs_root(current->fs, &root);
	buf[0] = 0;
	err = prepend_path(path->dentry, root.dentry, buf, buflen, &pos);
	path_put(&root);
	if (err)
		return ERR_PTR(err);
	if (!pos) {
		buf[pos++] = '/';
		buf[pos] = 0;
	}
	if (path->dentry->d_flags & DCACHE_DEAD) {
		if (pos + 10 >= buflen)
			return ERR_PTR(-ENAMETOOLONG);
		memcpy(buf + pos, " (deleted)", 11);
	}
	return buf;
}

SYSCALL_DECL(getcwd)
{
	char __user *ubuf = (char __user *)regs->di;
	unsigned long size = regs->si;
	struct path pwd;
	char *page, *cwd;
	long error;

	page = kmalloc(PATH_MAX, GFP_KERNEL);
	if (!page)
		return -ENOMEM;
	get_fs_pwd(current->fs, &pwd);
	error = -ENOENT;
	if (pwd.dentry->d_flags & DCACHE_DEAD)
		goto out;
	cwd = d_path(&pwd, page, PATH_MAX);
	error = PTR_ERR(cwd);
	if (IS_ERR(cwd))
		goto out;
	error = strlen(cwd) + 1;
	if ((unsigned long)error > size)
		error = -ERANGE;
	else if (copy_to_user(ubuf, cwd, error))
		error = -EFAULT;
out:
	path_put(&pwd);
	kfree(page);
	return error;
}

/* ---- boot: the root filesystem and the tree every task starts with ------------------- */

struct boot_dir {
	const char *path;
	umode_t mode;
};

static const struct boot_dir boot_dirs[] = {
	{ "/tmp", 01777 },
	{ "/dev", 0755 },
	{ "/proc", 0555 },
	{ "/sys", 0555 },
	{ "/sys/kernel", 0755 },
	{ "/sys/kernel/debug", 0700 },
	{ "/sys/kernel/tracing", 0700 },
};

static void __init_or_panic(int err, const char *what)
{
	if (err)
		panic("VFS: %s failed: %d", what, err);
}

void vfs_caches_init(void)
{
	struct path sys, debug;
	struct dentry *mp;
	unsigned int i;

	mnt_init();
	for (i = 0; i < ARRAY_SIZE(boot_dirs); i++)
		__init_or_panic(init_mkdir(boot_dirs[i].path, boot_dirs[i].mode),
				boot_dirs[i].path);
	__init_or_panic(init_mknod("/dev/null", S_IFCHR | 0666, MKDEV(1, 3)), "/dev/null");
	__init_or_panic(init_mknod("/dev/zero", S_IFCHR | 0666, MKDEV(1, 5)), "/dev/zero");
	__init_or_panic(init_mknod("/dev/kmsg", S_IFCHR | 0644, MKDEV(1, 11)), "/dev/kmsg");

	__init_or_panic(kern_path("/sys", LOOKUP_DIRECTORY, &sys), "/sys");
	sysfs_init(sys.dentry);
	path_put(&sys);

	/* debugfs, with tracefs also reachable at debug/tracing, as Linux automounts it */
	__init_or_panic(init_mount("debugfs", "/sys/kernel/debug", "debugfs", 0, NULL),
			"mount debugfs");
	__init_or_panic(init_mount("tracefs", "/sys/kernel/tracing", "tracefs", 0, NULL),
			"mount tracefs");
	__init_or_panic(kern_path("/sys/kernel/debug", LOOKUP_DIRECTORY, &debug),
			"/sys/kernel/debug");
	mp = debugfs_create_automount("tracing", debug.dentry);
	path_put(&debug);
	if (IS_ERR(mp))
		panic("VFS: debugfs automount: %ld", PTR_ERR(mp));
	__init_or_panic(init_mount("tracefs", "/sys/kernel/debug/tracing", "tracefs", 0, NULL),
			"mount tracefs on debugfs");
	__init_or_panic(init_mount("proc", "/proc", "proc", 0, NULL), "mount proc");

	__init_or_panic(kern_path("/sys/kernel/tracing", LOOKUP_DIRECTORY, &debug),
			"/sys/kernel/tracing");
	tracefs_init(debug.dentry);	/* the mount keeps it; the reference is the tracer's */
	pr_info("VFS: Mounted root (ramfs filesystem), %lu dentries\n", nr_dentry);
}
