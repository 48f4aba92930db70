/* Where TCP finds its sockets: the established hash (by 4-tuple), the listening hash
 * (by local port) and the bind hash (who owns which port).  One lock covers all three;
 * a socket in the established or listening hash holds a reference for it. */
#include "net.h"

#define EHASH_SIZE 256
#define LHASH_SIZE 32
#define BHASH_SIZE 64
#define PORT_RANGE_LO 32768
#define PORT_RANGE_HI 60999

struct inet_hashinfo {
	spinlock_t lock;
	struct list_head ehash[EHASH_SIZE];
	struct list_head lhash2[LHASH_SIZE];
	struct list_head bhash[BHASH_SIZE];
	unsigned int ehash_count, lhash_count, bhash_count;
	u32 hash_secret;
} tcp_hashinfo;

void inet_hashinfo_init(void)
{
	int i;

	for (i = 0; i < EHASH_SIZE; i++)
		INIT_LIST_HEAD(&tcp_hashinfo.ehash[i]);
	for (i = 0; i < LHASH_SIZE; i++)
		INIT_LIST_HEAD(&tcp_hashinfo.lhash2[i]);
	for (i = 0; i < BHASH_SIZE; i++)
		INIT_LIST_HEAD(&tcp_hashinfo.bhash[i]);
	tcp_hashinfo.hash_secret = 0x5eed5eed;
}

static inline unsigned int inet_ehashfn(u32 laddr, u16 lport, u32 faddr, u16 fport)
{
	struct {
		u32 laddr, faddr;
		u16 lport, fport;
	} key = { laddr, faddr, lport, fport };

	return jhash(&key, sizeof(key), tcp_hashinfo.hash_secret) & (EHASH_SIZE - 1);
}

static inline unsigned int inet_lhashfn(u16 hnum)
{
	return (hnum ^ (hnum >> 5)) & (LHASH_SIZE - 1);
}

static inline unsigned int inet_bhashfn(u16 lport)
{
	return (lport * 0x9e37u >> 4) & (BHASH_SIZE - 1);
}

/* Puts a connected socket in the established hash. */
bool inet_ehash_nolisten(struct sock *sk)
{
	unsigned int slot = inet_ehashfn(sk->sk_rcv_saddr, sk->sk_num, sk->sk_daddr,
					 sk->sk_dport);
	struct sock *other;

	spin_lock(&tcp_hashinfo.lock);
	list_for_each_entry(other, &tcp_hashinfo.ehash[slot], sk_node) {
		if (other->sk_num == sk->sk_num && other->sk_dport == sk->sk_dport &&
		    other->sk_daddr == sk->sk_daddr && other->sk_rcv_saddr == sk->sk_rcv_saddr) {
			spin_unlock(&tcp_hashinfo.lock);
			return false;	/* the same connection exists already */
		}
	}
	sock_hold(sk);
	list_add(&sk->sk_node, &tcp_hashinfo.ehash[slot]);
	tcp_hashinfo.ehash_count++;
	spin_unlock(&tcp_hashinfo.lock);
	return true;
}

int inet_hash(struct sock *sk)
{
	if (sk->sk_state == TCP_CLOSE)
		return 0;
	if (sk->sk_state != TCP_LISTEN)
		return inet_ehash_nolisten(sk) ? 0 : -EADDRINUSE;
	spin_lock(&tcp_hashinfo.lock);
	sock_hold(sk);
	list_add_tail(&sk->sk_node, &tcp_hashinfo.lhash2[inet_lhashfn(sk->sk_num)]);
	tcp_hashinfo.lhash_count++;
	spin_unlock(&tcp_hashinfo.lock);
	return 0;
}

void inet_unhash(struct sock *sk)
{
	bool hashed;

	spin_lock(&tcp_hashinfo.lock);
	hashed = !list_empty(&sk->sk_node);
	if (hashed) {
		list_del_init(&sk->sk_node);
		if (sk->sk_state == TCP_LISTEN)
			tcp_hashinfo.lhash_count--;
		else
			tcp_hashinfo.ehash_count--;
	}
	spin_unlock(&tcp_hashinfo.lock);
	if (hashed)
		sock_put(sk);
}

struct sock *__inet_lookup_established(u32 saddr, u16 sport, u32 daddr, u16 hnum)
{
	unsigned int slot = inet_ehashfn(daddr, hnum, saddr, sport);
	struct sock *sk;

	spin_lock(&tcp_hashinfo.lock);
	list_for_each_entry(sk, &tcp_hashinfo.ehash[slot], sk_node) {
		if (sk->sk_num == hnum && sk->sk_dport == sport && sk->sk_daddr == saddr &&
		    sk->sk_rcv_saddr == daddr) {
			sock_hold(sk);
			spin_unlock(&tcp_hashinfo.lock);
			return sk;
		}
	}
	spin_unlock(&tcp_hashinfo.lock);
	return NULL;
}

/* How well a listener matches: -1 not at all; a socket bound to the exact address
 * beats one bound to INADDR_ANY. */
static inline int compute_score(struct sock *sk, u16 hnum, u32 daddr)
{
	int score = -1;

	if (sk->sk_num == hnum && sk->sk_state == TCP_LISTEN) {
		score = 1;
		if (sk->sk_rcv_saddr) {
			if (sk->sk_rcv_saddr != daddr)
				return -1;
			score += 4;
		}
	}
	return score;
}

struct sock *__inet_lookup_listener(struct sk_buff *skb, u32 saddr, u16 sport, u32 daddr,
				    u16 hnum)
{
	struct sock *sk, *result = NULL;
	int score, hiscore = 0;

	spin_lock(&tcp_hashinfo.lock);
	list_for_each_entry(sk, &tcp_hashinfo.lhash2[inet_lhashfn(hnum)], sk_node) {
		score = compute_score(sk, hnum, daddr);
		if (score > hiscore) {
			result = sk;
			hiscore = score;
		}
	}
	if (result)
		sock_hold(result);
	spin_unlock(&tcp_hashinfo.lock);
	return result;
}

/* ---- ports ------------------------------------------------------------------------- */

static bool inet_bind_conflict(const struct sock *sk, unsigned short snum)
{
	struct sock *sk2;

	list_for_each_entry(sk2, &tcp_hashinfo.bhash[inet_bhashfn(snum)], sk_bind_node) {
		if (sk2 == sk || sk2->sk_num != snum)
			continue;
		if (!sk->sk_rcv_saddr || !sk2->sk_rcv_saddr ||
		    sk->sk_rcv_saddr == sk2->sk_rcv_saddr)
			return true;
	}
	return false;
}

/* Binds sk to snum (0: pick a free ephemeral port); 0 on success, 1 if it is taken. */
int inet_csk_get_port(struct sock *sk, unsigned short snum)
{
	static unsigned int hint;
	int ret = 1;

	spin_lock(&tcp_hashinfo.lock);
	if (!list_empty(&sk->sk_bind_node)) {
		ret = sk->sk_num == snum ? 0 : 1;	/* already ours */
		goto out;
	}
	if (!snum) {
		unsigned int range = PORT_RANGE_HI - PORT_RANGE_LO + 1, i;

		for (i = 0; i < range; i++) {
			unsigned short port = PORT_RANGE_LO + (hint + i) % range;

			if (!inet_bind_conflict(sk, port)) {
				snum = port;
				hint += i + 1;
				break;
			}
		}
		if (!snum)
			goto out;
	} else if (inet_bind_conflict(sk, snum)) {
		goto out;
	}
	sk->sk_num = snum;
	list_add(&sk->sk_bind_node, &tcp_hashinfo.bhash[inet_bhashfn(snum)]);
	tcp_hashinfo.bhash_count++;
	ret = 0;
out:
	spin_unlock(&tcp_hashinfo.lock);
	return ret;
}

void inet_put_port(struct sock *sk)
{
	spin_lock(&tcp_hashinfo.lock);
	if (!list_empty(&sk->sk_bind_node)) {
		list_del_init(&sk->sk_bind_node);
		tcp_hashinfo.bhash_count--;
	}
	spin_unlock(&tcp_hashinfo.lock);
}
