/* Per-task root and working directory. */
#include "fs.h"

struct fs_struct init_fs = {
	.users = { 1 },
};
static DEFINE_SPINLOCK(fs_lock);

void set_fs_root(struct fs_struct *fs, const struct path *path)
{
	struct path old;

	path_get(path);
	spin_lock(&fs_lock);
	old = fs->root;
	fs->root = *path;
	spin_unlock(&fs_lock);
	if (old.dentry)
		path_put(&old);
}

void set_fs_pwd(struct fs_struct *fs, const struct path *path)
{
	struct path old;

	path_get(path);
	spin_lock(&fs_lock);
	old = fs->pwd;
	fs->pwd = *path;
	spin_unlock(&fs_lock);
	if (old.dentry)
		path_put(&old);
}

void get_fs_root(struct fs_struct *fs, struct path *root)
{
	spin_lock(&fs_lock);
	*root = fs->root;
	path_get(root);
	spin_unlock(&fs_lock);
}

void get_fs_pwd(struct fs_struct *fs, struct path *pwd)
{
	spin_lock(&fs_lock);
	*pwd = fs->pwd;
	path_get(pwd);
	spin_unlock(&fs_lock);
}

struct fs_struct *copy_fs_struct(struct fs_struct *old)
{
	struct fs_struct *fs = kzalloc(sizeof(*fs), GFP_KERNEL);

	if (fs) {
		atomic_set(&fs->users, 1);
		spin_lock(&fs_lock);
		fs->root = old->root;
		path_get(&fs->root);
		fs->pwd = old->pwd;
		path_get(&fs->pwd);
		spin_unlock(&fs_lock);
	}
	return fs;
}

static void free_fs_struct(struct fs_struct *fs)
{
	path_put(&fs->root);
	path_put(&fs->pwd);
	if (fs != &init_fs)
		kfree(fs);
}

void exit_fs(struct task_struct *tsk)
{
	struct fs_struct *fs = tsk->fs;

	if (fs) {
		tsk->fs = NULL;
		if (atomic_dec_and_test(&fs->users))
			free_fs_struct(fs);
	}
}
