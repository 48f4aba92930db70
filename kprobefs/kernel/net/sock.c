/* Generic socket state: allocation, freeing and the default callbacks. */
#include "net.h"

struct net init_net = { .count = { 1 } };
unsigned long nr_socks;

/* Wakes whoever sleeps on the socket: accept() on a listener, read() on a connection. */
void sock_def_readable(struct sock *sk)
{
	if (!list_empty(&sk->sk_wq.head))
		__wake_up(&sk->sk_wq);
}

static void sock_def_wakeup(struct sock *sk)
{
	__wake_up(&sk->sk_wq);
}

struct sock *sk_alloc(struct net *net, int family, gfp_t priority, struct proto *prot,
		      int kern)
{
	struct sock *sk = kzalloc(prot->obj_size, priority);

	if (!sk)
		return NULL;
	sk->sk_family = family;
	sk->sk_prot = prot;
	atomic_set(&sk->sk_refcnt, 1);
	INIT_LIST_HEAD(&sk->sk_node);
	INIT_LIST_HEAD(&sk->sk_bind_node);
	atomic_inc(&prot->inuse);
	__atomic_add_fetch(&nr_socks, 1, __ATOMIC_RELAXED);
	return sk;
}

void sk_free(struct sock *sk)
{
	WARN_ON(!list_empty(&sk->sk_node));
	skb_queue_purge(&sk->sk_receive_queue);
	__atomic_sub_fetch(&sk->sk_prot->inuse.counter, 1, __ATOMIC_SEQ_CST);
	__atomic_sub_fetch(&nr_socks, 1, __ATOMIC_RELAXED);
	kfree(sk);
}

void sock_init_data(struct socket *sock, struct sock *sk)
{
	skb_queue_head_init(&sk->sk_receive_queue);
	init_waitqueue_head(&sk->sk_wq);
	sk->sk_state = TCP_CLOSE;
	sk->sk_rcvbuf = 128 * 1024;
	sk->sk_rcvtimeo = MAX_SCHEDULE_TIMEOUT;
	sk->sk_state_change = sock_def_wakeup;
	sk->sk_data_ready = sock_def_readable;
	if (sock) {
		sk->sk_type = sock->type;
		sk->sk_socket = sock;
		sock->sk = sk;
	}
}
