/* Kernel-internal counterparts of mkdir/mknod/symlink, used while building the tree at
 * boot (Linux's fs/init.c). */
#include "fs.h"

int init_mkdir(const char *pathname, umode_t mode)
{
	return do_mkdirat(AT_FDCWD, getname_kernel(pathname), mode);
}

int init_symlink(const char *oldname, const char *newname)
{
	return do_symlinkat(getname_kernel(oldname), AT_FDCWD, getname_kernel(newname));
}

int vfs_mknod(struct user_namespace *mnt_userns, struct inode *dir, struct dentry *dentry,
	      umode_t mode, unsigned int dev)
{
	if (dentry->d_inode)
		return -EEXIST;
	if (!dir->i_op->mknod)
		return -EPERM;
	return dir->i_op->mknod(dir, dentry, mode, dev);
}

int init_mknod(const char *filename, umode_t mode, unsigned int dev)
{
	struct filename *name = getname_kernel(filename);
	struct dentry *dentry;
	struct path path;
	int error;

	dentry = filename_create(AT_FDCWD, name, &path, 0);
	error = PTR_ERR(dentry);
	if (!IS_ERR(dentry)) {
		error = vfs_mknod(&init_user_ns, path.dentry->d_inode, dentry, mode, dev);
		done_path_create(&path, dentry);
	}
	putname(name);
	return error;
}
