/* Pathname lookup: user names into the kernel, the component walk (dcache first, then
 * the filesystem's ->lookup), symlinks, mount crossings and "..", and the directory
 * operations built on it (create, mkdir, symlink, unlink, rmdir, readlink). */
#include "fs.h"
#include "syscalls.h"
#include "uaccess.h"

/* ---- struct filename ---------------------------------------------------------------- */

#define EMBEDDED_NAME_MAX (4096 - 64 - sizeof(struct filename))

struct filename *getname_flags(const char __user *filename, int flags, int *empty)
{
	struct filename *result;
	char *kname;
	long len;

	result = kmalloc(sizeof(*result) + EMBEDDED_NAME_MAX, GFP_KERNEL);
	if (unlikely(!result))
		return ERR_PTR(-ENOMEM);
	kname = result->iname;
	result->name = kname;
	len = strncpy_from_user(kname, filename, EMBEDDED_NAME_MAX);
	if (unlikely(len < 0)) {
		kfree(result);
		return ERR_PTR(len);
	}
	/* Too long for the embedded buffer: copy again into a PATH_MAX one. */
	if (unlikely(len == EMBEDDED_NAME_MAX)) {
		kname = kmalloc(PATH_MAX, GFP_KERNEL);
		if (!kname) {
			kfree(result);
			return ERR_PTR(-ENOMEM);
		}
		result->name = kname;
		len = strncpy_from_user(kname, filename, PATH_MAX);
		if (len < 0 || len == PATH_MAX) {
			kfree(kname);
			kfree(result);
			return ERR_PTR(len < 0 ? len : -ENAMETOOLONG);
		}
	}
	result->refcnt = 1;
	result->uptr = filename;
	if (unlikely(!len)) {
		if (empty)
			*empty = 1;
		if (!(flags & LOOKUP_EMPTY)) {
			putname(result);
			return ERR_PTR(-ENOENT);
		}
	}
	return result;
}

struct filename *getname(const char __user *filename)
{
	return getname_flags(filename, 0, NULL);
}

struct filename *getname_kernel(const char *filename)
{
	size_t len = strlen(filename) + 1;
	struct filename *result;

	if (len > PATH_MAX)
		return ERR_PTR(-ENAMETOOLONG);
	result = kmalloc(sizeof(*result) + len, GFP_KERNEL);
	if (!result)
		return ERR_PTR(-ENOMEM);
	memcpy(result->iname, filename, len);
	result->name = result->iname;
	result->uptr = NULL;
	result->refcnt = 1;
	return result;
}

void putname(struct filename *name)
{
	if (IS_ERR_OR_NULL(name))
		return;
	if (--name->refcnt > 0)
		return;
	if (name->name != name->iname)
		kfree(name->name);
	kfree(name);
}

/* ---- the walk ----------------------------------------------------------------------- */

enum { LAST_NORM, LAST_ROOT, LAST_DOT, LAST_DOTDOT };
enum { WALK_TRAILING = 1, WALK_MORE = 2, WALK_NOFOLLOW = 4 };

struct nameidata {
	struct path path;		/* where the walk is; holds a reference */
	struct qstr last;		/* the component being (or last) looked at */
	struct path root;		/* the caller's root; holds a reference */
	struct inode *inode;		/* path.dentry->d_inode */
	unsigned int flags;
	int last_type;
	int dfd;
	unsigned int depth;		/* symlink bodies being walked */
	int total_link_count;
	struct filename *name;
	const char *stack[MAX_NESTED_LINKS];	/* what is left of each outer name */
	char *link_bufs[MAXSYMLINKS];
	int nr_link_bufs;
};

static void set_nameidata(struct nameidata *nd, int dfd, struct filename *name)
{
	memset(nd, 0, sizeof(*nd));
	nd->dfd = dfd;
	nd->name = name;
}

static void terminate_walk(struct nameidata *nd)
{
	int i;

	if (nd->path.dentry) {
		path_put(&nd->path);
		nd->path.dentry = NULL;
	}
	if (nd->root.dentry) {
		path_put(&nd->root);
		nd->root.dentry = NULL;
	}
	for (i = 0; i < nd->nr_link_bufs; i++)
		kfree(nd->link_bufs[i]);
	nd->nr_link_bufs = 0;
	nd->depth = 0;
}

static inline bool d_can_lookup(const struct dentry *dentry)
{
	return d_is_dir(dentry);
}

static void nd_set_path(struct nameidata *nd, struct dentry *dentry)
{
	if (nd->path.dentry)
		dput(nd->path.dentry);
	nd->path.dentry = dentry;
	nd->inode = dentry->d_inode;
}

static void nd_jump_root(struct nameidata *nd)
{
	nd_set_path(nd, dget(nd->root.dentry));
}

/* Start of a walk: the root for an absolute name, else the cwd or the dfd's directory. */
static const char *path_init(struct nameidata *nd, unsigned int flags)
{
	const char *s = nd->name->name;
	struct file *f;

	nd->flags = flags;
	get_fs_root(current->fs, &nd->root);
	if (*s == '/') {
		nd_jump_root(nd);
		return s;
	}
	if (nd->dfd == AT_FDCWD) {
		struct path pwd;

		get_fs_pwd(current->fs, &pwd);
		nd_set_path(nd, pwd.dentry);
		return s;
	}
	f = fget(nd->dfd);
	if (!f)
		return ERR_PTR(-EBADF);
	if (*s && !d_can_lookup(f->f_path.dentry)) {
		fput(f);
		return ERR_PTR(-ENOTDIR);
	}
	nd_set_path(nd, dget(f->f_path.dentry));
	fput(f);
	return s;
}

static inline int d_revalidate(struct dentry *dentry, unsigned int flags)
{
	const struct dentry_operations *op = dentry->d_sb->s_d_op;

	if (op && op->d_revalidate)
		return op->d_revalidate(dentry, flags);
	return 1;
}

/* The cached child called name, revalidated; NULL when the cache has nothing usable. */
static struct dentry *lookup_dcache(const struct qstr *name, struct dentry *dir,
				    unsigned int flags)
{
	struct dentry *dentry = d_lookup(dir, name);
	int error;

	if (!dentry)
		return NULL;
	error = d_revalidate(dentry, flags);
	if (likely(error > 0))
		return dentry;
	if (!error)
		d_drop(dentry);
	dput(dentry);
	return error ? ERR_PTR(error) : NULL;
}

/* Caller holds the directory's inode lock: look in the cache, else ask the filesystem. */
static struct dentry *__lookup_slow(const struct qstr *name, struct dentry *dir,
				    unsigned int flags)
{
	struct inode *inode = dir->d_inode;
	struct dentry *dentry, *old;

	dentry = lookup_dcache(name, dir, flags);
	if (dentry)
		return dentry;
	if (S_ISDIR(inode->i_mode) && !inode->i_nlink)
		return ERR_PTR(-ENOENT);	/* the directory was removed */
	if (!inode->i_op || !inode->i_op->lookup)
		return ERR_PTR(-ENOTDIR);
	dentry = d_alloc(dir, name);
	if (!dentry)
		return ERR_PTR(-ENOMEM);
	old = inode->i_op->lookup(inode, dentry, flags);
	if (unlikely(old)) {
		dput(dentry);
		dentry = old;
	}
	return dentry;
}

static noinline struct dentry *lookup_slow(const struct qstr *name, struct dentry *dir,
				  unsigned int flags)
{
	struct inode *inode = dir->d_inode;
	struct dentry *res;

	inode_lock(inode);
	res = __lookup_slow(name, dir, flags);
	inode_unlock(inode);
	return res;
}

struct dentry *lookup_one_qstr_excl(const struct qstr *name, struct dentry *base,
				    unsigned int flags)
{
	return __lookup_slow(name, base, flags);
}

static noinline struct dentry *lookup_fast(struct nameidata *nd)
{
	return lookup_dcache(&nd->last, nd->path.dentry, nd->flags);
}

/* Steps onto whatever is mounted on dentry (stacked mounts included). */
static struct dentry *follow_managed(struct dentry *dentry)
{
	while (READ_ONCE(dentry->d_mounted)) {
		struct dentry *root = dget(dentry->d_mounted);

		dput(dentry);
		dentry = root;
	}
	return dentry;
}

/* "..": never above the caller's root; from a filesystem's root, first back to the
 * dentry it is mounted on. */
static int follow_dotdot(struct nameidata *nd)
{
	struct dentry *dentry = nd->path.dentry;

	for (;;) {
		struct dentry *mp;

		if (dentry == nd->root.dentry)
			return 0;
		if (!IS_ROOT(dentry))
			break;
		mp = lookup_mountpoint(dentry);
		if (!mp)
			return 0;
		dentry = mp;
	}
	nd_set_path(nd, follow_managed(dget(dentry->d_parent)));
	return 0;
}

static const char *handle_dots(struct nameidata *nd, int type)
{
	int error = 0;

	if (type == LAST_DOTDOT)
		error = follow_dotdot(nd);
	return error ? ERR_PTR(error) : NULL;
}

/* Returns a private copy of the link body to walk next; consumes the link's dentry.
 * nd->path stays on the directory holding the link, where a relative body starts. */
static const char *pick_link(struct nameidata *nd, struct dentry *link, struct inode *inode)
{
	const char *body;
	char *copy;

	if (unlikely(++nd->total_link_count > MAXSYMLINKS) ||
	    unlikely(nd->nr_link_bufs >= MAXSYMLINKS)) {
		dput(link);
		return ERR_PTR(-ELOOP);
	}
	if (inode->i_op && inode->i_op->get_link)
		body = inode->i_op->get_link(link, inode);
	else
		body = inode->i_link;
	if (IS_ERR_OR_NULL(body)) {
		dput(link);
		return body ? body : ERR_PTR(-EINVAL);
	}
	copy = kstrdup(body, GFP_KERNEL);
	dput(link);
	if (!copy)
		return ERR_PTR(-ENOMEM);
	nd->link_bufs[nd->nr_link_bufs++] = copy;
	if (!*copy)
		return ERR_PTR(-ENOENT);
	if (*copy == '/')
		nd_jump_root(nd);
	return copy;
}

static const char *step_into(struct nameidata *nd, int flags, struct dentry *dentry)
{
	struct inode *inode;

	dentry = follow_managed(dentry);
	inode = dentry->d_inode;
	if (unlikely(!inode)) {
		dput(dentry);
		return ERR_PTR(-ENOENT);
	}
	/* Links are followed, except a trailing one without LOOKUP_FOLLOW. */
	if (S_ISLNK(inode->i_mode) && !(flags & WALK_NOFOLLOW) &&
	    !((flags & WALK_TRAILING) && !(nd->flags & LOOKUP_FOLLOW)))
		return pick_link(nd, dentry, inode);
	nd_set_path(nd, dentry);
	return NULL;
}

static const char *walk_component(struct nameidata *nd, int flags)
{
	struct dentry *dentry;

	if (unlikely(nd->last_type != LAST_NORM))
		return handle_dots(nd, nd->last_type);
	dentry = lookup_fast(nd);
	if (IS_ERR(dentry))
		return ERR_CAST(dentry);
	if (!dentry) {
		dentry = lookup_slow(&nd->last, nd->path.dentry, nd->flags);
		if (IS_ERR(dentry))
			return ERR_CAST(dentry);
	}
	return step_into(nd, flags, dentry);
}

/* Walks every component but the last, following symlinks met on the way (their bodies
 * are walked in place of the component, with the rest of the outer name kept on a
 * stack).  On return nd->path is the parent directory and nd->last the final name. */
static int link_path_walk(const char *name, struct nameidata *nd)
{
	if (IS_ERR(name))
		return PTR_ERR(name);
	while (*name == '/')
		name++;
	if (!*name) {
		nd->last_type = LAST_ROOT;
		return 0;
	}
	for (;;) {
		const char *link;
		unsigned int len = 0;
		int type = LAST_NORM;

		while (name[len] && name[len] != '/')
			len++;
		if (unlikely(len > NAME_MAX))
			return -ENAMETOOLONG;
		if (name[0] == '.') {
			if (len == 1)
				type = LAST_DOT;
			else if (len == 2 && name[1] == '.')
				type = LAST_DOTDOT;
		}
		nd->last.name = name;
		nd->last.len = len;
		nd->last.hash = 0;
		nd->last_type = type;

		name += len;
		while (*name == '/')
			name++;
		if (!*name) {
			/* The end of a name: the caller's if it is the outermost one. */
			if (!nd->depth)
				return 0;
			name = nd->stack[--nd->depth];
			link = walk_component(nd, 0);
		} else {
			link = walk_component(nd, WALK_MORE);
		}
		if (unlikely(link)) {
			if (IS_ERR(link))
				return PTR_ERR(link);
			if (unlikely(nd->depth >= MAX_NESTED_LINKS))
				return -ELOOP;
			nd->stack[nd->depth++] = name;
			name = link;
			while (*name == '/')
				name++;
			if (!*name)
				name = nd->stack[--nd->depth];	/* link to "/" */
			continue;
		}
		if (unlikely(!d_can_lookup(nd->path.dentry)))
			return -ENOTDIR;
	}
}

/* The final component of a lookup; returns a link body when it must be followed. */
static const char *lookup_last(struct nameidata *nd)
{
	if (nd->last_type == LAST_NORM && nd->last.name[nd->last.len])
		nd->flags |= LOOKUP_FOLLOW | LOOKUP_DIRECTORY;
	return walk_component(nd, WALK_TRAILING);
}

static int path_lookupat(struct nameidata *nd, unsigned flags, struct path *path)
{
	const char *s = path_init(nd, flags);
	int err;

	while (!(err = link_path_walk(s, nd)) && (s = lookup_last(nd)) != NULL)
		;
	if (!err && (nd->flags & LOOKUP_DIRECTORY) && !d_can_lookup(nd->path.dentry))
		err = -ENOTDIR;
	if (!err) {
		*path = nd->path;
		nd->path.dentry = NULL;
	}
	terminate_walk(nd);
	return err;
}

int filename_lookup(int dfd, struct filename *name, unsigned flags, struct path *path)
{
	struct nameidata nd;

	if (IS_ERR(name))
		return PTR_ERR(name);
	set_nameidata(&nd, dfd, name);
	return path_lookupat(&nd, flags, path);
}

/* Parent of the final component; *last points into name, which must outlive its use. */
static int filename_parentat(int dfd, struct filename *name, unsigned int flags,
			     struct path *parent, struct qstr *last, int *type)
{
	struct nameidata nd;
	const char *s;
	int err;

	if (IS_ERR(name))
		return PTR_ERR(name);
	set_nameidata(&nd, dfd, name);
	s = path_init(&nd, flags | LOOKUP_PARENT);
	err = link_path_walk(s, &nd);
	if (!err) {
		*parent = nd.path;
		*last = nd.last;
		*type = nd.last_type;
		nd.path.dentry = NULL;
	}
	terminate_walk(&nd);
	return err;
}

int kern_path(const char *name, unsigned int flags, struct path *path)
{
	struct filename *f = getname_kernel(name);
	int err = filename_lookup(AT_FDCWD, f, flags, path);

	putname(f);
	return err;
}

int user_path_at_empty(int dfd, const char __user *name, unsigned flags, struct path *path,
		       int *empty)
{
	struct filename *f = getname_flags(name, flags, empty);
	int err = filename_lookup(dfd, f, flags, path);

	putname(f);
	return err;
}

/* ---- open --------------------------------------------------------------------------- */

#define MAY_EXEC 0x1
#define MAY_WRITE 0x2
#define MAY_READ 0x4
#define MAY_APPEND 0x8

int vfs_create(struct user_namespace *mnt_userns, struct inode *dir, struct dentry *dentry,
	       umode_t mode, bool want_excl)
{
	if (dentry->d_inode)
		return -EEXIST;
	if (!dir->i_nlink)
		return -ENOENT;
	if (!dir->i_op->create)
		return -EACCES;
	mode &= 07777;
	mode |= S_IFREG;
	return dir->i_op->create(dir, dentry, mode, want_excl);
}

/* O_CREAT: find or create the final name; caller holds the directory's inode lock. */
static struct dentry *lookup_open(struct nameidata *nd, struct file *file,
				  const struct open_flags *op)
{
	struct dentry *dir = nd->path.dentry;
	struct dentry *dentry;
	int error;

	dentry = __lookup_slow(&nd->last, dir, nd->flags);
	if (IS_ERR(dentry) || dentry->d_inode)
		return dentry;
	error = vfs_create(&init_user_ns, dir->d_inode, dentry, op->mode,
			   op->open_flag & O_EXCL);
	if (error) {
		dput(dentry);
		return ERR_PTR(error);
	}
	file->f_mode |= FMODE_CREATED;
	return dentry;
}

static const char *open_last_lookups(struct nameidata *nd, struct file *file,
				     const struct open_flags *op)
{
	struct dentry *dentry;

	nd->flags |= op->intent;
	if (nd->last_type != LAST_NORM)
		return handle_dots(nd, nd->last_type);

	if (!(op->open_flag & O_CREAT)) {
		if (nd->last.name[nd->last.len])
			nd->flags |= LOOKUP_FOLLOW | LOOKUP_DIRECTORY;
		dentry = lookup_fast(nd);
		if (!dentry)
			dentry = lookup_slow(&nd->last, nd->path.dentry, nd->flags);
	} else {
		struct inode *dir = nd->path.dentry->d_inode;

		if (nd->last.name[nd->last.len])
			return ERR_PTR(-EISDIR);
		inode_lock(dir);
		dentry = lookup_open(nd, file, op);
		inode_unlock(dir);
	}
	if (IS_ERR(dentry))
		return ERR_CAST(dentry);
	if (file->f_mode & FMODE_CREATED) {
		nd_set_path(nd, dentry);
		return NULL;
	}
	return step_into(nd, WALK_TRAILING, dentry);
}

static int may_open(const struct path *path, int acc_mode, int flag)
{
	struct inode *inode = path->dentry->d_inode;

	if (!inode)
		return -ENOENT;
	switch (inode->i_mode & S_IFMT) {
	case S_IFLNK:
		return -ELOOP;
	case S_IFDIR:
		if (acc_mode & MAY_WRITE)
			return -EISDIR;
		break;
	case S_IFSOCK:
		return -ENXIO;
	default:
		break;
	}
	return 0;
}

static int handle_truncate(struct file *filp)
{
	return do_truncate(&init_user_ns, filp->f_path.dentry, 0, 0, filp);
}

static int do_open(struct nameidata *nd, struct file *file, const struct open_flags *op)
{
	int open_flag = op->open_flag;
	int acc_mode = op->acc_mode;
	bool do_trunc = false;
	int error;

	if (!(file->f_mode & FMODE_CREATED)) {
		if ((open_flag & O_CREAT) && (open_flag & O_EXCL))
			return -EEXIST;
		if ((open_flag & O_CREAT) && d_is_dir(nd->path.dentry))
			return -EISDIR;
		if ((nd->flags & LOOKUP_DIRECTORY) && !d_can_lookup(nd->path.dentry))
			return -ENOTDIR;
	} else {
		open_flag &= ~O_TRUNC;
		acc_mode = 0;
	}
	if ((open_flag & O_TRUNC) && S_ISREG(nd->inode->i_mode))
		do_trunc = true;
	error = may_open(&nd->path, acc_mode, open_flag);
	if (!error)
		error = vfs_open(&nd->path, file);
	if (!error && do_trunc)
		error = handle_truncate(file);
	return error;
}

static noinline struct file *path_openat(struct nameidata *nd, const struct open_flags *op,
				unsigned flags)
{
	struct file *file;
	const char *s;
	int error;

	file = alloc_empty_file(op->open_flag, NULL);
	if (IS_ERR(file))
		return file;
	s = path_init(nd, flags);
	while (!(error = link_path_walk(s, nd)) &&
	       (s = open_last_lookups(nd, file, op)) != NULL)
		;
	if (!error)
		error = do_open(nd, file, op);
	terminate_walk(nd);
	if (likely(!error))
		return file;
	fput(file);
	return ERR_PTR(error);
}

struct file *do_filp_open(int dfd, struct filename *pathname, const struct open_flags *op)
{
	struct nameidata nd;

	set_nameidata(&nd, dfd, pathname);
	return path_openat(&nd, op, op->lookup_flags);
}

/* ---- directory operations ----------------------------------------------------------- */

/* Returns a negative dentry for a new name with the parent's inode lock held, or an
 * error (-EEXIST for an existing name, "." or ".."). */
struct dentry *filename_create(int dfd, struct filename *name, struct path *path,
			       unsigned int lookup_flags)
{
	bool want_dir = lookup_flags & LOOKUP_DIRECTORY;
	struct dentry *dentry;
	struct qstr last;
	int type, error;

	error = filename_parentat(dfd, name, 0, path, &last, &type);
	if (error)
		return ERR_PTR(error);
	if (unlikely(type != LAST_NORM)) {
		path_put(path);
		return ERR_PTR(-EEXIST);
	}
	inode_lock(path->dentry->d_inode);
	dentry = lookup_one_qstr_excl(&last, path->dentry, LOOKUP_CREATE | LOOKUP_EXCL);
	if (IS_ERR(dentry))
		goto unlock;
	error = -EEXIST;
	if (dentry->d_inode)
		goto fail;
	/* "foo/" names a directory: only mkdir may create it. */
	error = -ENOENT;
	if (unlikely(last.name[last.len] && !want_dir))
		goto fail;
	return dentry;
fail:
	dput(dentry);
	dentry = ERR_PTR(error);
unlock:
	inode_unlock(path->dentry->d_inode);
	path_put(path);
	return dentry;
}

void done_path_create(struct path *path, struct dentry *dentry)
{
	dput(dentry);
	inode_unlock(path->dentry->d_inode);
	path_put(path);
}

static int may_create(struct inode *dir, struct dentry *child)
{
	if (child->d_inode)
		return -EEXIST;
	if (!dir->i_nlink)
		return -ENOENT;
	return 0;
}

int vfs_mkdir(struct user_namespace *mnt_userns, struct inode *dir, struct dentry *dentry,
	      umode_t mode)
{
	int error = may_create(dir, dentry);

	if (error)
		return error;
	if (!dir->i_op->mkdir)
		return -EPERM;
	mode &= 01777;
	return dir->i_op->mkdir(dir, dentry, mode);
}

int do_mkdirat(int dfd, struct filename *name, umode_t mode)
{
	struct dentry *dentry;
	struct path path;
	int error;

	dentry = filename_create(dfd, name, &path, LOOKUP_DIRECTORY);
	error = PTR_ERR(dentry);
	if (!IS_ERR(dentry)) {
		error = vfs_mkdir(&init_user_ns, path.dentry->d_inode, dentry, mode);
		done_path_create(&path, dentry);
	}
	putname(name);
	return error;
}

SYSCALL_DECL(mkdirat)
{
	return do_mkdirat((int)regs->di, getname((const char __user *)regs->si),
			  (umode_t)regs->dx);
}

SYSCALL_DECL(mkdir)
{
	return do_mkdirat(AT_FDCWD, getname((const char __user *)regs->di), (umode_t)regs->si);
}

noinline int vfs_symlink(struct user_namespace *mnt_userns, struct inode *dir, struct dentry *dentry,
		const char *oldname)
{
	int error = may_create(dir, dentry);

	if (error)
		return error;
	if (!dir->i_op->symlink)
		return -EPERM;
	return dir->i_op->symlink(dir, dentry, oldname);
}

int do_symlinkat(struct filename *from, int newdfd, struct filename *to)
{
	struct dentry *dentry;
	struct path path;
	int error;

	if (IS_ERR(from)) {
		error = PTR_ERR(from);
		goto out_putnames;
	}
	dentry = filename_create(newdfd, to, &path, 0);
	error = PTR_ERR(dentry);
	if (IS_ERR(dentry))
		goto out_putnames;
	error = vfs_symlink(&init_user_ns, path.dentry->d_inode, dentry, from->name);
	done_path_create(&path, dentry);
out_putnames:
	putname(to);
	putname(from);
	return error;
}

SYSCALL_DECL(symlinkat)
{
	return do_symlinkat(getname((const char __user *)regs->di), (int)regs->si,
			    getname((const char __user *)regs->dx));
}

SYSCALL_DECL(symlink)
{
	return do_symlinkat(getname((const char __user *)regs->di), AT_FDCWD,
			    getname((const char __user *)regs->si));
}

static inline bool is_local_mountpoint(const struct dentry *dentry)
{
	return READ_ONCE(dentry->d_mounted) != NULL;
}

/* Checks shared by unlink and rmdir; isdir says which one is asking. */
static int may_delete(struct inode *dir, struct dentry *victim, bool isdir)
{
	if (d_is_negative(victim))
		return -ENOENT;
	if (victim->d_parent->d_inode != dir)
		return -ENOENT;
	if (isdir) {
		if (!d_is_dir(victim))
			return -ENOTDIR;
		if (IS_ROOT(victim))
			return -EBUSY;
	} else if (d_is_dir(victim)) {
		return -EISDIR;
	}
	if (victim->d_flags & DCACHE_DEAD)
		return -ENOENT;
	return 0;
}

int vfs_rmdir(struct user_namespace *mnt_userns, struct inode *dir, struct dentry *dentry)
{
	int error = may_delete(dir, dentry, true);

	if (error)
		return error;
	if (!dir->i_op->rmdir)
		return -EPERM;
	if (is_local_mountpoint(dentry))
		return -EBUSY;
	error = dir->i_op->rmdir(dir, dentry);
	if (!error)
		d_delete(dentry);
	return error;
}

int do_rmdir(int dfd, struct filename *name)
{
	struct dentry *dentry;
	struct path path;
	struct qstr last;
	int type, error;

	error = filename_parentat(dfd, name, 0, &path, &last, &type);
	if (error)
		goto exit1;
	switch (type) {
	case LAST_DOTDOT:
		error = -ENOTEMPTY;
		goto exit2;
	case LAST_DOT:
		error = -EINVAL;
		goto exit2;
	case LAST_ROOT:
		error = -EBUSY;
		goto exit2;
	}
	inode_lock(path.dentry->d_inode);
	dentry = lookup_one_qstr_excl(&last, path.dentry, 0);
	error = PTR_ERR(dentry);
	if (IS_ERR(dentry))
		goto exit3;
	error = vfs_rmdir(&init_user_ns, path.dentry->d_inode, dentry);
	dput(dentry);
exit3:
	inode_unlock(path.dentry->d_inode);
exit2:
	path_put(&path);
exit1:
	putname(name);
	return error;
}

SYSCALL_DECL(rmdir)
{
	return do_rmdir(AT_FDCWD, getname((const char __user *)regs->di));
}

int vfs_unlink(struct user_namespace *mnt_userns, struct inode *dir, struct dentry *dentry,
	       struct inode **delegated_inode)
{
	int error = may_delete(dir, dentry, false);

	if (error)
		return error;
	if (!dir->i_op->unlink)
		return -EPERM;
	if (is_local_mountpoint(dentry))
		return -EBUSY;
	error = dir->i_op->unlink(dir, dentry);
	if (!error)
		d_delete(dentry);
	return error;
}

int do_unlinkat(int dfd, struct filename *name)
{
	struct inode *inode = NULL;
	struct dentry *dentry;
	struct path path;
	struct qstr last;
	int type, error;

	error = filename_parentat(dfd, name, 0, &path, &last, &type);
	if (error)
		goto exit1;
	error = -EISDIR;
	if (type != LAST_NORM)
		goto exit2;
	inode_lock(path.dentry->d_inode);
	dentry = lookup_one_qstr_excl(&last, path.dentry, 0);
	error = PTR_ERR(dentry);
	if (!IS_ERR(dentry)) {
		if (last.name[last.len]) {
			/* "name/": only a directory may be named so */
			error = d_is_negative(dentry) ? -ENOENT :
				d_is_dir(dentry) ? -EISDIR : -ENOTDIR;
		} else {
			inode = dentry->d_inode;
			if (inode)
				ihold(inode);
			error = vfs_unlink(&init_user_ns, path.dentry->d_inode, dentry, NULL);
		}
		dput(dentry);
	}
	inode_unlock(path.dentry->d_inode);
	iput(inode);	/* the inode may die here, outside the lock */
exit2:
	path_put(&path);
exit1:
	putname(name);
	return error;
}

SYSCALL_DECL(unlinkat)
{
	int dfd = (int)regs->di;
	int flag = (int)regs->dx;
	struct filename *name = getname((const char __user *)regs->si);

	if ((flag & ~AT_REMOVEDIR) != 0) {
		putname(name);
		return -EINVAL;
	}
	if (flag & AT_REMOVEDIR)
		return do_rmdir(dfd, name);
	return do_unlinkat(dfd, name);
}

SYSCALL_DECL(unlink)
{
	return do_unlinkat(AT_FDCWD, getname((const char __user *)regs->di));
}

/* ---- readlink ----------------------------------------------------------------------- */

int vfs_readlink(struct dentry *dentry, char __user *buffer, int buflen)
{
	struct inode *inode = dentry->d_inode;
	const char *link;
	int len;

	if (!inode || !S_ISLNK(inode->i_mode))
		return -EINVAL;
	link = inode->i_op && inode->i_op->get_link ? inode->i_op->get_link(dentry, inode)
						     : inode->i_link;
	if (IS_ERR_OR_NULL(link))
		return link ? PTR_ERR(link) : -EINVAL;
	len = strlen(link);
	if (len > buflen)
		len = buflen;
	if (copy_to_user(buffer, link, len))
		return -EFAULT;
	return len;
}

static int do_readlinkat(int dfd, const char __user *pathname, char __user *buf, int bufsiz)
{
	struct path path;
	int error, empty = 0;

	if (bufsiz <= 0)
		return -EINVAL;
	error = user_path_at_empty(dfd, pathname, LOOKUP_EMPTY, &path, &empty);
	if (error)
		return error;
	error = vfs_readlink(path.dentry, buf, bufsiz);
	if (error == -EINVAL && empty)
		error = -ENOENT;
	path_put(&path);
	return error;
}

SYSCALL_DECL(readlinkat)
{
	return do_readlinkat((int)regs->di, (const char __user *)regs->si,
			     (char __user *)regs->dx, (int)regs->r10);
}

SYSCALL_DECL(readlink)
{
	return do_readlinkat(AT_FDCWD, (const char __user *)regs->di, (char __user *)regs->si,
			     (int)regs->dx);
}

/* ---- rename ---------------------------------------------------------------------------- */

/* Whether dentry is ancestor or one of its descendants (the rename trap). */
static bool is_subdir(struct dentry *dentry, struct dentry *ancestor)
{
	for (;;) {
		if (dentry == ancestor)
			return true;
		if (IS_ROOT(dentry))
			return false;
		dentry = dentry->d_parent;
	}
}

int vfs_rename(struct inode *old_dir, struct dentry *old_dentry, struct inode *new_dir,
	       struct dentry *new_dentry, unsigned int flags)
{
	struct inode *source = old_dentry->d_inode;
	struct inode *target = new_dentry->d_inode;
	bool is_dir = d_is_dir(old_dentry);
	int error;

	if (source == target)
		return 0;
	error = may_delete(old_dir, old_dentry, is_dir);
	if (error)
		return error;
	if (!target)
		error = may_create(new_dir, new_dentry);
	else
		error = may_delete(new_dir, new_dentry, is_dir);
	if (error)
		return error;
	if (!old_dir->i_op->rename)
		return -EPERM;
	if (is_local_mountpoint(old_dentry) || is_local_mountpoint(new_dentry))
		return -EBUSY;
	error = old_dir->i_op->rename(old_dir, old_dentry, new_dir, new_dentry, flags);
	if (error)
		return error;
	if (target)
		d_delete(new_dentry);
	d_move(old_dentry, new_dentry);
	return 0;
}

int do_renameat2(int olddfd, struct filename *from, int newdfd, struct filename *to,
		 unsigned int flags)
{
	struct dentry *old_dentry, *new_dentry, *trap;
	struct path old_path, new_path;
	struct qstr old_last, new_last;
	int old_type, new_type;
	int error;

	error = -EINVAL;
	if (flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE | RENAME_WHITEOUT))
		goto put_names;
	if ((flags & RENAME_NOREPLACE) && (flags & RENAME_EXCHANGE))
		goto put_names;
	/* exchange and whiteouts: no filesystem here has them (ramfs in 6.1 has exchange) */
	if (flags & (RENAME_EXCHANGE | RENAME_WHITEOUT))
		goto put_names;
	error = filename_parentat(olddfd, from, 0, &old_path, &old_last, &old_type);
	if (error)
		goto put_names;
	error = filename_parentat(newdfd, to, 0, &new_path, &new_last, &new_type);
	if (error)
		goto exit1;
	error = -EXDEV;
	if (old_path.dentry->d_sb != new_path.dentry->d_sb)
		goto exit2;
	error = -EBUSY;
	if (old_type != LAST_NORM)
		goto exit2;
	if (flags & RENAME_NOREPLACE)
		error = -EEXIST;
	if (new_type != LAST_NORM)
		goto exit2;
	trap = old_path.dentry;
	lock_two_inodes(old_path.dentry->d_inode, new_path.dentry->d_inode);
	old_dentry = lookup_one_qstr_excl(&old_last, old_path.dentry, 0);
	error = PTR_ERR(old_dentry);
	if (IS_ERR(old_dentry))
		goto exit3;
	error = -ENOENT;
	if (d_is_negative(old_dentry))
		goto exit4;
	new_dentry = lookup_one_qstr_excl(&new_last, new_path.dentry, 0);
	error = PTR_ERR(new_dentry);
	if (IS_ERR(new_dentry))
		goto exit4;
	error = -EEXIST;
	if ((flags & RENAME_NOREPLACE) && !d_is_negative(new_dentry))
		goto exit5;
	if (!d_is_dir(old_dentry)) {
		error = -ENOTDIR;
		if (old_last.name[old_last.len] || new_last.name[new_last.len])
			goto exit5;
	}
	/* source should not be an ancestor of the target, nor the target of the source */
	error = -EINVAL;
	if (new_path.dentry != trap && is_subdir(new_path.dentry, old_dentry))
		goto exit5;
	error = -ENOTEMPTY;
	if (old_path.dentry != new_path.dentry && is_subdir(old_path.dentry, new_dentry))
		goto exit5;
	error = vfs_rename(old_path.dentry->d_inode, old_dentry, new_path.dentry->d_inode,
			   new_dentry, flags);
exit5:
	dput(new_dentry);
exit4:
	dput(old_dentry);
exit3:
	unlock_two_inodes(old_path.dentry->d_inode, new_path.dentry->d_inode);
exit2:
	path_put(&new_path);
exit1:
	path_put(&old_path);
put_names:
	putname(from);
	putname(to);
	return error;
}

SYSCALL_DECL(renameat2)
{
	return do_renameat2((int)regs->di, getname((const char __user *)regs->si),
			    (int)regs->dx, getname((const char __user *)regs->r10),
			    (unsigned int)regs->r8);
}

SYSCALL_DECL(renameat)
{
	return do_renameat2((int)regs->di, getname((const char __user *)regs->si),
			    (int)regs->dx, getname((const char __user *)regs->r10), 0);
}

SYSCALL_DECL(rename)
{
	return do_renameat2(AT_FDCWD, getname((const char __user *)regs->di),
			    AT_FDCWD, getname((const char __user *)regs->si), 0);
}
