/* /sys/class/net/<dev>/: attributes of each network device, and statistics/. */
#include "net.h"

static ssize_t dev_attr_show(struct kobject *kobj, struct attribute *attr, char *buf)
{
	struct device_attribute *dev_attr = container_of(attr, struct device_attribute, attr);
	struct device *dev = container_of(kobj, struct device, kobj);

	if (dev_attr->show)
		return dev_attr->show(dev, dev_attr, buf);
	return -EIO;
}

static ssize_t dev_attr_store(struct kobject *kobj, struct attribute *attr, const char *buf,
			      size_t count)
{
	struct device_attribute *dev_attr = container_of(attr, struct device_attribute, attr);
	struct device *dev = container_of(kobj, struct device, kobj);

	if (dev_attr->store)
		return dev_attr->store(dev, dev_attr, buf, count);
	return -EIO;
}

static const struct sysfs_ops dev_sysfs_ops = {
	.show = dev_attr_show,
	.store = dev_attr_store,
};

/* /sys/class/net/<dev>/name: the interface name. */
static ssize_t name_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%s\n", to_net_dev(dev)->name);
}

static ssize_t ifindex_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%d\n", to_net_dev(dev)->ifindex);
}

static ssize_t mtu_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%u\n", to_net_dev(dev)->mtu);
}

static ssize_t address_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	const u8 *a = to_net_dev(dev)->dev_addr;

	return sysfs_emit(buf, "%02x:%02x:%02x:%02x:%02x:%02x\n", a[0], a[1], a[2], a[3], a[4],
			  a[5]);
}

static ssize_t operstate_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	unsigned int flags = to_net_dev(dev)->flags;

	if (flags & IFF_LOOPBACK)
		return sysfs_emit(buf, "unknown\n");
	return sysfs_emit(buf, "%s\n", (flags & IFF_RUNNING) ? "up" : "down");
}

static ssize_t flags_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "0x%x\n", to_net_dev(dev)->flags);
}

static struct device_attribute dev_attr_name = { { "name", 0444 }, name_show, NULL };
static struct device_attribute dev_attr_ifindex = { { "ifindex", 0444 }, ifindex_show, NULL };
static struct device_attribute dev_attr_mtu = { { "mtu", 0444 }, mtu_show, NULL };
static struct device_attribute dev_attr_address = { { "address", 0444 }, address_show, NULL };
static struct device_attribute dev_attr_operstate = { { "operstate", 0444 }, operstate_show,
						      NULL };
static struct device_attribute dev_attr_flags = { { "flags", 0444 }, flags_show, NULL };

static const struct attribute *const net_class_attrs[] = {
	&dev_attr_name.attr,
	&dev_attr_ifindex.attr,
	&dev_attr_mtu.attr,
	&dev_attr_address.attr,
	&dev_attr_operstate.attr,
	&dev_attr_flags.attr,
	NULL,
};

static const struct kobj_type net_class_ktype = {
	.sysfs_ops = &dev_sysfs_ops,
	.default_attrs = net_class_attrs,
};

/* statistics/: each file shows one counter of struct net_device_stats. */
struct netstat_attribute {
	struct attribute attr;
	size_t offset;
};

static ssize_t netstat_show(struct kobject *kobj, struct attribute *attr, char *buf)
{
	struct net_device *ndev = container_of(kobj, struct net_device, statistics_kobj);
	struct netstat_attribute *na = container_of(attr, struct netstat_attribute, attr);
	unsigned long v = *(unsigned long *)((char *)&ndev->stats + na->offset);

	return sysfs_emit(buf, "%lu\n", v);
}

static const struct sysfs_ops netstat_sysfs_ops = {
	.show = netstat_show,
};

#define NETSTAT_ENTRY(name) \
	static struct netstat_attribute netstat_##name = { \
		{ #name, 0444 }, offsetof(struct net_device_stats, name) }
NETSTAT_ENTRY(rx_packets);
NETSTAT_ENTRY(rx_bytes);
NETSTAT_ENTRY(rx_errors);
NETSTAT_ENTRY(rx_dropped);
NETSTAT_ENTRY(rx_length_errors);
NETSTAT_ENTRY(tx_packets);
NETSTAT_ENTRY(tx_bytes);

static const struct attribute *const netstat_attrs[] = {
	&netstat_rx_packets.attr, &netstat_rx_bytes.attr, &netstat_rx_errors.attr,
	&netstat_rx_dropped.attr, &netstat_rx_length_errors.attr, &netstat_tx_packets.attr,
	&netstat_tx_bytes.attr, NULL,
};

static const struct kobj_type netstat_ktype = {
	.sysfs_ops = &netstat_sysfs_ops,
	.default_attrs = netstat_attrs,
};

static struct kobject net_class_kobj = { .name = "net" };
static bool net_class_registered;

int netdev_register_kobject(struct net_device *ndev)
{
	struct device *dev = &ndev->dev;
	int err;

	if (!net_class_registered) {
		err = kobject_add(&net_class_kobj, class_kobj, NULL);
		if (err)
			return err;
		net_class_registered = true;
	}
	dev->init_name = ndev->name;
	dev->kobj.ktype = &net_class_ktype;
	err = kobject_add(&dev->kobj, &net_class_kobj, ndev->name);
	if (err)
		return err;
	ndev->statistics_kobj.ktype = &netstat_ktype;
	return kobject_add(&ndev->statistics_kobj, &dev->kobj, "statistics");
}
