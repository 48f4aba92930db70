/* TCP over IPv4: segment validation, socket lookup, and passive opens. */
#include "net.h"

extern int tcp_v4_init_sock(struct sock *sk);

/* The checksum over pseudo-header and segment.  A zero checksum field means the
 * sender left the checksum to offload hardware that is not there: such segments are
 * taken as verified (CHECKSUM_UNNECESSARY), the convention the host's packet
 * generator relies on.  Returns 0 when the segment may be used. */
static int tcp_v4_checksum_init(struct sk_buff *skb)
{
	const struct iphdr *iph = ip_hdr(skb);
	const struct tcphdr *th = (const struct tcphdr *)skb->data;

	if (!th->check) {
		skb->ip_summed = CHECKSUM_UNNECESSARY;
		return 0;
	}
	if (csum_tcpudp_magic(iph->saddr, iph->daddr, skb->len, IPPROTO_TCP,
			      csum_partial(skb->data, skb->len, 0)))
		return -1;
	skb->ip_summed = CHECKSUM_UNNECESSARY;
	return 0;
}

static void tcp_v4_fill_cb(struct sk_buff *skb, const struct iphdr *iph,
			   const struct tcphdr *th)
{
	struct tcp_skb_cb *cb = TCP_SKB_CB(skb);
	unsigned int payload = skb->len - th->doff * 4;

	cb->seq = ntohl(th->seq);
	cb->end_seq = cb->seq + th->syn + th->fin + payload;
	cb->ack_seq = ntohl(th->ack_seq);
	cb->tcp_flags = ((u8 *)th)[13];
}

/* Our initial sequence number for a connection: a keyed hash of the 4-tuple plus a
 * clock, as RFC 6528 asks. */
static u32 tcp_v4_init_seq(const struct iphdr *iph, const struct tcphdr *th)
{
	struct {
		u32 saddr, daddr;
		u16 sport, dport;
	} key = { iph->daddr, iph->saddr, th->dest, th->source };

	return jhash(&key, sizeof(key), 0x7cb1c0de) + (u32)(ktime_get_ns() >> 6);
}

/* Where a RST would go out.  Nothing is transmitted; the count is what remains. */
static void tcp_v4_send_reset(const struct sock *sk, struct sk_buff *skb)
{
	const struct tcphdr *th = tcp_hdr(skb);

	if (th->rst)
		return;
	TCP_INC_STATS(TCP_MIB_OUTSEGS);
	TCP_INC_STATS(TCP_MIB_OUTRSTS);
}

/* Makes the child of a passive open and puts it in the established hash. */
static struct sock *tcp_v4_syn_recv_sock(const struct sock *sk, struct sk_buff *skb,
					 struct request_sock *req)
{
	struct sock *newsk;

	if (sk_acceptq_is_full(sk))
		goto exit_overflow;
	newsk = tcp_create_openreq_child(sk, req, skb);
	if (!newsk)
		goto exit;
	if (!inet_ehash_nolisten(newsk)) {
		sock_put(newsk);	/* the connection exists already */
		goto exit;
	}
	return newsk;

exit_overflow:
	NET_INC_STATS(LINUX_MIB_LISTENOVERFLOWS);
exit:
	NET_INC_STATS(LINUX_MIB_LISTENDROPS);
	return NULL;
}

/* A SYN on a listener.  There is no SYN-ACK to send and no final ACK to wait for (the
 * NIC only receives), so the handshake is taken as complete: the child goes straight
 * to ESTABLISHED and onto the accept queue.  0, or -ENOBUFS when it was dropped. */
int tcp_v4_conn_request(struct sock *sk, struct sk_buff *skb)
{
	const struct iphdr *iph = ip_hdr(skb);
	const struct tcphdr *th = tcp_hdr(skb);
	struct request_sock *req;
	struct sock *child;

	if (sk_acceptq_is_full(sk)) {
		NET_INC_STATS(LINUX_MIB_LISTENOVERFLOWS);
		goto drop;
	}
	req = kzalloc(sizeof(*req), GFP_KERNEL);
	if (!req)
		goto drop;
	INIT_LIST_HEAD(&req->dl_next);
	req->ir_rmt_addr = iph->saddr;
	req->ir_loc_addr = iph->daddr;
	req->ir_rmt_port = th->source;
	req->ir_num = sk->sk_num;
	req->rcv_isn = TCP_SKB_CB(skb)->seq;
	req->snt_isn = tcp_v4_init_seq(iph, th);

	child = tcp_v4_syn_recv_sock(sk, skb, req);
	if (!child) {
		kfree(req);
		return -ENOBUFS;
	}
	lock_sock(child);
	tcp_set_state(child, TCP_ESTABLISHED);
	release_sock(child);
	if (!inet_csk_reqsk_queue_add(sk, req, child)) {
		kfree(req);
		tcp_close(child, 0);
		goto drop;
	}
	TCP_INC_STATS(TCP_MIB_PASSIVEOPENS);
	sk->sk_data_ready(sk);
	return 0;
drop:
	NET_INC_STATS(LINUX_MIB_LISTENDROPS);
	return -ENOBUFS;
}

/* Called with sk locked; consumes skb. */
int tcp_v4_do_rcv(struct sock *sk, struct sk_buff *skb)
{
	if (sk->sk_state == TCP_ESTABLISHED) {
		tcp_rcv_established(sk, skb);
		return 0;
	}
	if (tcp_rcv_state_process(sk, skb)) {
		tcp_v4_send_reset(sk, skb);
		kfree_skb_reason(skb, SKB_DROP_REASON_TCP_FLAGS);
	}
	return 0;
}

static struct sock *__inet_lookup_skb(struct sk_buff *skb, u16 sport, u16 dport)
{
	const struct iphdr *iph = ip_hdr(skb);
	u16 hnum = ntohs(dport);
	struct sock *sk;

	sk = __inet_lookup_established(iph->saddr, sport, iph->daddr, hnum);
	if (sk)
		return sk;
	return __inet_lookup_listener(skb, iph->saddr, sport, iph->daddr, hnum);
}

/* Entry from IP: skb->data is at the TCP header.  Always consumes skb. */
int tcp_v4_rcv(struct sk_buff *skb)
{
	enum skb_drop_reason drop_reason = SKB_DROP_REASON_NOT_SPECIFIED;
	const struct iphdr *iph;
	const struct tcphdr *th;
	struct sock *sk;
	int ret;

	if (skb->pkt_type != PACKET_HOST) {
		drop_reason = SKB_DROP_REASON_OTHERHOST;
		goto discard_it;
	}
	TCP_INC_STATS(TCP_MIB_INSEGS);
	if (!pskb_may_pull(skb, sizeof(struct tcphdr))) {
		drop_reason = SKB_DROP_REASON_PKT_TOO_SMALL;
		goto bad_packet;
	}
	th = (const struct tcphdr *)skb->data;
	if (unlikely(th->doff < sizeof(struct tcphdr) / 4) || !pskb_may_pull(skb, th->doff * 4)) {
		drop_reason = SKB_DROP_REASON_PKT_TOO_SMALL;
		goto bad_packet;
	}
	if (tcp_v4_checksum_init(skb))
		goto csum_error;
	iph = ip_hdr(skb);
	tcp_v4_fill_cb(skb, iph, th);
	skb_pull(skb, th->doff * 4);	/* data now at the payload; tcp_hdr() still works */

	sk = __inet_lookup_skb(skb, th->source, th->dest);
	if (!sk)
		goto no_tcp_socket;
	lock_sock(sk);
	ret = tcp_v4_do_rcv(sk, skb);
	release_sock(sk);
	sock_put(sk);
	return ret;

no_tcp_socket:
	drop_reason = SKB_DROP_REASON_NO_SOCKET;
	tcp_v4_send_reset(NULL, skb);
	goto discard_it;
csum_error:
	drop_reason = SKB_DROP_REASON_TCP_CSUM;
	TCP_INC_STATS(TCP_MIB_CSUMERRORS);
bad_packet:
	TCP_INC_STATS(TCP_MIB_INERRS);
discard_it:
	kfree_skb_reason(skb, drop_reason);
	return 0;
}

struct proto tcp_prot = {
	.name = "TCP",
	.close = tcp_close,
	.init = tcp_v4_init_sock,
	.accept = inet_csk_accept,
	.ioctl = tcp_ioctl,
	.sendmsg = tcp_sendmsg,
	.recvmsg = tcp_recvmsg,
	.hash = inet_hash,
	.unhash = inet_unhash,
	.get_port = inet_csk_get_port,
	.obj_size = sizeof(struct tcp_sock),
};

struct net_protocol tcp_protocol = {
	.handler = tcp_v4_rcv,
	.no_policy = 1,
};
