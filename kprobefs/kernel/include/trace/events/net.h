/* The net events on the receive path, with Linux 6.1's fields and print formats. */
#if !defined(_TRACE_NET_H) || defined(TRACE_HEADER_MULTI_READ)
#define _TRACE_NET_H
#include "tracepoint.h"
#include <net.h>	/* the kernel's include/net.h */

#undef TRACE_SYSTEM
#define TRACE_SYSTEM net

DECLARE_EVENT_CLASS(net_dev_template,

	TP_PROTO(struct sk_buff *skb),

	TP_ARGS(skb),

	TP_STRUCT__entry(
		__field(void *, skbaddr)
		__field(unsigned int, len)
		__string(name, skb->dev->name)
	),

	TP_fast_assign(
		__entry->skbaddr = skb;
		__entry->len = skb->len;
		__assign_str(name, skb->dev->name);
	),

	TP_printk("dev=%s skbaddr=%p len=%u",
		  __get_str(name), __entry->skbaddr, __entry->len)
);

DEFINE_EVENT(net_dev_template, netif_receive_skb,
	     TP_PROTO(struct sk_buff *skb), TP_ARGS(skb));
#endif
