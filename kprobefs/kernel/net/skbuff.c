/* Socket buffers: a header describing a kmalloc'd data area with headroom. */
#include "net.h"
#include "trace/events/skb.h"

#define NET_SKB_PAD 32
unsigned long skb_drop_reasons[SKB_DROP_REASON_MAX];
unsigned long nr_skbs;

struct sk_buff *alloc_skb(unsigned int size, gfp_t priority)
{
	struct sk_buff *skb;
	unsigned char *data;

	skb = kzalloc(sizeof(*skb), priority);
	if (!skb)
		return NULL;
	size = ALIGN(size, 8);
	data = kmalloc(size, priority);
	if (!data) {
		kfree(skb);
		return NULL;
	}
	INIT_LIST_HEAD(&skb->list);
	skb->head = skb->data = skb->tail = data;
	skb->end = data + size;
	skb->truesize = size + sizeof(*skb);
	__atomic_add_fetch(&nr_skbs, 1, __ATOMIC_RELAXED);
	return skb;
}

/* An skb for a received frame of length bytes, with NET_SKB_PAD of headroom. */
struct sk_buff *netdev_alloc_skb(struct net_device *dev, unsigned int length)
{
	struct sk_buff *skb = alloc_skb(length + NET_SKB_PAD, GFP_KERNEL);

	if (likely(skb)) {
		skb_reserve(skb, NET_SKB_PAD);
		skb->dev = dev;
	}
	return skb;
}

static void skb_release_data(struct sk_buff *skb)
{
	kfree(skb->head);
	skb->head = skb->data = skb->tail = skb->end = NULL;
}

static void __kfree_skb(struct sk_buff *skb)
{
	skb_release_data(skb);
	kfree(skb);
	__atomic_sub_fetch(&nr_skbs, 1, __ATOMIC_RELAXED);
}

/* Frees a packet that was dropped, counting why (what the kfree_skb tracepoint reports). */
noinline void kfree_skb_reason(struct sk_buff *skb, enum skb_drop_reason reason)
{
	if (unlikely(!skb))
		return;
	if (reason <= SKB_NOT_DROPPED_YET || reason >= SKB_DROP_REASON_MAX)
		reason = SKB_DROP_REASON_NOT_SPECIFIED;
	__atomic_add_fetch(&skb_drop_reasons[reason], 1, __ATOMIC_RELAXED);
	trace_kfree_skb(skb, __builtin_return_address(0), reason);
	__kfree_skb(skb);
}

/* Frees a packet that was used, not dropped. */
void consume_skb(struct sk_buff *skb)
{
	if (unlikely(!skb))
		return;
	trace_consume_skb(skb);
	__kfree_skb(skb);
}

void skb_reserve(struct sk_buff *skb, int len)
{
	skb->data += len;
	skb->tail += len;
}

void *skb_put(struct sk_buff *skb, unsigned int len)
{
	void *tmp = skb->tail;

	skb->tail += len;
	skb->len += len;
	if (unlikely(skb->tail > skb->end))
		panic("skb_over_panic: len:%u put:%u", skb->len, len);
	return tmp;
}

void *skb_put_data(struct sk_buff *skb, const void *data, unsigned int len)
{
	void *tmp = skb_put(skb, len);

	memcpy(tmp, data, len);
	return tmp;
}

/* Removes len bytes from the start; NULL (nothing done) when there are fewer. */
void *skb_pull(struct sk_buff *skb, unsigned int len)
{
	if (unlikely(len > skb->len))
		return NULL;
	skb->len -= len;
	skb->data += len;
	return skb->data;
}

int pskb_trim(struct sk_buff *skb, unsigned int len)
{
	if (len > skb->len)
		return -EINVAL;
	skb->len = len;
	skb->tail = skb->data + len;
	return 0;
}

void skb_queue_head_init(struct sk_buff_head *list)
{
	INIT_LIST_HEAD(&list->list);
	list->qlen = 0;
	list->lock.locked = 0;
}

void skb_queue_tail(struct sk_buff_head *list, struct sk_buff *newsk)
{
	spin_lock(&list->lock);
	list_add_tail(&newsk->list, &list->list);
	list->qlen++;
	spin_unlock(&list->lock);
}

struct sk_buff *skb_peek(const struct sk_buff_head *list)
{
	if (list_empty(&list->list))
		return NULL;
	return list_first_entry(&list->list, struct sk_buff, list);
}

struct sk_buff *skb_dequeue(struct sk_buff_head *list)
{
	struct sk_buff *skb;

	spin_lock(&list->lock);
	skb = skb_peek(list);
	if (skb) {
		list_del_init(&skb->list);
		list->qlen--;
	}
	spin_unlock(&list->lock);
	return skb;
}

void skb_unlink(struct sk_buff *skb, struct sk_buff_head *list)
{
	spin_lock(&list->lock);
	list_del_init(&skb->list);
	list->qlen--;
	spin_unlock(&list->lock);
}

void skb_queue_purge(struct sk_buff_head *list)
{
	struct sk_buff *skb;

	while ((skb = skb_dequeue(list)) != NULL)
		kfree_skb(skb);
}
