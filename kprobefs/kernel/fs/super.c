/* Filesystem types and superblocks. */
#include "fs.h"

static struct file_system_type *file_systems;
static DEFINE_SPINLOCK(file_systems_lock);
static unsigned long next_anon_dev;

static struct file_system_type **find_filesystem(const char *name, unsigned len)
{
	struct file_system_type **p;

	for (p = &file_systems; *p; p = &(*p)->next)
		if (strlen((*p)->name) == len && strncmp((*p)->name, name, len) == 0)
			break;
	return p;
}

int register_filesystem(struct file_system_type *fs)
{
	struct file_system_type **p;
	int res = 0;

	if (fs->next)
		return -EBUSY;
	spin_lock(&file_systems_lock);
	p = find_filesystem(fs->name, strlen(fs->name));
	if (*p)
		res = -EBUSY;
	else
		*p = fs;
	spin_unlock(&file_systems_lock);
	return res;
}

struct file_system_type *get_fs_type(const char *name)
{
	struct file_system_type *fs;

	spin_lock(&file_systems_lock);
	fs = *find_filesystem(name, strlen(name));
	spin_unlock(&file_systems_lock);
	return fs;
}

/* Visits every registered type (for /sys/fs); stops early when fn returns non-zero. */
int iterate_filesystems(int (*fn)(struct file_system_type *, void *), void *arg)
{
	struct file_system_type *p;
	int ret = 0;

	for (p = READ_ONCE(file_systems); p && !ret; p = p->next)
		ret = fn(p, arg);
	return ret;
}

/* A new superblock of type; every mount here gets its own (no sharing by key). */
struct super_block *sget_fc(struct file_system_type *type, unsigned long magic)
{
	struct super_block *s = kzalloc(sizeof(*s), GFP_KERNEL);

	if (!s)
		return ERR_PTR(-ENOMEM);
	s->s_type = type;
	s->s_magic = magic;
	spin_lock(&file_systems_lock);
	s->s_dev = MKDEV(0, ++next_anon_dev);
	spin_unlock(&file_systems_lock);
	return s;
}

struct dentry *vfs_kern_mount(struct file_system_type *type, int flags, const char *name,
			      void *data)
{
	struct dentry *root;

	if (!type)
		return ERR_PTR(-ENODEV);
	root = type->mount(type, flags, name, data);
	if (IS_ERR_OR_NULL(root))
		return root ? root : ERR_PTR(-ENOMEM);
	return root;
}
