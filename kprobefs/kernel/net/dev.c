/* Network devices and the receive path's first half: the NIC ring the host fills, NAPI
 * polling into socket buffers, and protocol dispatch by packet type. */
#include "net.h"
#include "trace/events/net.h"
#include "hardirq.h"

#define NAPI_POLL_WEIGHT 16

/* The host writes slots[tail % nslots] and then bumps tail; the kernel owns head. */
struct nic_ring nic_rx_ring __aligned(64);

static LIST_HEAD(dev_base_head);
static DEFINE_SPINLOCK(dev_base_lock);
static LIST_HEAD(ptype_base);
static int dev_ifindex_next;
unsigned long netdev_rx_dropped, netdev_budget_squeeze;

struct net_device loopback_dev = {
	.name = "lo",
	.flags = IFF_UP | IFF_LOOPBACK | IFF_RUNNING,
	.mtu = 65536,
	.ip_addr = 0x0100007f,	/* 127.0.0.1 */
};

struct net_device nic_dev = {
	.name = "eth0",
	.flags = IFF_UP | IFF_RUNNING,
	.mtu = 1500,
	.dev_addr = { 0x52, 0x54, 0x00, 0x12, 0x34, 0x56 },
	.ip_addr = 0x0f02000a,	/* 10.0.2.15 */
};

int register_netdevice(struct net_device *dev)
{
	int ret;

	spin_lock(&dev_base_lock);
	dev->ifindex = ++dev_ifindex_next;
	list_add_tail(&dev->dev_list, &dev_base_head);
	spin_unlock(&dev_base_lock);
	ret = netdev_register_kobject(dev);
	if (ret)
		pr_warn("%s: sysfs registration failed: %d\n", dev->name, ret);
	return 0;
}

struct net_device *dev_get_by_name(const char *name)
{
	struct net_device *dev, *found = NULL;

	spin_lock(&dev_base_lock);
	list_for_each_entry(dev, &dev_base_head, dev_list) {
		if (!strncmp(dev->name, name, IFNAMSIZ)) {
			found = dev;
			break;
		}
	}
	spin_unlock(&dev_base_lock);
	return found;
}

void dev_add_pack(struct packet_type *pt)
{
	spin_lock(&dev_base_lock);
	list_add(&pt->list, &ptype_base);
	spin_unlock(&dev_base_lock);
}

static inline int deliver_skb(struct sk_buff *skb, struct packet_type *pt_prev,
			      struct net_device *orig_dev)
{
	return pt_prev->func(skb, skb->dev, pt_prev, orig_dev);
}

/* Hands skb to the handler registered for its protocol; drops it when there is none. */
static int __netif_receive_skb_core(struct sk_buff *skb)
{
	struct net_device *orig_dev = skb->dev;
	struct packet_type *ptype, *pt_prev = NULL;

	skb_reset_network_header(skb);
	skb->transport_header = skb->network_header;
	list_for_each_entry(ptype, &ptype_base, list) {
		if (ptype->type != skb->protocol)
			continue;
		if (ptype->dev && ptype->dev != skb->dev)
			continue;
		pt_prev = ptype;
		break;
	}
	if (pt_prev)
		return deliver_skb(skb, pt_prev, orig_dev);
	if (skb->dev)
		skb->dev->stats.rx_dropped++;
	kfree_skb_reason(skb, SKB_DROP_REASON_NOT_SPECIFIED);
	return -1;	/* NET_RX_DROP */
}

static noinline int __netif_receive_skb(struct sk_buff *skb)
{
	return __netif_receive_skb_core(skb);
}

noinline int netif_receive_skb(struct sk_buff *skb)
{
	skb->tstamp = ktime_get_ns();
	trace_netif_receive_skb(skb);
	return __netif_receive_skb(skb);
}

/* Takes one frame off the ring into a fresh skb (NULL when the frame is dropped). */
static struct sk_buff *nic_fetch_rx(struct net_device *dev, struct nic_slot *slot)
{
	u32 len = READ_ONCE(slot->len);
	struct sk_buff *skb;

	if (unlikely(len == 0 || len > sizeof(slot->data))) {
		dev->stats.rx_length_errors++;
		dev->stats.rx_errors++;
		return NULL;
	}
	skb = netdev_alloc_skb(dev, len);
	if (unlikely(!skb)) {
		dev->stats.rx_dropped++;
		netdev_rx_dropped++;
		return NULL;
	}
	skb_put_data(skb, slot->data, len);
	skb->protocol = htons(ETH_P_IP);
	skb->pkt_type = PACKET_HOST;
	skb->ip_summed = CHECKSUM_NONE;
	dev->stats.rx_packets++;
	dev->stats.rx_bytes += len;
	return skb;
}

/* NAPI poll: at most budget frames; returns how many were taken off the ring. */
static int nic_poll(struct net_device *dev, int budget)
{
	struct nic_ring *ring = &nic_rx_ring;
	int work = 0;

	while (work < budget) {
		u32 head = ring->head;
		struct sk_buff *skb;

		if (head == READ_ONCE(ring->tail))
			break;
		barrier();	/* read the slot only after seeing tail move */
		skb = nic_fetch_rx(dev, &ring->slots[head % ring->nslots]);
		WRITE_ONCE(ring->head, head + 1);
		if (skb)
			netif_receive_skb(skb);
		work++;
	}
	return work;
}

/* The NET_RX softirq, which the NIC's interrupt raises. */
void net_rx_action(void)
{
	int budget;

	for (;;) {
		budget = 300;
		while (budget > 0) {
			int work = nic_poll(&nic_dev, min(budget, NAPI_POLL_WEIGHT));

			budget -= work;
			if (work < NAPI_POLL_WEIGHT)
				return;
		}
		/* Out of budget with frames left; nothing else waits on this CPU. */
		netdev_budget_squeeze++;
	}
}

static void net_rx_softirq(struct softirq_action *h)
{
	net_rx_action();
}

/* The NIC's interrupt: the host filled the receive ring (napi_schedule). */
static irqreturn_t nic_interrupt(int irq, void *dev_id)
{
	raise_softirq_irqoff(NET_RX_SOFTIRQ);
	return IRQ_HANDLED;
}

extern void inet_init(void);
extern void sock_init(void);

void net_init(void)
{
	struct nic_ring *ring = &nic_rx_ring;

	ring->head = 0;
	ring->tail = 0;
	ring->nslots = ARRAY_SIZE(ring->slots);
	ring->slot_size = sizeof(ring->slots[0]);
	BUILD_BUG_ON(sizeof(struct nic_slot) != 2048);
	sock_init();
	register_netdevice(&loopback_dev);
	register_netdevice(&nic_dev);
	open_softirq(NET_RX_SOFTIRQ, net_rx_softirq);
	request_irq(NIC_IRQ, nic_interrupt, 0, nic_dev.name, &nic_dev);
	inet_init();
	pr_info("%s: NIC ring at %p, %u slots of %u bytes\n", nic_dev.name, ring, ring->nslots,
		ring->slot_size);
}
