/* Connection-oriented sockets: listening, the accept queue, and accept() itself. */
#include "net.h"

extern void inet_put_port(struct sock *sk);

static inline bool reqsk_queue_empty(const struct request_sock_queue *queue)
{
	return list_empty(&queue->head);
}

static struct request_sock *reqsk_queue_remove(struct request_sock_queue *queue,
					       struct sock *parent)
{
	struct request_sock *req = NULL;

	spin_lock(&queue->rskq_lock);
	if (!list_empty(&queue->head)) {
		req = list_first_entry(&queue->head, struct request_sock, dl_next);
		list_del_init(&req->dl_next);
		queue->qlen--;
		WRITE_ONCE(parent->sk_ack_backlog, parent->sk_ack_backlog - 1);
	}
	spin_unlock(&queue->rskq_lock);
	return req;
}

static inline void reqsk_free(struct request_sock *req)
{
	kfree(req);
}

/* Queues an established child for accept(); NULL (child not taken) if the listener
 * has stopped listening meanwhile. */
struct sock *inet_csk_reqsk_queue_add(struct sock *sk, struct request_sock *req,
				      struct sock *child)
{
	struct request_sock_queue *queue = &inet_csk(sk)->icsk_accept_queue;

	spin_lock(&queue->rskq_lock);
	if (unlikely(sk->sk_state != TCP_LISTEN)) {
		spin_unlock(&queue->rskq_lock);
		return NULL;
	}
	req->sk = child;
	list_add_tail(&req->dl_next, &queue->head);
	queue->qlen++;
	WRITE_ONCE(sk->sk_ack_backlog, sk->sk_ack_backlog + 1);
	spin_unlock(&queue->rskq_lock);
	return child;
}

int inet_csk_listen_start(struct sock *sk)
{
	struct inet_connection_sock *icsk = inet_csk(sk);
	struct inet_sock *inet = inet_sk(sk);
	int err;

	INIT_LIST_HEAD(&icsk->icsk_accept_queue.head);
	icsk->icsk_accept_queue.qlen = 0;
	sk->sk_ack_backlog = 0;
	sk->sk_state = TCP_LISTEN;
	err = -EADDRINUSE;
	if (!sk->sk_prot->get_port(sk, inet->inet_num)) {
		inet->inet_sport = htons(inet->inet_num);
		err = sk->sk_prot->hash(sk);
		if (likely(!err))
			return 0;
	}
	sk->sk_state = TCP_CLOSE;
	return err;
}

/* The listener is closing: every child nobody accepted is closed too. */
void inet_csk_listen_stop(struct sock *sk)
{
	struct request_sock_queue *queue = &inet_csk(sk)->icsk_accept_queue;
	struct request_sock *req;

	while ((req = reqsk_queue_remove(queue, sk)) != NULL) {
		struct sock *child = req->sk;

		reqsk_free(req);
		if (child) {
			child->sk_socket = NULL;
			NET_INC_STATS(LINUX_MIB_TCPABORTONCLOSE);
			tcp_close(child, 0);
		}
	}
}

/* Sleeps until the accept queue has something; called with the socket locked, returns
 * with it locked. */
static int inet_csk_wait_for_connect(struct sock *sk, long timeo)
{
	struct inet_connection_sock *icsk = inet_csk(sk);
	DEFINE_WAIT(wait);
	int err;

	for (;;) {
		prepare_to_wait(&sk->sk_wq, &wait);
		release_sock(sk);
		if (reqsk_queue_empty(&icsk->icsk_accept_queue) &&
		    READ_ONCE(sk->sk_state) == TCP_LISTEN)
			schedule();
		lock_sock(sk);
		err = 0;
		if (!reqsk_queue_empty(&icsk->icsk_accept_queue))
			break;
		err = -EINVAL;
		if (sk->sk_state != TCP_LISTEN)
			break;
		err = -EAGAIN;
		if (!timeo)
			break;
	}
	finish_wait(&sk->sk_wq, &wait);
	return err;
}

/* Takes the next established connection off the listener's queue; blocks for one
 * unless O_NONBLOCK is in flags (then -EAGAIN). */
struct sock *inet_csk_accept(struct sock *sk, int flags, int *err, bool kern)
{
	struct inet_connection_sock *icsk = inet_csk(sk);
	struct request_sock_queue *queue = &icsk->icsk_accept_queue;
	struct request_sock *req;
	struct sock *newsk;
	int error;

	lock_sock(sk);
	error = -EINVAL;
	if (sk->sk_state != TCP_LISTEN)
		goto out_err;
	if (reqsk_queue_empty(queue)) {
		long timeo = sock_rcvtimeo(sk, flags & O_NONBLOCK);

		error = -EAGAIN;
		if (!timeo)
			goto out_err;
		error = inet_csk_wait_for_connect(sk, timeo);
		if (error)
			goto out_err;
	}
	req = reqsk_queue_remove(queue, sk);
	release_sock(sk);
	if (unlikely(!req)) {
		*err = -EAGAIN;
		return NULL;
	}
	newsk = req->sk;
	reqsk_free(req);
	return newsk;
out_err:
	release_sock(sk);
	*err = error;
	return NULL;
}
