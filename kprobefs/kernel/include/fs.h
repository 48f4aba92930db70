/* The VFS: dentries, inodes, files, the per-task fd table, and filesystem types. */
#ifndef _KPF_FS_H
#define _KPF_FS_H
#include "sched.h"

#define O_ACCMODE 00000003
#define O_RDONLY 00000000
#define O_WRONLY 00000001
#define O_RDWR 00000002
#define O_CREAT 00000100
#define O_EXCL 00000200
#define O_TRUNC 00001000
#define O_APPEND 00002000
#define O_NONBLOCK 00004000
#define O_DIRECTORY 00200000
#define O_NOFOLLOW 00400000
#define AT_FDCWD -100
#define AT_REMOVEDIR 0x200

#define S_IFMT 00170000
#define S_IFSOCK 0140000
#define S_IFLNK 0120000
#define S_IFREG 0100000
#define S_IFDIR 0040000
#define S_IFCHR 0020000
#define S_ISDIR(m) (((m) & S_IFMT) == S_IFDIR)
#define S_ISREG(m) (((m) & S_IFMT) == S_IFREG)
#define S_ISLNK(m) (((m) & S_IFMT) == S_IFLNK)
#define S_ISSOCK(m) (((m) & S_IFMT) == S_IFSOCK)
#define S_ISCHR(m) (((m) & S_IFMT) == S_IFCHR)

#define NAME_MAX 255
#define PATH_MAX 4096
#define NR_OPEN_DEFAULT 64
#define MAX_NESTED_LINKS 8

struct inode;
struct dentry;
struct file;
struct super_block;
struct kstat;

typedef long off_t;

#ifndef ENODEV
#define ENODEV 19
#endif
#ifndef EFBIG
#define EFBIG 27
#endif
#ifndef EOVERFLOW
#define EOVERFLOW 75
#endif
struct user_namespace;
struct iattr;
struct dentry_operations;

struct qstr {
	u32 hash;
	u32 len;
	const char *name;
};

struct file_operations {
	loff_t (*llseek)(struct file *, loff_t, int);
	ssize_t (*read)(struct file *, char __user *, size_t, loff_t *);
	ssize_t (*write)(struct file *, const char __user *, size_t, loff_t *);
	int (*iterate)(struct file *, void *ctx);
	int (*open)(struct inode *, struct file *);
	int (*release)(struct inode *, struct file *);
	long (*unlocked_ioctl)(struct file *, unsigned int, unsigned long);
};

struct inode_operations {
	struct dentry *(*lookup)(struct inode *, struct dentry *, unsigned int);
	int (*create)(struct inode *, struct dentry *, umode_t, bool);
	int (*mkdir)(struct inode *, struct dentry *, umode_t);
	int (*rmdir)(struct inode *, struct dentry *);
	int (*unlink)(struct inode *, struct dentry *);
	int (*symlink)(struct inode *, struct dentry *, const char *);
	const char *(*get_link)(struct dentry *, struct inode *);
	int (*setattr)(struct user_namespace *, struct dentry *, struct iattr *);
	int (*mknod)(struct inode *, struct dentry *, umode_t, unsigned int);
	int (*rename)(struct inode *, struct dentry *, struct inode *, struct dentry *,
		      unsigned int);
};

#define RENAME_NOREPLACE	(1 << 0)	/* don't overwrite the target */
#define RENAME_EXCHANGE		(1 << 1)	/* exchange source and destination */
#define RENAME_WHITEOUT		(1 << 2)	/* whiteout the source */

struct super_operations {
	struct inode *(*alloc_inode)(struct super_block *sb);
	void (*destroy_inode)(struct inode *);
};

struct file_system_type {
	const char *name;
	struct dentry *(*mount)(struct file_system_type *, int, const char *, void *);
	struct file_system_type *next;
};

struct super_block {
	const struct super_operations *s_op;
	struct file_system_type *s_type;
	struct dentry *s_root;
	unsigned long s_magic;
	void *s_fs_info;
	unsigned long s_next_ino;
	const struct dentry_operations *s_d_op;	/* given to every dentry of this sb */
	unsigned long s_dev;
};

struct inode {
	umode_t i_mode;
	unsigned int i_nlink;
	unsigned long i_ino;
	loff_t i_size;
	struct super_block *i_sb;
	const struct inode_operations *i_op;
	const struct file_operations *i_fop;
	void *i_private;		/* ramfs: data pages; hostfs: host node id */
	u32 i_mutexes;			/* hostfs: the mutexes the host's operations hold */
	size_t i_capacity;
	char *i_link;
	atomic_t i_count;
	u64 i_mtime;
};

struct dentry {
	struct qstr d_name;
	char d_iname[40];
	struct dentry *d_parent;
	struct inode *d_inode;
	struct dentry *d_hash_next;	/* the next in its dentry_hashtable bucket */
	struct list_head d_child;
	struct list_head d_subdirs;
	struct super_block *d_sb;
	struct dentry *d_mounted;	/* root of a filesystem mounted here, if any */
	atomic_t d_count;
	unsigned int d_flags;
};

struct path {
	struct dentry *dentry;
};

struct file {
	struct path f_path;
	struct inode *f_inode;
	const struct file_operations *f_op;
	unsigned int f_flags;
	unsigned int f_mode;
	loff_t f_pos;
	atomic_t f_count;
	void *private_data;
};

struct files_struct {
	atomic_t count;
	spinlock_t file_lock;
	struct file *fd_array[NR_OPEN_DEFAULT];
};

struct fs_struct {
	atomic_t users;
	struct path root;
	struct path pwd;
};

struct filename {
	const char *name;
	const char __user *uptr;
	int refcnt;
	char iname[];
};

struct kstat {
	unsigned long ino;
	umode_t mode;
	unsigned int nlink;
	loff_t size;
	unsigned long dev;
	u64 mtime;
	unsigned int blksize;
	u64 blocks;
};

struct user_namespace {
	int level;
};
extern struct user_namespace init_user_ns;

/* ia_valid bits */
#define ATTR_MODE (1 << 0)
#define ATTR_SIZE (1 << 3)
struct iattr {
	unsigned int ia_valid;
	umode_t ia_mode;
	loff_t ia_size;
};

struct dentry_operations {
	/* 1: still valid, 0: drop it and look the name up again, <0: error */
	int (*d_revalidate)(struct dentry *, unsigned int);
};

/* d_flags */
#define DCACHE_HASHED 0x0001		/* findable by d_lookup() */
#define DCACHE_PINNED 0x0002		/* the filesystem holds a reference (ramfs, tracefs) */
#define DCACHE_MOUNTPOINT 0x0004	/* a filesystem is mounted here: never revalidated */
#define DCACHE_TRACEFS 0x0008		/* made by tracefs_create_dir()/tracefs_create_file() */
#define DCACHE_DEAD 0x0010		/* unlinked / removed directory */
#define DCACHE_HOST_KEPT 0x0020	/* a hostfs name the host keeps: one reference holds it */

#define FMODE_READ 0x1
#define FMODE_WRITE 0x2
#define FMODE_LSEEK 0x4
#define FMODE_PREAD 0x8
#define FMODE_PWRITE 0x10
#define FMODE_ATOMIC_POS 0x8000
#define FMODE_CAN_READ 0x20000
#define FMODE_CAN_WRITE 0x40000
#define FMODE_OPENED 0x80000
#define FMODE_CREATED 0x100000

#define SEEK_SET 0
#define SEEK_CUR 1
#define SEEK_END 2
#define SEEK_DATA 3
#define SEEK_HOLE 4
#define MAX_LFS_FILESIZE 0x7fffffffffffffffL

#define AT_SYMLINK_NOFOLLOW 0x100
#define AT_EMPTY_PATH 0x1000
#define O_CLOEXEC 02000000
#define O_NOCTTY 00000400
#define O_LARGEFILE 00100000
#define O_PATH 010000000
#define __O_TMPFILE 020000000

/* lookup flags */
#define LOOKUP_FOLLOW 0x0001
#define LOOKUP_DIRECTORY 0x0002
#define LOOKUP_PARENT 0x0010
#define LOOKUP_CREATE 0x0200
#define LOOKUP_EXCL 0x0400
#define LOOKUP_OPEN 0x0100
#define LOOKUP_EMPTY 0x4000
#define MAXSYMLINKS 40

/* d_type values getdents64 reports */
#define DT_UNKNOWN 0
#define DT_FIFO 1
#define DT_CHR 2
#define DT_DIR 4
#define DT_BLK 6
#define DT_REG 8
#define DT_LNK 10
#define DT_SOCK 12

#define RAMFS_MAGIC 0x858458f6
#define TRACEFS_MAGIC 0x74726163
#define DEBUGFS_MAGIC 0x64626720
#define PROC_SUPER_MAGIC 0x9fa0
#define SOCKFS_MAGIC 0x534F434B
#define SYSFS_MAGIC 0x62656572
#define HOSTFS_MAGIC 0x00c0ffee

struct dir_context;
typedef bool (*filldir_t)(struct dir_context *, const char *, int, loff_t, u64, unsigned);
struct dir_context {
	filldir_t actor;
	loff_t pos;
};
static inline bool dir_emit(struct dir_context *ctx, const char *name, int namelen,
			    u64 ino, unsigned type)
{
	return ctx->actor(ctx, name, namelen, ctx->pos, ino, type);
}

struct open_how {
	u64 flags;
	u64 mode;
	u64 resolve;
};
#define OPEN_HOW_SIZE_VER0 24
#define RESOLVE_NO_XDEV 0x01
#define RESOLVE_NO_MAGICLINKS 0x02
#define RESOLVE_NO_SYMLINKS 0x04
#define RESOLVE_BENEATH 0x08
#define RESOLVE_IN_ROOT 0x10
#define RESOLVE_CACHED 0x20
#define VALID_RESOLVE_FLAGS (RESOLVE_NO_XDEV | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_SYMLINKS | \
			     RESOLVE_BENEATH | RESOLVE_IN_ROOT | RESOLVE_CACHED)

struct cred;
typedef struct files_struct *fl_owner_t;

static inline void *ERR_CAST(const void *ptr) { return (void *)ptr; }

/* ---- dcache / inodes (fs/dcache.c, fs/inode.c) ---- */
extern spinlock_t dcache_lock;
static inline struct dentry *dget(struct dentry *d)
{
	if (d)
		atomic_inc(&d->d_count);
	return d;
}
static inline bool d_unhashed(const struct dentry *d) { return !(d->d_flags & DCACHE_HASHED); }
static inline bool IS_ROOT(const struct dentry *d) { return d == d->d_parent; }
static inline bool d_is_negative(const struct dentry *d) { return !d->d_inode; }
static inline bool d_is_dir(const struct dentry *d)
{
	return d->d_inode && S_ISDIR(d->d_inode->i_mode);
}
static inline bool d_is_symlink(const struct dentry *d)
{
	return d->d_inode && S_ISLNK(d->d_inode->i_mode);
}
static inline struct inode *d_inode(const struct dentry *d) { return d->d_inode; }
static inline struct inode *file_inode(const struct file *f) { return f->f_inode; }
u32 full_name_hash(const void *salt, const char *name, unsigned int len);
void dput(struct dentry *dentry);
struct dentry *d_alloc(struct dentry *parent, const struct qstr *name);
struct dentry *d_alloc_name(struct dentry *parent, const char *name);
struct dentry *d_alloc_pseudo(struct super_block *sb, const struct qstr *name);
struct dentry *d_make_root(struct inode *root_inode);
void d_instantiate(struct dentry *dentry, struct inode *inode);
void d_add(struct dentry *dentry, struct inode *inode);
void d_drop(struct dentry *dentry);
void d_delete(struct dentry *dentry);
struct dentry *d_lookup(const struct dentry *parent, const struct qstr *name);
char *d_path(const struct path *path, char *buf, int buflen);
bool simple_empty(struct dentry *dentry);
struct inode *new_inode(struct super_block *sb);
void iput(struct inode *inode);
static inline struct inode *ihold(struct inode *inode)
{
	atomic_inc(&inode->i_count);
	return inode;
}
void inode_lock(struct inode *inode);
void inode_unlock(struct inode *inode);
void lock_two_inodes(struct inode *a, struct inode *b);
void unlock_two_inodes(struct inode *a, struct inode *b);
void inc_nlink(struct inode *inode);
void drop_nlink(struct inode *inode);
void clear_nlink(struct inode *inode);
void i_size_write(struct inode *inode, loff_t size);
unsigned char fs_umode_to_dtype(umode_t mode);

#define MINORBITS 20
#define MKDEV(ma, mi) (((ma) << MINORBITS) | (mi))
#define MAJOR(dev) ((unsigned int)(dev) >> MINORBITS)
#define MINOR(dev) ((unsigned int)(dev) & ((1U << MINORBITS) - 1))
void init_special_inode(struct inode *inode, umode_t mode, unsigned int rdev);
int vfs_mknod(struct user_namespace *mnt_userns, struct inode *dir, struct dentry *dentry,
	      umode_t mode, unsigned int dev);

/* ---- mounts (fs/namespace.c, fs/super.c, fs/init.c) ---- */
int init_mkdir(const char *pathname, umode_t mode);
int init_mknod(const char *filename, umode_t mode, unsigned int dev);
int init_symlink(const char *oldname, const char *newname);
void mnt_init(void);
int register_filesystem(struct file_system_type *fs);
struct file_system_type *get_fs_type(const char *name);
struct super_block *sget_fc(struct file_system_type *type, unsigned long magic);
struct dentry *vfs_kern_mount(struct file_system_type *type, int flags, const char *name,
			      void *data);
int do_add_mount(struct dentry *root, struct dentry *mountpoint, const char *devname);
struct dentry *lookup_mountpoint(const struct dentry *root);
int init_mount(const char *dev_name, const char *dir_name, const char *type_page,
	       unsigned long flags, void *data_page);

/* ---- names and path walks (fs/namei.c) ---- */
struct filename *getname(const char __user *filename);
struct filename *getname_flags(const char __user *filename, int flags, int *empty);
struct filename *getname_kernel(const char *filename);
void putname(struct filename *name);
int kern_path(const char *name, unsigned int flags, struct path *path);
int filename_lookup(int dfd, struct filename *name, unsigned flags, struct path *path);
int user_path_at_empty(int dfd, const char __user *name, unsigned flags, struct path *path,
		       int *empty);
static inline void path_get(const struct path *p) { dget(p->dentry); }
static inline void path_put(const struct path *p) { dput(p->dentry); }
struct open_flags {
	int open_flag;
	umode_t mode;
	int acc_mode;
	int intent;
	int lookup_flags;
};
struct file *do_filp_open(int dfd, struct filename *pathname, const struct open_flags *op);
struct file *filp_open(const char *filename, int flags, umode_t mode);
struct dentry *lookup_one_qstr_excl(const struct qstr *name, struct dentry *base,
				    unsigned int flags);
struct dentry *filename_create(int dfd, struct filename *name, struct path *path,
			       unsigned int lookup_flags);
void done_path_create(struct path *path, struct dentry *dentry);
int vfs_create(struct user_namespace *mnt_userns, struct inode *dir, struct dentry *dentry,
	       umode_t mode, bool want_excl);
int vfs_mkdir(struct user_namespace *mnt_userns, struct inode *dir, struct dentry *dentry,
	      umode_t mode);
int vfs_rmdir(struct user_namespace *mnt_userns, struct inode *dir, struct dentry *dentry);
int vfs_unlink(struct user_namespace *mnt_userns, struct inode *dir, struct dentry *dentry,
	       struct inode **delegated_inode);
int vfs_symlink(struct user_namespace *mnt_userns, struct inode *dir, struct dentry *dentry,
		const char *oldname);
int do_mkdirat(int dfd, struct filename *name, umode_t mode);
int do_symlinkat(struct filename *from, int newdfd, struct filename *to);
int do_unlinkat(int dfd, struct filename *name);
int do_renameat2(int olddfd, struct filename *from, int newdfd, struct filename *to,
		 unsigned int flags);
void d_move(struct dentry *dentry, struct dentry *target);
int do_rmdir(int dfd, struct filename *name);
int vfs_readlink(struct dentry *dentry, char __user *buffer, int buflen);

/* ---- open files (fs/open.c, fs/file_table.c, fs/file.c) ---- */
long do_sys_open(int dfd, const char __user *filename, int flags, umode_t mode);
long do_sys_openat2(int dfd, const char __user *filename, struct open_how *how);
int vfs_open(const struct path *path, struct file *file);
int do_truncate(struct user_namespace *mnt_userns, struct dentry *dentry, loff_t length,
		unsigned int time_attrs, struct file *filp);
struct file *alloc_empty_file(int flags, const struct cred *cred);
struct file *alloc_file_pseudo(struct inode *inode, const char *name, int flags,
			       const struct file_operations *fops);
void fput(struct file *file);
static inline struct file *get_file(struct file *f)
{
	atomic_inc(&f->f_count);
	return f;
}
int filp_close(struct file *filp, fl_owner_t id);
int get_unused_fd_flags(unsigned flags);
void put_unused_fd(unsigned int fd);
void fd_install(unsigned int fd, struct file *file);
int close_fd(unsigned int fd);
struct file *fget(unsigned int fd);
void set_fs_pwd(struct fs_struct *fs, const struct path *path);
void set_fs_root(struct fs_struct *fs, const struct path *path);
void get_fs_root(struct fs_struct *fs, struct path *root);
void get_fs_pwd(struct fs_struct *fs, struct path *pwd);

/* ---- reading and writing (fs/read_write.c, fs/readdir.c, fs/stat.c) ---- */
ssize_t vfs_read(struct file *file, char __user *buf, size_t count, loff_t *pos);
ssize_t vfs_write(struct file *file, const char __user *buf, size_t count, loff_t *pos);
ssize_t ksys_read(unsigned int fd, char __user *buf, size_t count);
ssize_t ksys_write(unsigned int fd, const char __user *buf, size_t count);
int rw_verify_area(int read_write, struct file *file, const loff_t *ppos, size_t count);
loff_t vfs_llseek(struct file *file, loff_t offset, int whence);
off_t ksys_lseek(unsigned int fd, off_t offset, unsigned int whence);
ssize_t ksys_pread64(unsigned int fd, char __user *buf, size_t count, loff_t pos);
ssize_t ksys_pwrite64(unsigned int fd, const char __user *buf, size_t count, loff_t pos);
loff_t generic_file_llseek(struct file *file, loff_t offset, int whence);
loff_t no_llseek(struct file *file, loff_t offset, int whence);
ssize_t generic_read_dir(struct file *filp, char __user *buf, size_t siz, loff_t *ppos);
int iterate_dir(struct file *file, struct dir_context *ctx);
int dcache_readdir(struct file *file, void *ctx);
int vfs_getattr(const struct path *path, struct kstat *stat, u32 request_mask,
		unsigned int query_flags);
int vfs_fstatat(int dfd, const char __user *filename, struct kstat *stat, int flags);
#define READ 0
#define WRITE 1
#define MAX_RW_COUNT (0x7ffff000L)

/* ---- filesystems ---- */
extern struct file_system_type ramfs_fs_type, hostfs_fs_type, debug_fs_type, trace_fs_type,
	proc_fs_type;
struct dentry *hostfs_mount_id(struct file_system_type *fs_type, long root_id,
			       unsigned long magic);
void hostfs_set_kprobe_mutex(struct mutex *lock);
struct dentry *hostfs_create_dentry(struct dentry *parent, const char *name, umode_t mode,
				    unsigned int dflags, const struct file_operations *fops,
				    void *data);
struct dentry *debugfs_create_automount(const char *name, struct dentry *parent);
extern const struct file_operations ramfs_file_operations, simple_dir_operations;
struct inode *ramfs_get_inode(struct super_block *sb, const struct inode *dir, umode_t mode);
int ramfs_fill_super(struct super_block *sb);
struct dentry *tracefs_create_dir(const char *name, struct dentry *parent);
extern const struct file_operations devkmsg_fops;
struct dentry *tracefs_create_file(const char *name, umode_t mode, struct dentry *parent,
				   void *data, const struct file_operations *fops);
void tracefs_remove(struct dentry *dentry);
void tracefs_init(struct dentry *root);

/* ---- sysfs (fs/sysfs.c): attribute files whose reads call a show() method ---- */
struct kobject;
struct attribute {
	const char *name;
	umode_t mode;
};
struct sysfs_ops {
	ssize_t (*show)(struct kobject *, struct attribute *, char *);
	ssize_t (*store)(struct kobject *, struct attribute *, const char *, size_t);
};
struct kobj_type {
	const struct sysfs_ops *sysfs_ops;
	const struct attribute *const *default_attrs;
};
struct kobject {
	const char *name;
	struct kobject *parent;
	const struct kobj_type *ktype;
	struct dentry *sd;		/* the directory in /sys */
};
struct kobj_attribute {
	struct attribute attr;
	ssize_t (*show)(struct kobject *kobj, struct kobj_attribute *attr, char *buf);
	ssize_t (*store)(struct kobject *kobj, struct kobj_attribute *attr, const char *buf,
			 size_t count);
};
extern const struct sysfs_ops kobj_sysfs_ops;
extern struct kobject *fs_kobj, *class_kobj;
int kobject_add(struct kobject *kobj, struct kobject *parent, const char *name);
int sysfs_create_file(struct kobject *kobj, const struct attribute *attr);
int sysfs_create_files(struct kobject *kobj, const struct attribute *const *attrs);
void sysfs_init(struct dentry *sys_root);
int sysfs_emit(char *buf, const char *fmt, ...);

/* fork/exit hooks */
struct files_struct *dup_fd(struct files_struct *oldf, int *errorp);
void exit_files(struct task_struct *tsk);
struct fs_struct *copy_fs_struct(struct fs_struct *old);
extern struct fs_struct init_fs;
void exit_fs(struct task_struct *tsk);
void vfs_caches_init(void);

#endif
