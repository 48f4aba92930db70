/* The skb events, with Linux 6.1's fields and print formats. */
#if !defined(_TRACE_SKB_H) || defined(TRACE_HEADER_MULTI_READ)
#define _TRACE_SKB_H
#include "tracepoint.h"
#include <net.h>	/* the kernel's include/net.h */

#undef TRACE_SYSTEM
#define TRACE_SYSTEM skb

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
