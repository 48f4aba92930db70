/* PF_INET: socket creation and the stream socket operations (bind, listen, accept). */
#include "net.h"

extern struct net_protocol tcp_protocol;
extern struct packet_type ip_packet_type;

struct inet_protosw {
	unsigned short type;
	unsigned short protocol;
	struct proto *prot;
	const struct proto_ops *ops;
};

static const struct proto_ops inet_stream_ops;

static const struct inet_protosw inetsw_array[] = {
	{
		.type = SOCK_STREAM,
		.protocol = IPPROTO_TCP,
		.prot = &tcp_prot,
		.ops = &inet_stream_ops,
	},
};

static int inet_create(struct net *net, struct socket *sock, int protocol, int kern)
{
	const struct inet_protosw *answer = NULL;
	struct inet_sock *inet;
	struct sock *sk;
	unsigned int i;
	int err;

	if (protocol < 0 || protocol >= 256)
		return -EINVAL;
	sock->state = SS_UNCONNECTED;
	err = -ESOCKTNOSUPPORT;
	for (i = 0; i < ARRAY_SIZE(inetsw_array); i++) {
		if (inetsw_array[i].type != sock->type)
			continue;
		err = -EPROTONOSUPPORT;
		if (protocol == inetsw_array[i].protocol || protocol == IPPROTO_IP) {
			answer = &inetsw_array[i];
			protocol = answer->protocol;
			break;
		}
	}
	if (!answer)
		return err;
	sock->ops = answer->ops;
	sk = sk_alloc(net, PF_INET, GFP_KERNEL, answer->prot, kern);
	if (!sk)
		return -ENOMEM;
	inet = inet_sk(sk);
	sock_init_data(sock, sk);
	sk->sk_protocol = protocol;
	inet->ttl = 64;
	inet->inet_id = 0;
	if (sk->sk_prot->init) {
		err = sk->sk_prot->init(sk);
		if (err) {
			sock->sk = NULL;
			sock_put(sk);
			return err;
		}
	}
	return 0;
}

int inet_release(struct socket *sock)
{
	struct sock *sk = sock->sk;

	if (sk) {
		sock->sk = NULL;
		sk->sk_prot->close(sk, 0);
	}
	return 0;
}

static inline bool ipv4_is_multicast(u32 addr)
{
	return (addr & htonl(0xf0000000)) == htonl(0xe0000000);
}

static int __inet_bind(struct sock *sk, struct sockaddr *uaddr, int addr_len)
{
	struct sockaddr_in *addr = (struct sockaddr_in *)uaddr;
	struct inet_sock *inet = inet_sk(sk);
	unsigned short snum = ntohs(addr->sin_port);
	int err;

	if (ipv4_is_multicast(addr->sin_addr.s_addr))
		return -EADDRNOTAVAIL;
	lock_sock(sk);
	err = -EINVAL;
	if (sk->sk_state != TCP_CLOSE || inet->inet_num)
		goto out_release_sock;
	inet->inet_rcv_saddr = inet->inet_saddr = addr->sin_addr.s_addr;
	err = -EADDRINUSE;
	if (sk->sk_prot->get_port(sk, snum)) {
		inet->inet_saddr = inet->inet_rcv_saddr = 0;
		goto out_release_sock;
	}
	inet->inet_sport = htons(inet->inet_num);
	inet->inet_daddr = 0;
	inet->inet_dport = 0;
	err = 0;
out_release_sock:
	release_sock(sk);
	return err;
}

int inet_bind(struct socket *sock, struct sockaddr *uaddr, int addr_len)
{
	struct sockaddr_in *addr = (struct sockaddr_in *)uaddr;

	if (addr_len < (int)sizeof(struct sockaddr_in))
		return -EINVAL;
	if (addr->sin_family != AF_INET) {
		/* AF_UNSPEC with INADDR_ANY is accepted, as Linux does for old programs */
		if (addr->sin_family != AF_UNSPEC || addr->sin_addr.s_addr != htonl(INADDR_ANY))
			return -EAFNOSUPPORT;
	}
	return __inet_bind(sock->sk, uaddr, addr_len);
}

int inet_listen(struct socket *sock, int backlog)
{
	struct sock *sk = sock->sk;
	unsigned char old_state;
	int err;

	lock_sock(sk);
	err = -EINVAL;
	if (sock->state != SS_UNCONNECTED || sock->type != SOCK_STREAM)
		goto out;
	old_state = sk->sk_state;
	if (!((1 << old_state) & (TCPF_CLOSE | TCPF_LISTEN)))
		goto out;
	WRITE_ONCE(sk->sk_max_ack_backlog, backlog);
	if (old_state != TCP_LISTEN) {
		err = inet_csk_listen_start(sk);
		if (err)
			goto out;
	}
	err = 0;
out:
	release_sock(sk);
	return err;
}

int inet_accept(struct socket *sock, struct socket *newsock, int flags, bool kern)
{
	struct sock *sk1 = sock->sk;
	int err = -EINVAL;
	struct sock *sk2 = sk1->sk_prot->accept(sk1, flags, &err, kern);

	if (!sk2)
		return err;
	lock_sock(sk2);
	WARN_ON(!((1 << sk2->sk_state) & (TCPF_ESTABLISHED | TCPF_SYN_RECV | TCPF_CLOSE_WAIT |
					  TCPF_CLOSE)));
	/* sock_graft: the new socket owns the child from now on */
	sk2->sk_socket = newsock;
	newsock->sk = sk2;
	newsock->state = SS_CONNECTED;
	release_sock(sk2);
	return 0;
}

int inet_getname(struct socket *sock, struct sockaddr *uaddr, int peer)
{
	struct sock *sk = sock->sk;
	struct inet_sock *inet = inet_sk(sk);
	struct sockaddr_in *sin = (struct sockaddr_in *)uaddr;

	sin->sin_family = AF_INET;
	lock_sock(sk);
	if (peer) {
		if (!inet->inet_dport ||
		    (((1 << sk->sk_state) & (TCPF_CLOSE | TCPF_SYN_SENT)) && peer == 1)) {
			release_sock(sk);
			return -ENOTCONN;
		}
		sin->sin_port = inet->inet_dport;
		sin->sin_addr.s_addr = inet->inet_daddr;
	} else {
		sin->sin_port = inet->inet_sport;
		sin->sin_addr.s_addr = inet->inet_rcv_saddr;
	}
	release_sock(sk);
	memset(sin->__pad, 0, sizeof(sin->__pad));
	return sizeof(*sin);
}

static int inet_shutdown(struct socket *sock, int how)
{
	struct sock *sk = sock->sk;

	how++;	/* SHUT_RD/WR/RDWR (0, 1, 2) to RCV_SHUTDOWN/SEND_SHUTDOWN/both */
	if ((how & ~SHUTDOWN_MASK) || !how)
		return -EINVAL;
	lock_sock(sk);
	sk->sk_shutdown |= how;
	if (sk->sk_state == TCP_LISTEN && (how & RCV_SHUTDOWN))
		tcp_set_state(sk, TCP_CLOSE);
	release_sock(sk);
	sk->sk_state_change(sk);
	return 0;
}

static int inet_ioctl(struct socket *sock, unsigned int cmd, unsigned long arg)
{
	struct sock *sk = sock->sk;

	if (sk->sk_prot->ioctl)
		return sk->sk_prot->ioctl(sk, cmd, arg);
	return -ENOIOCTLCMD;
}

static int inet_sendmsg(struct socket *sock, const char __user *buf, size_t size, int flags)
{
	struct sock *sk = sock->sk;

	return sk->sk_prot->sendmsg(sk, buf, size, flags);
}

static int inet_recvmsg(struct socket *sock, char __user *buf, size_t size, int flags)
{
	struct sock *sk = sock->sk;
	int addr_len = 0;

	return sk->sk_prot->recvmsg(sk, buf, size, flags, &addr_len);
}

static const struct proto_ops inet_stream_ops = {
	.family = PF_INET,
	.release = inet_release,
	.bind = inet_bind,
	.accept = inet_accept,
	.getname = inet_getname,
	.ioctl = inet_ioctl,
	.listen = inet_listen,
	.shutdown = inet_shutdown,
	.sendmsg = inet_sendmsg,
	.recvmsg = inet_recvmsg,
};

static const struct net_proto_family inet_family_ops = {
	.family = PF_INET,
	.create = inet_create,
};

static const struct net_protocol *inet_protos[256];
static DEFINE_SPINLOCK(inet_proto_lock);

int inet_add_protocol(const struct net_protocol *prot, unsigned char protocol)
{
	int ret = -1;

	spin_lock(&inet_proto_lock);
	if (!inet_protos[protocol]) {
		WRITE_ONCE(inet_protos[protocol], prot);
		ret = 0;
	}
	spin_unlock(&inet_proto_lock);
	return ret;
}

/* ip_local_deliver_finish() looks the transport handler up here. */
const struct net_protocol *inet_protocol_lookup(unsigned char protocol)
{
	return READ_ONCE(inet_protos[protocol]);
}

void inet_init(void)
{
	inet_hashinfo_init();
	if (sock_register(&inet_family_ops))
		pr_err("inet_init: cannot register PF_INET\n");
	if (inet_add_protocol(&tcp_protocol, IPPROTO_TCP) < 0)
		pr_err("inet_init: Cannot add TCP protocol\n");
	dev_add_pack(&ip_packet_type);
}
