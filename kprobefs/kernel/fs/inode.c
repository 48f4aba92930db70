/* Inodes: allocation, reference counting, link counts and the inode lock. */
#include "fs.h"

struct user_namespace init_user_ns = { .level = 0 };
unsigned long nr_inodes;

/* Directory operations serialise on the directory's inode lock.  Struct inode has no
 * room for one, so locks are hashed by address; only rename holds two at once, and
 * takes them with lock_two_inodes (one lock when they hash alike, else in address
 * order), so a collision can only make a CPU wait, never deadlock. */
#define INODE_LOCK_BITS 6
static spinlock_t inode_locks[1 << INODE_LOCK_BITS];

static inline spinlock_t *inode_lock_ptr(const struct inode *inode)
{
	unsigned long h = (unsigned long)inode >> 6;

	return &inode_locks[(h ^ (h >> INODE_LOCK_BITS)) & ((1 << INODE_LOCK_BITS) - 1)];
}

void inode_lock(struct inode *inode)
{
	spin_lock(inode_lock_ptr(inode));
}

void inode_unlock(struct inode *inode)
{
	spin_unlock(inode_lock_ptr(inode));
}

/* rename's two directories (lock_rename). */
void lock_two_inodes(struct inode *a, struct inode *b)
{
	spinlock_t *la = inode_lock_ptr(a), *lb = inode_lock_ptr(b);

	if (la == lb) {
		spin_lock(la);
		return;
	}
	spin_lock(la < lb ? la : lb);
	spin_lock(la < lb ? lb : la);
}

void unlock_two_inodes(struct inode *a, struct inode *b)
{
	spinlock_t *la = inode_lock_ptr(a), *lb = inode_lock_ptr(b);

	spin_unlock(la);
	if (lb != la)
		spin_unlock(lb);
}

static DEFINE_SPINLOCK(inode_sb_list_lock);

static unsigned long get_next_ino(struct super_block *sb)
{
	unsigned long ino;

	spin_lock(&inode_sb_list_lock);
	ino = ++sb->s_next_ino;
	spin_unlock(&inode_sb_list_lock);
	return ino;
}

static struct inode *alloc_inode(struct super_block *sb)
{
	const struct super_operations *ops = sb->s_op;
	struct inode *inode;

	if (ops && ops->alloc_inode)
		inode = ops->alloc_inode(sb);
	else
		inode = kzalloc(sizeof(*inode), GFP_KERNEL);
	if (!inode)
		return NULL;
	inode->i_sb = sb;
	inode->i_nlink = 1;
	atomic_set(&inode->i_count, 1);
	__atomic_add_fetch(&nr_inodes, 1, __ATOMIC_RELAXED);
	return inode;
}

/* A fresh inode of sb with one reference and the next inode number. */
struct inode *new_inode(struct super_block *sb)
{
	struct inode *inode = alloc_inode(sb);

	if (inode) {
		inode->i_ino = get_next_ino(sb);
		inode->i_mtime = ktime_get_ns();
	}
	return inode;
}

static void evict(struct inode *inode)
{
	const struct super_operations *ops = inode->i_sb->s_op;

	__atomic_sub_fetch(&nr_inodes, 1, __ATOMIC_RELAXED);
	if (ops && ops->destroy_inode) {
		ops->destroy_inode(inode);
		return;
	}
	kfree(inode->i_link);
	kfree(inode);
}

/* Nothing caches unused inodes: the last reference frees the inode and its data. */
void iput(struct inode *inode)
{
	if (!inode)
		return;
	if (atomic_dec_and_test(&inode->i_count))
		evict(inode);
}

void inc_nlink(struct inode *inode)
{
	__atomic_add_fetch(&inode->i_nlink, 1, __ATOMIC_SEQ_CST);
}

void drop_nlink(struct inode *inode)
{
	WARN_ON(inode->i_nlink == 0);
	__atomic_sub_fetch(&inode->i_nlink, 1, __ATOMIC_SEQ_CST);
}

void clear_nlink(struct inode *inode)
{
	WRITE_ONCE(inode->i_nlink, 0);
}

void i_size_write(struct inode *inode, loff_t size)
{
	WRITE_ONCE(inode->i_size, size);
}

/* The d_type getdents64 reports for a file mode. */
unsigned char fs_umode_to_dtype(umode_t mode)
{
	switch (mode & S_IFMT) {
	case S_IFREG:
		return DT_REG;
	case S_IFDIR:
		return DT_DIR;
	case S_IFLNK:
		return DT_LNK;
	case S_IFCHR:
		return DT_CHR;
	case S_IFSOCK:
		return DT_SOCK;
	case 0060000:
		return DT_BLK;
	case 0010000:
		return DT_FIFO;
	default:
		return DT_UNKNOWN;
	}
}
