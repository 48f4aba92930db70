/* TCP input for a socket: the state machine, in-order data, FIN and RST. */
#include "net.h"

static inline bool before(u32 seq1, u32 seq2)
{
	return (s32)(seq1 - seq2) < 0;
}
#define after(seq2, seq1) before(seq1, seq2)

/* An acceptable RST moves the connection to CLOSE with the error a reader sees. */
static void tcp_reset(struct sock *sk)
{
	switch (sk->sk_state) {
	case TCP_SYN_SENT:
		sk->sk_err = ECONNREFUSED;
		break;
	case TCP_CLOSE_WAIT:
		sk->sk_err = EPIPE;
		break;
	case TCP_CLOSE:
		return;
	default:
		sk->sk_err = ECONNRESET;
	}
	tcp_set_state(sk, TCP_CLOSE);
	sk->sk_shutdown = SHUTDOWN_MASK;
	sk->sk_state_change(sk);
}

/* The peer has no more to send: readers get EOF once the queue is drained. */
static void tcp_fin(struct sock *sk)
{
	sk->sk_shutdown |= RCV_SHUTDOWN;
	switch (sk->sk_state) {
	case TCP_SYN_RECV:
	case TCP_ESTABLISHED:
		tcp_set_state(sk, TCP_CLOSE_WAIT);
		break;
	case TCP_CLOSE_WAIT:
	case TCP_CLOSING:
	case TCP_LAST_ACK:
		break;	/* a retransmitted FIN */
	case TCP_FIN_WAIT1:
		tcp_set_state(sk, TCP_CLOSING);
		break;
	case TCP_FIN_WAIT2:
		tcp_set_state(sk, TCP_CLOSE);	/* no TIME_WAIT here */
		break;
	default:
		pr_err("tcp_fin: Impossible, sk->sk_state=%d (%s)\n", sk->sk_state,
		       tcp_state_names[sk->sk_state % TCP_MAX_STATES]);
		break;
	}
	sk->sk_state_change(sk);
}

/* Appends in-order payload to the receive queue; true when skb now belongs to it. */
static bool tcp_data_queue(struct sock *sk, struct sk_buff *skb)
{
	struct tcp_sock *tp = tcp_sk(sk);
	struct tcp_skb_cb *cb = TCP_SKB_CB(skb);
	bool fin = cb->tcp_flags & TCPHDR_FIN;

	if (cb->seq == cb->end_seq)
		return false;	/* a bare ACK */
	if (!after(cb->end_seq, tp->rcv_nxt)) {
		NET_INC_STATS(LINUX_MIB_TCPDUPDATA);
		return false;
	}
	if (before(cb->seq, tp->rcv_nxt)) {
		/* partly seen before: keep only the new part */
		skb_pull(skb, tp->rcv_nxt - cb->seq);
		cb->seq = tp->rcv_nxt;
	}
	if (cb->seq != tp->rcv_nxt) {
		NET_INC_STATS(LINUX_MIB_TCPOFODROP);	/* no out-of-order queue */
		return false;
	}
	if (!skb->len) {
		tp->rcv_nxt = cb->end_seq;
		if (fin)
			tcp_fin(sk);
		return false;
	}
	if (sk->sk_rmem_alloc + (int)skb->truesize > sk->sk_rcvbuf ||
	    (sk->sk_shutdown & RCV_SHUTDOWN)) {
		NET_INC_STATS(LINUX_MIB_TCPRCVQDROP);
		return false;
	}
	tp->rcv_nxt = cb->end_seq;
	tp->bytes_received += skb->len;
	tp->data_segs_in++;
	sk->sk_rmem_alloc += skb->truesize;
	skb->sk = sk;
	skb_queue_tail(&sk->sk_receive_queue, skb);
	if (fin)
		tcp_fin(sk);
	sk->sk_data_ready(sk);
	return true;
}

static void tcp_ack(struct sock *sk, const struct sk_buff *skb)
{
	struct tcp_sock *tp = tcp_sk(sk);
	u32 ack = TCP_SKB_CB(skb)->ack_seq;

	/* Peers may not know our ISN (nothing is transmitted): ignore what we never sent. */
	if (after(ack, tp->snd_una) && !after(ack, tp->snd_nxt))
		tp->snd_una = ack;
	tp->snd_wnd = ntohs(tcp_hdr(skb)->window);
}

/* The ESTABLISHED fast path.  Consumes skb. */
void tcp_rcv_established(struct sock *sk, struct sk_buff *skb)
{
	const struct tcphdr *th = tcp_hdr(skb);
	struct tcp_sock *tp = tcp_sk(sk);

	tp->segs_in++;
	if (unlikely(th->rst)) {
		if (TCP_SKB_CB(skb)->seq == tp->rcv_nxt)
			tcp_reset(sk);
		kfree_skb_reason(skb, SKB_DROP_REASON_TCP_RESET);
		return;
	}
	if (unlikely(th->syn || !th->ack)) {
		TCP_INC_STATS(TCP_MIB_INERRS);
		kfree_skb_reason(skb, SKB_DROP_REASON_TCP_FLAGS);
		return;
	}
	tcp_ack(sk, skb);
	if (!tcp_data_queue(sk, skb))
		consume_skb(skb);
}

/* Every state but ESTABLISHED.  Returns 1 when the caller should answer with a reset
 * (skb not consumed), else 0 (skb consumed). */
int tcp_rcv_state_process(struct sock *sk, struct sk_buff *skb)
{
	const struct tcphdr *th = tcp_hdr(skb);
	enum skb_drop_reason reason = SKB_DROP_REASON_NOT_SPECIFIED;
	int err;

	switch (sk->sk_state) {
	case TCP_CLOSE:
		reason = SKB_DROP_REASON_TCP_CLOSE;
		goto discard;
	case TCP_LISTEN:
		if (th->ack)
			return 1;
		if (th->rst) {
			reason = SKB_DROP_REASON_TCP_RESET;
			goto discard;
		}
		if (th->syn) {
			if (th->fin) {
				reason = SKB_DROP_REASON_TCP_FLAGS;
				goto discard;
			}
			err = tcp_v4_conn_request(sk, skb);
			if (err) {
				reason = SKB_DROP_REASON_LISTEN_OVERFLOW;
				goto discard;
			}
			consume_skb(skb);
			return 0;
		}
		reason = SKB_DROP_REASON_TCP_FLAGS;
		goto discard;
	case TCP_SYN_SENT:
		goto discard;	/* this kernel never connects */
	}

	tcp_sk(sk)->segs_in++;
	if (th->rst) {
		tcp_reset(sk);
		reason = SKB_DROP_REASON_TCP_RESET;
		goto discard;
	}
	if (!th->ack) {
		reason = SKB_DROP_REASON_TCP_FLAGS;
		goto discard;
	}
	tcp_ack(sk, skb);

	/* what the ACK means in each state */
	switch (sk->sk_state) {
	case TCP_SYN_RECV:
		tcp_set_state(sk, TCP_ESTABLISHED);
		sk->sk_state_change(sk);
		break;
	case TCP_FIN_WAIT1:
		if (tcp_sk(sk)->snd_una == tcp_sk(sk)->snd_nxt)
			tcp_set_state(sk, TCP_FIN_WAIT2);
		break;
	case TCP_CLOSING:
		tcp_set_state(sk, TCP_CLOSE);	/* TIME_WAIT, shortened to nothing */
		goto discard;
	case TCP_LAST_ACK:
		tcp_set_state(sk, TCP_CLOSE);
		goto discard;
	}

	/* and what to do with its data */
	switch (sk->sk_state) {
	case TCP_CLOSE_WAIT:
	case TCP_CLOSING:
	case TCP_LAST_ACK:
		break;	/* the peer has already said FIN */
	case TCP_FIN_WAIT1:
	case TCP_FIN_WAIT2:
	case TCP_ESTABLISHED:
		if (tcp_data_queue(sk, skb))
			return 0;
		break;
	}
	consume_skb(skb);
	return 0;

discard:
	kfree_skb_reason(skb, reason);
	return 0;
}
