/* The skb events, with Linux 6.1's fields and print formats. */
#if !defined(_TRACE_SKB_H) || defined(TRACE_HEADER_MULTI_READ)
#define _TRACE_SKB_H
#include "tracepoint.h"
#include <net.h>	/* the kernel's include/net.h */

#undef TRACE_SYSTEM
#define TRACE_SYSTEM skb

/* A dropped packet freed, with where and why (reason: enum skb_drop_reason). */
#ifndef __SKB_DROP_REASON_SYM
#define __SKB_DROP_REASON_SYM(n, reason) { n, #reason },
#define __SKB_DROP_REASON_SYM_END(n, reason) { n, #reason }
#endif

TRACE_EVENT(kfree_skb,

	TP_PROTO(struct sk_buff *skb, void *location, enum skb_drop_reason reason),

	TP_ARGS(skb, location, reason),

	TP_STRUCT__entry(
		__field(void *, skbaddr)
		__field(void *, location)
		__field(unsigned short, protocol)
		__field(enum skb_drop_reason, reason)
	),

	TP_fast_assign(
		__entry->skbaddr = skb;
		__entry->location = location;
		__entry->protocol = ntohs(skb->protocol);
		__entry->reason = reason;
	),

	TP_printk("skbaddr=%p protocol=%u location=%p reason: %s",
		  __entry->skbaddr, __entry->protocol, __entry->location,
		  __print_symbolic(__entry->reason,
				   DEFINE_DROP_REASON(__SKB_DROP_REASON_SYM,
						      __SKB_DROP_REASON_SYM_END)))
);

TRACE_EVENT(consume_skb,

	TP_PROTO(struct sk_buff *skb),

	TP_ARGS(skb),

	TP_STRUCT__entry(
		__field(void *, skbaddr)
	),

	TP_fast_assign(
		__entry->skbaddr = skb;
	),

	TP_printk("skbaddr=%p", __entry->skbaddr)
);
#endif
