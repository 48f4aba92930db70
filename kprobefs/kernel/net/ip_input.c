/* IPv4 input: header validation, local delivery, and dispatch to the transport. */
#include "net.h"

unsigned long ip_statistics[__IPSTATS_MIB_MAX];
extern const struct net_protocol *inet_protocol_lookup(unsigned char protocol);

/* A fragment (more fragments follow, or a non-zero offset); this kernel does not
 * reassemble.  Kept out of line: both the header check and local delivery ask. */
static noinline bool ip_is_fragment(const struct iphdr *iph)
{
	return (iph->frag_off & htons(IP_MF | IP_OFFSET)) != 0;
}

static inline bool ipv4_is_lbcast(u32 addr)
{
	return addr == htonl(0xffffffff);
}

static inline bool ipv4_is_multicast(u32 addr)
{
	return (addr & htonl(0xf0000000)) == htonl(0xe0000000);
}

static inline bool ipv4_is_zeronet(u32 addr)
{
	return (addr & htonl(0xff000000)) == 0;
}

static int ip_local_deliver_finish(struct sk_buff *skb)
{
	const struct net_protocol *ipprot;
	int protocol = ip_hdr(skb)->protocol;

	skb_pull(skb, skb->transport_header - skb->network_header);
	ipprot = inet_protocol_lookup(protocol);
	if (ipprot) {
		__IP_INC_STATS(IPSTATS_MIB_INDELIVERS);
		return ipprot->handler(skb);
	}
	__IP_INC_STATS(IPSTATS_MIB_INUNKNOWNPROTOS);
	kfree_skb_reason(skb, SKB_DROP_REASON_IP_NOPROTO);
	return 0;
}

int ip_local_deliver(struct sk_buff *skb)
{
	if (ip_is_fragment(ip_hdr(skb))) {
		__IP_INC_STATS(IPSTATS_MIB_REASMFAILS);
		kfree_skb_reason(skb, SKB_DROP_REASON_IP_FRAGMENT);
		return 0;
	}
	return ip_local_deliver_finish(skb);
}

/* Routing, such as it is: every unicast destination is local (the host decides which
 * packets reach this machine); broadcast, multicast and 0/8 are not for TCP. */
static int ip_rcv_finish(struct sk_buff *skb)
{
	const struct iphdr *iph = ip_hdr(skb);

	if (ipv4_is_multicast(iph->daddr) || ipv4_is_lbcast(iph->daddr) ||
	    ipv4_is_zeronet(iph->daddr) || ipv4_is_multicast(iph->saddr) ||
	    ipv4_is_lbcast(iph->saddr)) {
		__IP_INC_STATS(IPSTATS_MIB_INADDRERRORS);
		kfree_skb_reason(skb, SKB_DROP_REASON_OTHERHOST);
		return 0;
	}
	return ip_local_deliver(skb);
}

/* Validates the header; returns skb trimmed to the datagram, or NULL (dropped). */
static struct sk_buff *ip_rcv_core(struct sk_buff *skb)
{
	enum skb_drop_reason drop_reason = SKB_DROP_REASON_NOT_SPECIFIED;
	const struct iphdr *iph;
	unsigned int len;

	if (skb->pkt_type == PACKET_OTHERHOST) {
		drop_reason = SKB_DROP_REASON_OTHERHOST;
		goto drop;
	}
	__IP_ADD_STATS(IPSTATS_MIB_INOCTETS, skb->len);
	if (!pskb_may_pull(skb, sizeof(struct iphdr)))
		goto inhdr_error;
	iph = ip_hdr(skb);
	/* RFC 1122 3.2.1.2: silently discard a datagram with a bad checksum, and the
	 * version and header length must make sense before the checksum can. */
	if (iph->ihl < 5 || iph->version != 4)
		goto inhdr_error;
	if (!pskb_may_pull(skb, iph->ihl * 4))
		goto inhdr_error;
	if (unlikely(ip_fast_csum((u8 *)iph, iph->ihl)))
		goto csum_error;
	len = ntohs(iph->tot_len);
	if (skb->len < len) {
		drop_reason = SKB_DROP_REASON_PKT_TOO_SMALL;
		__IP_INC_STATS(IPSTATS_MIB_INTRUNCATEDPKTS);
		goto drop;
	} else if (len < (iph->ihl * 4u)) {
		goto inhdr_error;
	}
	if (pskb_trim(skb, len)) {
		__IP_INC_STATS(IPSTATS_MIB_INDISCARDS);
		goto drop;
	}
	if (ip_is_fragment(iph) && !(iph->frag_off & htons(IP_OFFSET)) &&
	    len - iph->ihl * 4 < 8)
		goto inhdr_error;	/* a first fragment too short to hold ports */
	skb->transport_header = skb->network_header + iph->ihl * 4;
	return skb;

csum_error:
	drop_reason = SKB_DROP_REASON_IP_CSUM;
	__IP_INC_STATS(IPSTATS_MIB_CSUMERRORS);
inhdr_error:
	if (drop_reason == SKB_DROP_REASON_NOT_SPECIFIED)
		drop_reason = SKB_DROP_REASON_IP_INHDR;
	__IP_INC_STATS(IPSTATS_MIB_INHDRERRORS);
drop:
	kfree_skb_reason(skb, drop_reason);
	return NULL;
}

int ip_rcv(struct sk_buff *skb, struct net_device *dev, struct packet_type *pt,
	   struct net_device *orig_dev)
{
	__IP_INC_STATS(IPSTATS_MIB_INPKTS);
	skb = ip_rcv_core(skb);
	if (skb == NULL)
		return -1;	/* NET_RX_DROP */
	return ip_rcv_finish(skb);
}

struct packet_type ip_packet_type = {
	.type = 0x0008,	/* htons(ETH_P_IP) */
	.func = ip_rcv,
};
