/* TCP socket calls: state changes, close, reading and writing, ioctl. */
#include "net.h"
#include "uaccess.h"

#define MSG_DONTWAIT 0x40
#define MSG_PEEK 0x2
#define SIOCINQ 0x541B
#define SIOCOUTQ 0x5411
#define SIOCATMARK 0x8905
#define SIOCOUTQNSD 0x894B

unsigned long tcp_statistics[__TCP_MIB_MAX];
unsigned long net_statistics[__LINUX_MIB_MAX];
extern void inet_put_port(struct sock *sk);

const char *const tcp_state_names[TCP_MAX_STATES] = {
	[0] = "UNKNOWN",
	[TCP_ESTABLISHED] = "ESTABLISHED",
	[TCP_SYN_SENT] = "SYN_SENT",
	[TCP_SYN_RECV] = "SYN_RECV",
	[TCP_FIN_WAIT1] = "FIN_WAIT1",
	[TCP_FIN_WAIT2] = "FIN_WAIT2",
	[TCP_TIME_WAIT] = "TIME_WAIT",
	[TCP_CLOSE] = "CLOSE",
	[TCP_CLOSE_WAIT] = "CLOSE_WAIT",
	[TCP_LAST_ACK] = "LAST_ACK",
	[TCP_LISTEN] = "LISTEN",
	[TCP_CLOSING] = "CLOSING",
	[TCP_NEW_SYN_RECV] = "NEW_SYN_RECV",
};

/* Caller holds the socket lock.  Leaving for TCP_CLOSE takes the socket out of the
 * hashes and gives its port back. */
void tcp_set_state(struct sock *sk, int state)
{
	int oldstate = sk->sk_state;

	switch (state) {
	case TCP_ESTABLISHED:
		if (oldstate != TCP_ESTABLISHED)
			TCP_INC_STATS(TCP_MIB_CURRESTAB);
		break;
	case TCP_CLOSE:
		if (oldstate == TCP_CLOSE_WAIT || oldstate == TCP_ESTABLISHED)
			TCP_INC_STATS(TCP_MIB_ESTABRESETS);
		sk->sk_prot->unhash(sk);
		inet_put_port(sk);
		/* fall through */
	default:
		if (oldstate == TCP_ESTABLISHED)
			TCP_DEC_STATS(TCP_MIB_CURRESTAB);
	}
	WRITE_ONCE(sk->sk_state, state);
}

/* The state close() moves to; true when a FIN has to be sent. */
static bool tcp_close_state(struct sock *sk)
{
	int ns;
	bool send_fin = false;

	switch (sk->sk_state) {
	case TCP_ESTABLISHED:
	case TCP_SYN_RECV:
		ns = TCP_FIN_WAIT1;
		send_fin = true;
		break;
	case TCP_CLOSE_WAIT:
		ns = TCP_LAST_ACK;
		send_fin = true;
		break;
	case TCP_FIN_WAIT1:
	case TCP_FIN_WAIT2:
	case TCP_LAST_ACK:
	case TCP_CLOSING:
		ns = sk->sk_state;
		break;
	case TCP_SYN_SENT:
	case TCP_TIME_WAIT:
	case TCP_LISTEN:
	case TCP_CLOSE:
	default:
		ns = TCP_CLOSE;
		break;
	}
	tcp_set_state(sk, ns);
	return send_fin;
}

/* A closed socket gives up its hash slots and its port (a socket that was bound but
 * never listened reaches here still holding the port). */
static void inet_csk_destroy_sock(struct sock *sk)
{
	sk->sk_prot->unhash(sk);
	inet_put_port(sk);
}

/* close() of the owning socket (or of a child nobody accepted).  Nothing on this
 * machine would ever acknowledge our FIN (frames are only ever received), so the
 * connection goes straight to CLOSE instead of lingering in FIN_WAIT/LAST_ACK. */
void tcp_close(struct sock *sk, long timeout)
{
	struct sk_buff *skb;
	u32 data_was_unread = 0;

	lock_sock(sk);
	sk->sk_shutdown = SHUTDOWN_MASK;
	if (sk->sk_state == TCP_LISTEN) {
		tcp_set_state(sk, TCP_CLOSE);
		inet_csk_listen_stop(sk);
		goto adjudge_to_death;
	}
	while ((skb = skb_dequeue(&sk->sk_receive_queue)) != NULL) {
		data_was_unread += skb->len;
		sk->sk_rmem_alloc -= skb->truesize;
		kfree_skb_reason(skb, SKB_DROP_REASON_TCP_CLOSE);
	}
	if (sk->sk_state == TCP_CLOSE)
		goto adjudge_to_death;
	if (data_was_unread) {
		/* RFC 2525 2.17: unread data means a reset, not a FIN */
		NET_INC_STATS(LINUX_MIB_TCPABORTONCLOSE);
		TCP_INC_STATS(TCP_MIB_OUTRSTS);
		tcp_set_state(sk, TCP_CLOSE);
	} else if (tcp_close_state(sk)) {
		TCP_INC_STATS(TCP_MIB_OUTSEGS);
		tcp_sk(sk)->snd_nxt++;
	}
adjudge_to_death:
	sk->sk_socket = NULL;
	sk->sk_flags |= 1UL << SOCK_DEAD;
	if (sk->sk_state != TCP_CLOSE)
		tcp_set_state(sk, TCP_CLOSE);
	inet_csk_destroy_sock(sk);
	release_sock(sk);
	sk->sk_state_change(sk);
	sock_put(sk);
}

/* Sleeps until data, EOF or an error; called and returns with the socket locked. */
static void sk_wait_data(struct sock *sk)
{
	DEFINE_WAIT(wait);

	prepare_to_wait(&sk->sk_wq, &wait);
	release_sock(sk);
	if (skb_queue_empty(&sk->sk_receive_queue) && !(sk->sk_shutdown & RCV_SHUTDOWN) &&
	    !sk->sk_err && READ_ONCE(sk->sk_state) != TCP_CLOSE)
		schedule();
	lock_sock(sk);
	finish_wait(&sk->sk_wq, &wait);
}

int tcp_recvmsg(struct sock *sk, char __user *buf, size_t len, int flags, int *addr_len)
{
	struct tcp_sock *tp = tcp_sk(sk);
	int copied = 0;

	lock_sock(sk);
	if (sk->sk_state == TCP_LISTEN) {
		copied = -ENOTCONN;
		goto out;
	}
	for (;;) {
		struct sk_buff *skb = skb_peek(&sk->sk_receive_queue);

		if (skb) {
			size_t n = min(len - copied, (size_t)skb->len);

			if (copy_to_user(buf + copied, skb->data, n)) {
				if (!copied)
					copied = -EFAULT;
				break;
			}
			copied += n;
			if (flags & MSG_PEEK)
				break;
			tp->copied_seq += n;
			skb_pull(skb, n);
			if (!skb->len) {
				skb_unlink(skb, &sk->sk_receive_queue);
				sk->sk_rmem_alloc -= skb->truesize;
				consume_skb(skb);
			}
			if ((size_t)copied == len)
				break;
			continue;
		}
		if (copied)
			break;
		if (sk->sk_err) {
			copied = -sk->sk_err;
			sk->sk_err = 0;
			break;
		}
		if (sk->sk_shutdown & RCV_SHUTDOWN)
			break;
		if (sk->sk_state == TCP_CLOSE) {
			/* never connected, or reset and already reported */
			copied = (sk->sk_flags & (1UL << SOCK_DEAD)) ? 0 : -ENOTCONN;
			break;
		}
		if (flags & MSG_DONTWAIT) {
			copied = -EAGAIN;
			break;
		}
		sk_wait_data(sk);
	}
out:
	release_sock(sk);
	return copied;
}

/* Accepts data for transmission.  There is no transmit path (the NIC only receives),
 * so the bytes are counted as sent and acknowledged at once. */
int tcp_sendmsg(struct sock *sk, const char __user *buf, size_t size, int flags)
{
	struct tcp_sock *tp = tcp_sk(sk);
	int err;

	if (!access_ok(buf, size))
		return -EFAULT;
	lock_sock(sk);
	err = -EPIPE;
	if (sk->sk_err) {
		err = -sk->sk_err;
		goto out;
	}
	if (sk->sk_shutdown & SEND_SHUTDOWN)
		goto out;
	if (!((1 << sk->sk_state) & (TCPF_ESTABLISHED | TCPF_CLOSE_WAIT)))
		goto out;
	tp->snd_nxt += size;
	tp->snd_una = tp->snd_nxt;
	tp->bytes_sent += size;
	tp->bytes_acked += size;
	if (size)
		TCP_INC_STATS(TCP_MIB_OUTSEGS);
	err = size;
out:
	release_sock(sk);
	return err;
}

int tcp_ioctl(struct sock *sk, int cmd, unsigned long arg)
{
	struct tcp_sock *tp = tcp_sk(sk);
	int answ;

	switch (cmd) {
	case SIOCINQ:
		if (sk->sk_state == TCP_LISTEN)
			return -EINVAL;
		lock_sock(sk);
		answ = tp->rcv_nxt - tp->copied_seq;
		if (answ && (sk->sk_shutdown & RCV_SHUTDOWN))
			answ--;	/* the FIN is not data */
		release_sock(sk);
		break;
	case SIOCATMARK:
		answ = 0;
		break;
	case SIOCOUTQ:
	case SIOCOUTQNSD:
		if (sk->sk_state == TCP_LISTEN)
			return -EINVAL;
		answ = tp->snd_nxt - tp->snd_una;
		break;
	default:
		return -ENOIOCTLCMD;
	}
	return put_user((u32)answ, (int __user *)arg);
}

int tcp_v4_init_sock(struct sock *sk)
{
	struct inet_connection_sock *icsk = inet_csk(sk);
	struct tcp_sock *tp = tcp_sk(sk);

	icsk->icsk_rto = HZ;
	tp->rcv_wnd = 65535;
	tp->snd_wnd = 65535;
	sk->sk_state = TCP_CLOSE;
	return 0;
}
