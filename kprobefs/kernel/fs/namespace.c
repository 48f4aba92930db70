/* Mounts.  A mount joins the root dentry of a filesystem to the dentry it covers:
 * path walks go down through mountpoint->d_mounted, and ".." and d_path() come back up
 * through the mount table, which maps each mounted root to its mountpoint. */
#include "fs.h"

struct mount {
	struct dentry *mnt_root;
	struct dentry *mnt_mountpoint;	/* NULL for the root of the tree */
	const char *mnt_devname;
	int mnt_id;
	struct list_head mnt_list;
};

static LIST_HEAD(mount_list);
static DEFINE_SPINLOCK(mount_lock);
static int mnt_id_next;
extern struct files_struct init_files;
extern struct fs_struct init_fs;

static struct mount *alloc_vfsmnt(const char *name)
{
	struct mount *mnt = kzalloc(sizeof(*mnt), GFP_KERNEL);

	if (!mnt)
		return NULL;
	mnt->mnt_devname = kstrdup(name ? name : "none", GFP_KERNEL);
	INIT_LIST_HEAD(&mnt->mnt_list);
	spin_lock(&mount_lock);
	mnt->mnt_id = ++mnt_id_next;
	spin_unlock(&mount_lock);
	return mnt;
}

/* Puts root on mountpoint; the mountpoint is pinned for as long as the mount lives. */
int do_add_mount(struct dentry *root, struct dentry *mountpoint, const char *devname)
{
	struct mount *mnt;

	if (!d_is_dir(mountpoint))
		return -ENOTDIR;
	if (d_unhashed(mountpoint) && !IS_ROOT(mountpoint))
		return -ENOENT;
	mnt = alloc_vfsmnt(devname);
	if (!mnt)
		return -ENOMEM;
	mnt->mnt_root = root;
	mnt->mnt_mountpoint = dget(mountpoint);
	spin_lock(&mount_lock);
	if (mountpoint->d_mounted) {
		spin_unlock(&mount_lock);
		dput(mountpoint);
		kfree(mnt->mnt_devname);
		kfree(mnt);
		return -EBUSY;
	}
	list_add_tail(&mnt->mnt_list, &mount_list);
	spin_lock(&dcache_lock);
	mountpoint->d_flags |= DCACHE_MOUNTPOINT;
	WRITE_ONCE(mountpoint->d_mounted, root);
	spin_unlock(&dcache_lock);
	spin_unlock(&mount_lock);
	return 0;
}

/* The dentry a filesystem root is mounted on, or NULL for the tree's root and for
 * filesystems mounted nowhere (sockets).  The result borrows the mount's reference. */
struct dentry *lookup_mountpoint(const struct dentry *root)
{
	struct mount *mnt;
	struct dentry *mp = NULL;

	spin_lock(&mount_lock);
	list_for_each_entry(mnt, &mount_list, mnt_list) {
		if (mnt->mnt_root == root) {
			mp = mnt->mnt_mountpoint;
			break;
		}
	}
	spin_unlock(&mount_lock);
	return mp;
}

int init_mount(const char *dev_name, const char *dir_name, const char *type_page,
	       unsigned long flags, void *data_page)
{
	struct file_system_type *type = get_fs_type(type_page);
	struct dentry *root;
	struct path path;
	int ret;

	if (!type)
		return -ENODEV;
	ret = kern_path(dir_name, LOOKUP_FOLLOW | LOOKUP_DIRECTORY, &path);
	if (ret)
		return ret;
	root = vfs_kern_mount(type, (int)flags, dev_name, data_page);
	if (IS_ERR(root)) {
		path_put(&path);
		return PTR_ERR(root);
	}
	ret = do_add_mount(root, path.dentry, dev_name);
	if (ret)
		dput(root);
	path_put(&path);
	return ret;
}

/* The root filesystem (ramfs) becomes init_task's root and cwd; every task inherits. */
static void init_mount_tree(void)
{
	struct mount *mnt;
	struct dentry *root;
	struct path path;

	root = vfs_kern_mount(&ramfs_fs_type, 0, "rootfs", NULL);
	if (IS_ERR(root))
		panic("Can't create rootfs");
	mnt = alloc_vfsmnt("rootfs");
	if (!mnt)
		panic("Can't allocate the root mount");
	mnt->mnt_root = root;
	spin_lock(&mount_lock);
	list_add(&mnt->mnt_list, &mount_list);
	spin_unlock(&mount_lock);

	path.dentry = root;
	set_fs_pwd(&init_fs, &path);
	set_fs_root(&init_fs, &path);
	init_task.fs = &init_fs;
	init_task.files = &init_files;
}

void mnt_init(void)
{
	register_filesystem(&ramfs_fs_type);
	register_filesystem(&hostfs_fs_type);
	register_filesystem(&debug_fs_type);
	register_filesystem(&trace_fs_type);
	register_filesystem(&proc_fs_type);
	init_mount_tree();
}
