/* The child socket a passive open creates. */
#include "net.h"

/* A new socket for the connection req describes, cloned from the listener sk: same
 * protocol, addresses from the SYN, sequence numbers from both ISNs. */
struct sock *tcp_create_openreq_child(const struct sock *sk, struct request_sock *req,
				      struct sk_buff *skb)
{
	struct sock *newsk = sk_alloc(&init_net, sk->sk_family, GFP_KERNEL, sk->sk_prot, 0);
	struct inet_sock *newinet;
	struct tcp_sock *newtp;

	if (!newsk)
		return NULL;
	sock_init_data(NULL, newsk);
	newsk->sk_type = sk->sk_type;
	newsk->sk_protocol = sk->sk_protocol;
	newsk->sk_rcvbuf = sk->sk_rcvbuf;
	newsk->sk_state = TCP_SYN_RECV;

	newinet = inet_sk(newsk);
	newinet->inet_daddr = req->ir_rmt_addr;
	newinet->inet_rcv_saddr = req->ir_loc_addr;
	newinet->inet_saddr = req->ir_loc_addr;
	newinet->inet_dport = req->ir_rmt_port;
	newinet->inet_num = req->ir_num;
	newinet->inet_sport = htons(req->ir_num);
	newinet->ttl = inet_sk(sk)->ttl;

	newtp = tcp_sk(newsk);
	newtp->rcv_nxt = req->rcv_isn + 1;
	newtp->copied_seq = newtp->rcv_nxt;
	newtp->snd_una = newtp->snd_nxt = req->snt_isn + 1;
	newtp->rcv_wnd = tcp_sk(sk)->rcv_wnd;
	newtp->snd_wnd = ntohs(tcp_hdr(skb)->window);
	newtp->segs_in = 1;
	inet_csk(newsk)->icsk_rto = inet_csk(sk)->icsk_rto;
	return newsk;
}
