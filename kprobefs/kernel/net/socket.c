/* The BSD socket layer: sockfs inodes, socket files, and the socket system calls. */
#include "net.h"
#include "syscalls.h"
#include "uaccess.h"

static const struct net_proto_family *net_families[NPROTO];
static DEFINE_SPINLOCK(net_family_lock);
static struct super_block *sock_sb;
static const struct file_operations socket_file_ops;

/* ---- sockfs ---------------------------------------------------------------------- */

static struct inode *sock_alloc_inode(struct super_block *sb)
{
	struct socket_alloc *ei = kzalloc(sizeof(*ei), GFP_KERNEL);

	if (!ei)
		return NULL;
	ei->socket.state = SS_UNCONNECTED;
	return &ei->vfs_inode;
}

static void sock_free_inode(struct inode *inode)
{
	kfree(container_of(inode, struct socket_alloc, vfs_inode));
}

static const struct super_operations sockfs_ops = {
	.alloc_inode = sock_alloc_inode,
	.destroy_inode = sock_free_inode,
};

static struct dentry *sockfs_mount(struct file_system_type *fs_type, int flags,
				   const char *dev_name, void *data)
{
	struct super_block *sb = sget_fc(fs_type, SOCKFS_MAGIC);

	if (IS_ERR(sb))
		return ERR_CAST(sb);
	sb->s_op = &sockfs_ops;
	sock_sb = sb;
	sb->s_root = d_make_root(new_inode(sb));
	return sb->s_root ? sb->s_root : ERR_PTR(-ENOMEM);
}

static struct file_system_type sock_fs_type = {
	.name = "sockfs",
	.mount = sockfs_mount,
};

void sock_init(void)
{
	struct dentry *root;

	register_filesystem(&sock_fs_type);
	root = vfs_kern_mount(&sock_fs_type, 0, "sockfs", NULL);
	if (IS_ERR(root))
		panic("Cannot create sockfs: %ld", PTR_ERR(root));
}

struct socket *sock_alloc(void)
{
	struct inode *inode = new_inode(sock_sb);
	struct socket *sock;

	if (!inode)
		return NULL;
	sock = SOCKET_I(inode);
	inode->i_mode = S_IFSOCK | 0777;
	return sock;
}

static void __sock_release(struct socket *sock, struct inode *inode)
{
	if (sock->ops) {
		sock->ops->release(sock);
		sock->sk = NULL;
		sock->ops = NULL;
	}
	if (!sock->file) {
		iput(SOCK_INODE(sock));
		return;
	}
	sock->file = NULL;
}

/* Releases a socket that has no file (the file's last fput does it otherwise). */
void sock_release(struct socket *sock)
{
	__sock_release(sock, NULL);
}

static int sock_close(struct inode *inode, struct file *filp)
{
	__sock_release(SOCKET_I(inode), inode);
	return 0;
}

struct file *sock_alloc_file(struct socket *sock, int flags, const char *dname)
{
	struct file *file;

	if (!dname)
		dname = sock->sk ? sock->sk->sk_prot->name : "";
	file = alloc_file_pseudo(SOCK_INODE(sock), dname, O_RDWR | (flags & O_NONBLOCK),
				 &socket_file_ops);
	if (IS_ERR(file)) {
		sock_release(sock);
		return file;
	}
	sock->file = file;
	file->private_data = sock;
	return file;
}

static struct socket *sock_from_file(struct file *file)
{
	if (file->f_op == &socket_file_ops)
		return file->private_data;
	return NULL;
}

/* The socket behind fd, with a reference on its file (drop it with sockfd_put()). */
struct socket *sockfd_lookup(int fd, int *err)
{
	struct file *file = fget(fd);
	struct socket *sock;

	if (!file) {
		*err = -EBADF;
		return NULL;
	}
	sock = sock_from_file(file);
	if (!sock) {
		*err = -ENOTSOCK;
		fput(file);
	}
	return sock;
}

static inline void sockfd_put(struct socket *sock)
{
	fput(sock->file);
}

static ssize_t sock_read_iter(struct file *file, char __user *buf, size_t len, loff_t *ppos)
{
	struct socket *sock = file->private_data;
	int flags = (file->f_flags & O_NONBLOCK) ? 0x40 /* MSG_DONTWAIT */ : 0;

	if (!len)
		return 0;
	return sock->ops->recvmsg(sock, buf, len, flags);
}

static ssize_t sock_write_iter(struct file *file, const char __user *buf, size_t len,
			       loff_t *ppos)
{
	struct socket *sock = file->private_data;
	int flags = (file->f_flags & O_NONBLOCK) ? 0x40 : 0;

	return sock->ops->sendmsg(sock, buf, len, flags);
}

#define SIOCGIFNAME 0x8910
#define SIOCGIFINDEX 0x8933
#define SIOCGIFMTU 0x8921

static long sock_do_ioctl(struct socket *sock, unsigned int cmd, unsigned long arg)
{
	struct net_device *dev;
	char name[IFNAMSIZ];

	switch (cmd) {
	case SIOCGIFINDEX:
	case SIOCGIFMTU:
		if (strncpy_from_user(name, (const char __user *)arg, IFNAMSIZ) < 0)
			return -EFAULT;
		name[IFNAMSIZ - 1] = 0;
		dev = dev_get_by_name(name);
		if (!dev)
			return -ENODEV;
		return put_user(cmd == SIOCGIFMTU ? dev->mtu : (u32)dev->ifindex,
				(int __user *)(arg + IFNAMSIZ));
	case SIOCGIFNAME:
		return -EOPNOTSUPP;
	default:
		return sock->ops->ioctl(sock, cmd, arg);
	}
}

static long sock_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	return sock_do_ioctl(file->private_data, cmd, arg);
}

static const struct file_operations socket_file_ops = {
	.llseek = no_llseek,
	.read = sock_read_iter,
	.write = sock_write_iter,
	.unlocked_ioctl = sock_ioctl,
	.release = sock_close,
};

int sock_register(const struct net_proto_family *ops)
{
	int err = 0;

	if (ops->family >= NPROTO)
		return -ENOBUFS;
	spin_lock(&net_family_lock);
	if (net_families[ops->family])
		err = -EEXIST;
	else
		net_families[ops->family] = ops;
	spin_unlock(&net_family_lock);
	if (!err)
		pr_info("NET: Registered PF_%s protocol family\n",
			ops->family == PF_INET ? "INET" : "?");
	return err;
}

int __sock_create(struct net *net, int family, int type, int protocol,
		  struct socket **res, int kern)
{
	const struct net_proto_family *pf;
	struct socket *sock;
	int err;

	if (family < 0 || family >= NPROTO)
		return -EAFNOSUPPORT;
	if (type < 0 || type >= SOCK_MAX)
		return -EINVAL;
	sock = sock_alloc();
	if (!sock) {
		pr_warn("socket: no more sockets\n");
		return -ENFILE;
	}
	sock->type = type;
	pf = READ_ONCE(net_families[family]);
	err = -EAFNOSUPPORT;
	if (!pf)
		goto out_release;
	err = pf->create(net, sock, protocol, kern);
	if (err < 0)
		goto out_release;
	*res = sock;
	return 0;
out_release:
	sock->ops = NULL;
	sock_release(sock);
	return err;
}

int sock_create(int family, int type, int protocol, struct socket **res)
{
	return __sock_create(&init_net, family, type, protocol, res, 0);
}

static int sock_map_fd(struct socket *sock, int flags)
{
	struct file *newfile;
	int fd = get_unused_fd_flags(flags);

	if (unlikely(fd < 0)) {
		sock_release(sock);
		return fd;
	}
	newfile = sock_alloc_file(sock, flags, NULL);
	if (!IS_ERR(newfile)) {
		fd_install(fd, newfile);
		return fd;
	}
	put_unused_fd(fd);
	return PTR_ERR(newfile);
}

int __sys_socket(int family, int type, int protocol)
{
	struct socket *sock;
	int retval, flags;

	flags = type & ~SOCK_TYPE_MASK;
	if (flags & ~(SOCK_CLOEXEC | SOCK_NONBLOCK))
		return -EINVAL;
	type &= SOCK_TYPE_MASK;
	retval = sock_create(family, type, protocol, &sock);
	if (retval < 0)
		return retval;
	return sock_map_fd(sock, flags & (O_CLOEXEC | O_NONBLOCK));
}

SYSCALL_DECL(socket)
{
	return __sys_socket((int)regs->di, (int)regs->si, (int)regs->dx);
}

static int move_addr_to_kernel(void __user *uaddr, int ulen, struct sockaddr_storage *kaddr)
{
	if (ulen < 0 || ulen > (int)sizeof(struct sockaddr_storage))
		return -EINVAL;
	if (ulen == 0)
		return 0;
	if (copy_from_user(kaddr, uaddr, ulen))
		return -EFAULT;
	return 0;
}

/* Copies klen bytes of address out, truncated to the user's *ulen, and stores the full
 * length in *ulen. */
static int move_addr_to_user(struct sockaddr_storage *kaddr, int klen, void __user *uaddr,
			     int __user *ulen)
{
	int len;

	if (copy_from_user(&len, ulen, sizeof(len)))
		return -EFAULT;
	if (len > klen)
		len = klen;
	if (len < 0)
		return -EINVAL;
	if (len && copy_to_user(uaddr, kaddr, len))
		return -EFAULT;
	return put_user((u32)klen, ulen);
}

int __sys_bind(int fd, struct sockaddr __user *umyaddr, int addrlen)
{
	struct sockaddr_storage address;
	struct socket *sock;
	int err;

	sock = sockfd_lookup(fd, &err);
	if (!sock)
		return err;
	memset(&address, 0, sizeof(address));
	err = move_addr_to_kernel(umyaddr, addrlen, &address);
	if (!err)
		err = sock->ops->bind(sock, (struct sockaddr *)&address, addrlen);
	sockfd_put(sock);
	return err;
}

SYSCALL_DECL(bind)
{
	return __sys_bind((int)regs->di, (struct sockaddr __user *)regs->si, (int)regs->dx);
}

int __sys_listen(int fd, int backlog)
{
	struct socket *sock;
	int err;

	sock = sockfd_lookup(fd, &err);
	if (!sock)
		return err;
	if ((unsigned int)backlog > SOMAXCONN)
		backlog = SOMAXCONN;
	err = sock->ops->listen(sock, backlog);
	sockfd_put(sock);
	return err;
}

SYSCALL_DECL(listen)
{
	return __sys_listen((int)regs->di, (int)regs->si);
}

static int do_accept(struct file *file, unsigned file_flags, struct sockaddr __user *upeer,
		     int __user *upeer_addrlen, int flags, struct file **newfilep)
{
	struct sockaddr_storage address;
	struct socket *sock, *newsock;
	struct file *newfile;
	int err, len;

	sock = sock_from_file(file);
	if (!sock)
		return -ENOTSOCK;
	newsock = sock_alloc();
	if (!newsock)
		return -ENFILE;
	newsock->type = sock->type;
	newsock->ops = sock->ops;
	newfile = sock_alloc_file(newsock, flags, sock->sk->sk_prot->name);
	if (IS_ERR(newfile))
		return PTR_ERR(newfile);
	/* The listener's file says whether to wait; flags only concern the new file. */
	err = sock->ops->accept(sock, newsock, sock->file->f_flags | file_flags, false);
	if (err < 0)
		goto out_fd;
	if (upeer) {
		memset(&address, 0, sizeof(address));
		len = newsock->ops->getname(newsock, (struct sockaddr *)&address, 2);
		if (len < 0) {
			err = -ECONNABORTED;
			goto out_fd;
		}
		err = move_addr_to_user(&address, len, upeer, upeer_addrlen);
		if (err < 0)
			goto out_fd;
	}
	*newfilep = newfile;
	return 0;
out_fd:
	fput(newfile);
	return err;
}

int __sys_accept4(int fd, struct sockaddr __user *upeer_sockaddr,
		  int __user *upeer_addrlen, int flags)
{
	struct file *f, *newfile = NULL;
	int newfd, err;

	if (flags & ~(SOCK_CLOEXEC | SOCK_NONBLOCK))
		return -EINVAL;
	f = fget(fd);
	if (!f)
		return -EBADF;
	newfd = get_unused_fd_flags(flags);
	if (newfd < 0) {
		fput(f);
		return newfd;
	}
	err = do_accept(f, 0, upeer_sockaddr, upeer_addrlen, flags, &newfile);
	fput(f);
	if (err) {
		put_unused_fd(newfd);
		return err;
	}
	fd_install(newfd, newfile);
	return newfd;
}

SYSCALL_DECL(accept4)
{
	return __sys_accept4((int)regs->di, (struct sockaddr __user *)regs->si,
			     (int __user *)regs->dx, (int)regs->r10);
}

SYSCALL_DECL(accept)
{
	return __sys_accept4((int)regs->di, (struct sockaddr __user *)regs->si,
			     (int __user *)regs->dx, 0);
}
