/* sysfs: kobjects are directories under /sys (plain ramfs directories), attributes are
 * files whose read calls the kobject type's show() method, which for a kobj_attribute
 * calls the attribute's own show().  /sys/fs/<type>/ describes each filesystem type. */
#include "fs.h"
#include "uaccess.h"

struct kernfs_node {
	struct kobject *kobj;
	const struct attribute *attr;
};

static struct dentry *sysfs_root;
static struct kobject fs_kobject = { .name = "fs" };
static struct kobject class_kobject = { .name = "class" };
struct kobject *fs_kobj = &fs_kobject, *class_kobj = &class_kobject;

static inline struct kernfs_node *kernfs_of(struct file *file)
{
	return file_inode(file)->i_private;
}

static ssize_t sysfs_kf_seq_show(struct kernfs_node *kn, char *buf)
{
	const struct sysfs_ops *ops = kn->kobj->ktype ? kn->kobj->ktype->sysfs_ops : NULL;
	ssize_t count;

	if (!ops || !ops->show)
		return -EIO;
	count = ops->show(kn->kobj, (struct attribute *)kn->attr, buf);
	if (count < 0)
		return count;
	if (count >= (ssize_t)PAGE_SIZE) {
		printk(KERN_WARNING "fill_read_buffer: show %p returned bad count\n", ops->show);
		count = PAGE_SIZE - 1;
	}
	return count;
}

/* Every read renders the attribute afresh and returns the part from *ppos on. */
static ssize_t sysfs_kf_read(struct file *file, char __user *ubuf, size_t count,
			     loff_t *ppos)
{
	struct kernfs_node *kn = kernfs_of(file);
	ssize_t len;
	char *buf;

	buf = kzalloc(PAGE_SIZE, GFP_KERNEL);
	if (!buf)
		return -ENOMEM;
	len = sysfs_kf_seq_show(kn, buf);
	if (len >= 0) {
		if (*ppos >= len) {
			len = 0;
		} else {
			len = min((size_t)(len - *ppos), count);
			if (copy_to_user(ubuf, buf + *ppos, len))
				len = -EFAULT;
			else
				*ppos += len;
		}
	}
	kfree(buf);
	return len;
}

static ssize_t sysfs_kf_write(struct file *file, const char __user *ubuf, size_t count,
			      loff_t *ppos)
{
	struct kernfs_node *kn = kernfs_of(file);
	const struct sysfs_ops *ops = kn->kobj->ktype ? kn->kobj->ktype->sysfs_ops : NULL;
	ssize_t len;
	char *buf;

	if (!ops || !ops->store)
		return -EIO;
	if (count >= PAGE_SIZE)
		count = PAGE_SIZE - 1;
	buf = kmalloc(count + 1, GFP_KERNEL);
	if (!buf)
		return -ENOMEM;
	if (copy_from_user(buf, ubuf, count)) {
		kfree(buf);
		return -EFAULT;
	}
	buf[count] = 0;
	len = ops->store(kn->kobj, (struct attribute *)kn->attr, buf, count);
	kfree(buf);
	if (len > 0)
		*ppos += len;
	return len;
}

static const struct file_operations sysfs_file_operations = {
	.llseek = generic_file_llseek,
	.read = sysfs_kf_read,
	.write = sysfs_kf_write,
};

/* Creates (or finds) name under parent: a directory, or a file for an attribute. */
static struct dentry *sysfs_add_entry(struct dentry *parent, const char *name, umode_t mode)
{
	struct qstr q = { .name = name, .len = strlen(name) };
	struct inode *dir = parent->d_inode;
	struct dentry *dentry;
	int err;

	inode_lock(dir);
	dentry = lookup_one_qstr_excl(&q, parent, LOOKUP_CREATE);
	if (IS_ERR(dentry))
		goto out;
	if (dentry->d_inode) {
		dput(dentry);
		dentry = ERR_PTR(-EEXIST);
		goto out;
	}
	if (S_ISDIR(mode))
		err = vfs_mkdir(&init_user_ns, dir, dentry, mode & 07777);
	else
		err = vfs_create(&init_user_ns, dir, dentry, mode & 07777, true);
	if (err) {
		dput(dentry);
		dentry = ERR_PTR(err);
	}
out:
	inode_unlock(dir);
	return dentry;
}

int sysfs_create_file(struct kobject *kobj, const struct attribute *attr)
{
	struct kernfs_node *kn;
	struct dentry *dentry;
	struct inode *inode;

	if (!kobj->sd)
		return -ENOENT;
	kn = kmalloc(sizeof(*kn), GFP_KERNEL);
	if (!kn)
		return -ENOMEM;
	kn->kobj = kobj;
	kn->attr = attr;
	dentry = sysfs_add_entry(kobj->sd, attr->name, S_IFREG | (attr->mode & 0777));
	if (IS_ERR(dentry)) {
		kfree(kn);
		return PTR_ERR(dentry);
	}
	inode = dentry->d_inode;
	inode->i_fop = &sysfs_file_operations;
	inode->i_private = kn;	/* ramfs frees it with the inode */
	inode->i_size = PAGE_SIZE;
	dput(dentry);
	return 0;
}

int sysfs_create_files(struct kobject *kobj, const struct attribute *const *attrs)
{
	int err = 0;

	for (; attrs && *attrs && !err; attrs++)
		err = sysfs_create_file(kobj, *attrs);
	return err;
}

int kobject_add(struct kobject *kobj, struct kobject *parent, const char *name)
{
	struct dentry *pdir = parent ? parent->sd : sysfs_root;
	struct dentry *dentry;

	if (!pdir)
		return -ENOENT;
	if (name)
		kobj->name = name;
	kobj->parent = parent;
	dentry = sysfs_add_entry(pdir, kobj->name, S_IFDIR | 0755);
	if (IS_ERR(dentry))
		return PTR_ERR(dentry);
	kobj->sd = dentry;	/* pinned by ramfs; this reference keeps it for us too */
	if (kobj->ktype && kobj->ktype->default_attrs)
		return sysfs_create_files(kobj, kobj->ktype->default_attrs);
	return 0;
}

/* ---- kobj_attribute dispatch ---------------------------------------------------- */

static ssize_t kobj_attr_show(struct kobject *kobj, struct attribute *attr, char *buf)
{
	struct kobj_attribute *kattr = container_of(attr, struct kobj_attribute, attr);

	if (kattr->show)
		return kattr->show(kobj, kattr, buf);
	return -EIO;
}

static ssize_t kobj_attr_store(struct kobject *kobj, struct attribute *attr, const char *buf,
			       size_t count)
{
	struct kobj_attribute *kattr = container_of(attr, struct kobj_attribute, attr);

	if (kattr->store)
		return kattr->store(kobj, kattr, buf, count);
	return -EIO;
}

const struct sysfs_ops kobj_sysfs_ops = {
	.show = kobj_attr_show,
	.store = kobj_attr_store,
};

static const struct kobj_type dir_ktype = {
	.sysfs_ops = &kobj_sysfs_ops,
};

/* ---- /sys/fs/<type>/ ------------------------------------------------------------ */

struct fs_kobject {
	struct kobject kobj;
	struct file_system_type *type;
};

static inline struct fs_kobject *to_fs_kobject(struct kobject *kobj)
{
	return container_of(kobj, struct fs_kobject, kobj);
}

/* /sys/fs/<type>/name: the filesystem type's name. */
static ssize_t name_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%s\n", to_fs_kobject(kobj)->type->name);
}

static ssize_t mountable_show(struct kobject *kobj, struct kobj_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%d\n", to_fs_kobject(kobj)->type->mount != NULL);
}

static struct kobj_attribute fs_name_attr = { { "name", 0444 }, name_show, NULL };
static struct kobj_attribute fs_mountable_attr = { { "mountable", 0444 }, mountable_show,
						   NULL };
static const struct attribute *const fs_type_attrs[] = {
	&fs_name_attr.attr,
	&fs_mountable_attr.attr,
	NULL,
};

static const struct kobj_type fs_type_ktype = {
	.sysfs_ops = &kobj_sysfs_ops,
	.default_attrs = fs_type_attrs,
};

extern int iterate_filesystems(int (*fn)(struct file_system_type *, void *), void *arg);

static int register_fs_kobject(struct file_system_type *type, void *unused)
{
	struct fs_kobject *fk = kzalloc(sizeof(*fk), GFP_KERNEL);

	if (!fk)
		return -ENOMEM;
	fk->type = type;
	fk->kobj.ktype = &fs_type_ktype;
	if (kobject_add(&fk->kobj, fs_kobj, type->name)) {
		kfree(fk);
		return 0;	/* keep going with the other types */
	}
	return 0;
}

/* Called once /sys exists: the top-level kobjects, then one per filesystem type. */
void sysfs_init(struct dentry *sys_root)
{
	sysfs_root = sys_root;
	fs_kobject.ktype = &dir_ktype;
	class_kobject.ktype = &dir_ktype;
	if (kobject_add(fs_kobj, NULL, NULL) || kobject_add(class_kobj, NULL, NULL)) {
		pr_err("sysfs: could not create /sys/fs and /sys/class\n");
		return;
	}
	iterate_filesystems(register_fs_kobject, NULL);
}
