/* IPv4/TCP networking: socket buffers, sockets, the NIC ring the host fills, and the
 * protocol tables the receive path dispatches through. */
#ifndef _KPF_NET_H
#define _KPF_NET_H
#include "fs.h"

#define EDESTADDRREQ 89
#define EPROTOTYPE 91
#define EPROTONOSUPPORT 93
#define ESOCKTNOSUPPORT 94
#define ENOBUFS 105
#define EISCONN 106
#define ENOTCONN 107
#define ECONNRESET 104
#define ECONNREFUSED 111
#define ECONNABORTED 103
#define EADDRNOTAVAIL 99
#define ENOIOCTLCMD 515

#define AF_UNSPEC 0
#define AF_INET 2
#define PF_INET AF_INET
#define NPROTO 46
#define SOCK_STREAM 1
#define SOCK_DGRAM 2
#define SOCK_RAW 3
#define SOCK_MAX 11
#define SOCK_TYPE_MASK 0xf
#define SOCK_NONBLOCK O_NONBLOCK
#define SOCK_CLOEXEC O_CLOEXEC
#define IPPROTO_IP 0
#define IPPROTO_ICMP 1
#define IPPROTO_TCP 6
#define IPPROTO_UDP 17
#define ETH_P_IP 0x0800
#define INADDR_ANY 0u
#define SOMAXCONN 4096

#define htons(x) ((u16)__builtin_bswap16((u16)(x)))
#define ntohs(x) htons(x)
#define htonl(x) ((u32)__builtin_bswap32((u32)(x)))
#define ntohl(x) htonl(x)

struct sockaddr {
	u16 sa_family;
	char sa_data[14];
};

struct in_addr {
	u32 s_addr;
};

struct sockaddr_in {
	u16 sin_family;
	u16 sin_port;		/* network order */
	struct in_addr sin_addr;	/* network order */
	u8 __pad[8];
};

struct sockaddr_storage {
	u16 ss_family;
	char __data[126];
} __aligned(8);

/* ---- wire formats ------------------------------------------------------------------ */
struct iphdr {
	u8 ihl:4, version:4;
	u8 tos;
	u16 tot_len;
	u16 id;
	u16 frag_off;
	u8 ttl;
	u8 protocol;
	u16 check;
	u32 saddr;
	u32 daddr;
};
#define IP_CE 0x8000
#define IP_DF 0x4000
#define IP_MF 0x2000
#define IP_OFFSET 0x1FFF

struct tcphdr {
	u16 source;
	u16 dest;
	u32 seq;
	u32 ack_seq;
	u16 res1:4, doff:4, fin:1, syn:1, rst:1, psh:1, ack:1, urg:1, ece:1, cwr:1;
	u16 window;
	u16 check;
	u16 urg_ptr;
};
#define TCPHDR_FIN 0x01
#define TCPHDR_SYN 0x02
#define TCPHDR_RST 0x04
#define TCPHDR_PSH 0x08
#define TCPHDR_ACK 0x10
#define TCPHDR_URG 0x20

/* ---- the NIC: a receive ring in kernel memory, filled by the host ------------------ */
struct nic_ring {
	u32 head;		/* next slot the kernel consumes */
	u32 tail;		/* next slot the host fills */
	u32 nslots;
	u32 slot_size;
	struct nic_slot {
		u32 len;
		u8 data[2044];
	} slots[64];
};
extern struct nic_ring nic_rx_ring;

/* ---- socket buffers ---------------------------------------------------------------- */
struct tcp_skb_cb {
	u32 seq;
	u32 end_seq;
	u32 ack_seq;
	u8 tcp_flags;
};

#include "dropreason.h"

#define PACKET_HOST 0
#define PACKET_BROADCAST 1
#define PACKET_MULTICAST 2
#define PACKET_OTHERHOST 3
#define CHECKSUM_NONE 0
#define CHECKSUM_UNNECESSARY 1

struct net_device;
struct sock;

struct sk_buff {
	struct list_head list;
	struct sock *sk;
	struct net_device *dev;
	unsigned int len;		/* bytes from data to tail */
	unsigned int truesize;
	u16 protocol;			/* network order */
	u16 network_header;		/* offsets from head */
	u16 transport_header;
	u8 pkt_type;
	u8 ip_summed;
	unsigned char *head, *data, *tail, *end;
	u64 tstamp;
	struct tcp_skb_cb cb;
};
#define TCP_SKB_CB(skb) (&(skb)->cb)

struct sk_buff_head {
	struct list_head list;
	u32 qlen;
	spinlock_t lock;
};

static inline unsigned char *skb_network_header(const struct sk_buff *skb)
{
	return skb->head + skb->network_header;
}
static inline unsigned char *skb_transport_header(const struct sk_buff *skb)
{
	return skb->head + skb->transport_header;
}
static inline void skb_reset_network_header(struct sk_buff *skb)
{
	skb->network_header = skb->data - skb->head;
}
static inline void skb_set_transport_header(struct sk_buff *skb, int offset)
{
	skb->transport_header = skb->data - skb->head + offset;
}
static inline struct iphdr *ip_hdr(const struct sk_buff *skb)
{
	return (struct iphdr *)skb_network_header(skb);
}
static inline struct tcphdr *tcp_hdr(const struct sk_buff *skb)
{
	return (struct tcphdr *)skb_transport_header(skb);
}
static inline bool pskb_may_pull(struct sk_buff *skb, unsigned int len)
{
	return len <= skb->len;
}

struct sk_buff *alloc_skb(unsigned int size, gfp_t priority);
struct sk_buff *netdev_alloc_skb(struct net_device *dev, unsigned int length);
void kfree_skb_reason(struct sk_buff *skb, enum skb_drop_reason reason);
static inline void kfree_skb(struct sk_buff *skb)
{
	kfree_skb_reason(skb, SKB_DROP_REASON_NOT_SPECIFIED);
}
void consume_skb(struct sk_buff *skb);
void *skb_put(struct sk_buff *skb, unsigned int len);
void *skb_put_data(struct sk_buff *skb, const void *data, unsigned int len);
void skb_reserve(struct sk_buff *skb, int len);
void *skb_pull(struct sk_buff *skb, unsigned int len);
int pskb_trim(struct sk_buff *skb, unsigned int len);
void skb_queue_head_init(struct sk_buff_head *list);
void skb_queue_tail(struct sk_buff_head *list, struct sk_buff *newsk);
struct sk_buff *skb_dequeue(struct sk_buff_head *list);
struct sk_buff *skb_peek(const struct sk_buff_head *list);
void skb_unlink(struct sk_buff *skb, struct sk_buff_head *list);
void skb_queue_purge(struct sk_buff_head *list);
static inline bool skb_queue_empty(const struct sk_buff_head *list)
{
	return list_empty(&list->list);
}
extern unsigned long skb_drop_reasons[SKB_DROP_REASON_MAX];

/* ---- checksums (net/utils.c) -------------------------------------------------------- */
u32 csum_partial(const void *buff, int len, u32 sum);
u16 csum_fold(u32 sum);
u16 csum_tcpudp_magic(u32 saddr, u32 daddr, u32 len, u8 proto, u32 sum);

/* ---- devices and their sysfs view ------------------------------------------------- */
struct device {
	struct kobject kobj;
	const char *init_name;
};
struct device_attribute {
	struct attribute attr;
	ssize_t (*show)(struct device *dev, struct device_attribute *attr, char *buf);
	ssize_t (*store)(struct device *dev, struct device_attribute *attr, const char *buf,
			 size_t count);
};

struct net_device_stats {
	unsigned long rx_packets, tx_packets, rx_bytes, tx_bytes, rx_errors, tx_errors,
		rx_dropped, tx_dropped, rx_length_errors, rx_missed_errors;
};

#define IFNAMSIZ 16
#define IFF_UP 0x1
#define IFF_LOOPBACK 0x8
#define IFF_RUNNING 0x40

struct net_device {
	char name[IFNAMSIZ];
	int ifindex;
	unsigned int flags;
	unsigned int mtu;
	u8 dev_addr[6];
	u32 ip_addr;			/* network order */
	struct net_device_stats stats;
	struct list_head dev_list;
	struct device dev;
	struct kobject statistics_kobj;
};
#define to_net_dev(d) container_of(d, struct net_device, dev)

int register_netdevice(struct net_device *dev);
struct net_device *dev_get_by_name(const char *name);
int netdev_register_kobject(struct net_device *ndev);
int netif_receive_skb(struct sk_buff *skb);
void net_rx_action(void);
void net_init(void);

struct packet_type {
	u16 type;			/* network order */
	struct net_device *dev;
	int (*func)(struct sk_buff *, struct net_device *, struct packet_type *,
		    struct net_device *);
	struct list_head list;
};
void dev_add_pack(struct packet_type *pt);

/* ---- SNMP counters ------------------------------------------------------------------ */
enum {
	IPSTATS_MIB_INPKTS,
	IPSTATS_MIB_INOCTETS,
	IPSTATS_MIB_INDELIVERS,
	IPSTATS_MIB_INHDRERRORS,
	IPSTATS_MIB_INADDRERRORS,
	IPSTATS_MIB_INUNKNOWNPROTOS,
	IPSTATS_MIB_INTRUNCATEDPKTS,
	IPSTATS_MIB_INDISCARDS,
	IPSTATS_MIB_CSUMERRORS,
	IPSTATS_MIB_REASMFAILS,
	__IPSTATS_MIB_MAX
};
enum {
	TCP_MIB_ACTIVEOPENS,
	TCP_MIB_PASSIVEOPENS,
	TCP_MIB_ATTEMPTFAILS,
	TCP_MIB_ESTABRESETS,
	TCP_MIB_CURRESTAB,
	TCP_MIB_INSEGS,
	TCP_MIB_OUTSEGS,
	TCP_MIB_INERRS,
	TCP_MIB_OUTRSTS,
	TCP_MIB_CSUMERRORS,
	__TCP_MIB_MAX
};
enum {
	LINUX_MIB_LISTENOVERFLOWS,
	LINUX_MIB_LISTENDROPS,
	LINUX_MIB_TCPOFODROP,
	LINUX_MIB_TCPABORTONCLOSE,
	LINUX_MIB_TCPRCVQDROP,
	LINUX_MIB_TCPDUPDATA,
	__LINUX_MIB_MAX
};
extern unsigned long ip_statistics[__IPSTATS_MIB_MAX];
extern unsigned long tcp_statistics[__TCP_MIB_MAX];
extern unsigned long net_statistics[__LINUX_MIB_MAX];
#define __SNMP_INC(arr, f) __atomic_add_fetch(&(arr)[f], 1, __ATOMIC_RELAXED)
#define __SNMP_ADD(arr, f, v) __atomic_add_fetch(&(arr)[f], (v), __ATOMIC_RELAXED)
#define __IP_INC_STATS(f) __SNMP_INC(ip_statistics, f)
#define __IP_ADD_STATS(f, v) __SNMP_ADD(ip_statistics, f, v)
#define TCP_INC_STATS(f) __SNMP_INC(tcp_statistics, f)
#define TCP_DEC_STATS(f) __atomic_sub_fetch(&tcp_statistics[f], 1, __ATOMIC_RELAXED)
#define NET_INC_STATS(f) __SNMP_INC(net_statistics, f)

/* ---- sockets ------------------------------------------------------------------------ */
typedef enum {
	SS_FREE = 0,
	SS_UNCONNECTED,
	SS_CONNECTING,
	SS_CONNECTED,
	SS_DISCONNECTING
} socket_state;

struct socket;
struct proto_ops {
	int family;
	int (*release)(struct socket *sock);
	int (*bind)(struct socket *sock, struct sockaddr *myaddr, int sockaddr_len);
	int (*accept)(struct socket *sock, struct socket *newsock, int flags, bool kern);
	int (*getname)(struct socket *sock, struct sockaddr *addr, int peer);
	int (*ioctl)(struct socket *sock, unsigned int cmd, unsigned long arg);
	int (*listen)(struct socket *sock, int len);
	int (*shutdown)(struct socket *sock, int flags);
	int (*sendmsg)(struct socket *sock, const char __user *buf, size_t len, int flags);
	int (*recvmsg)(struct socket *sock, char __user *buf, size_t len, int flags);
};

struct socket {
	socket_state state;
	short type;
	unsigned long flags;
	struct file *file;
	struct sock *sk;
	const struct proto_ops *ops;
};

struct socket_alloc {
	struct socket socket;
	struct inode vfs_inode;
};
static inline struct socket *SOCKET_I(struct inode *inode)
{
	return &container_of(inode, struct socket_alloc, vfs_inode)->socket;
}
static inline struct inode *SOCK_INODE(struct socket *socket)
{
	return &container_of(socket, struct socket_alloc, socket)->vfs_inode;
}

struct net {
	int ifindex;
	atomic_t count;
};
extern struct net init_net;

struct net_proto_family {
	int family;
	int (*create)(struct net *net, struct socket *sock, int protocol, int kern);
};
int sock_register(const struct net_proto_family *fam);

struct proto {
	const char *name;
	void (*close)(struct sock *sk, long timeout);
	int (*init)(struct sock *sk);
	struct sock *(*accept)(struct sock *sk, int flags, int *err, bool kern);
	int (*ioctl)(struct sock *sk, int cmd, unsigned long arg);
	int (*sendmsg)(struct sock *sk, const char __user *buf, size_t len, int flags);
	int (*recvmsg)(struct sock *sk, char __user *buf, size_t len, int flags,
		       int *addr_len);
	int (*hash)(struct sock *sk);
	void (*unhash)(struct sock *sk);
	int (*get_port)(struct sock *sk, unsigned short snum);
	unsigned int obj_size;
	atomic_t inuse;
};

enum {
	TCP_ESTABLISHED = 1,
	TCP_SYN_SENT,
	TCP_SYN_RECV,
	TCP_FIN_WAIT1,
	TCP_FIN_WAIT2,
	TCP_TIME_WAIT,
	TCP_CLOSE,
	TCP_CLOSE_WAIT,
	TCP_LAST_ACK,
	TCP_LISTEN,
	TCP_CLOSING,
	TCP_NEW_SYN_RECV,
	TCP_MAX_STATES
};
#define TCPF_ESTABLISHED (1 << TCP_ESTABLISHED)
#define TCPF_SYN_SENT (1 << TCP_SYN_SENT)
#define TCPF_SYN_RECV (1 << TCP_SYN_RECV)
#define TCPF_CLOSE (1 << TCP_CLOSE)
#define TCPF_CLOSE_WAIT (1 << TCP_CLOSE_WAIT)
#define TCPF_LISTEN (1 << TCP_LISTEN)

#define RCV_SHUTDOWN 1
#define SEND_SHUTDOWN 2
#define SHUTDOWN_MASK 3
#define SOCK_DEAD 0

struct sock {
	/* the part Linux calls sock_common: addresses in network order, sk_num host order */
	u32 sk_daddr;
	u32 sk_rcv_saddr;
	u16 sk_dport;
	u16 sk_num;
	unsigned short sk_family;
	volatile unsigned char sk_state;
	struct list_head sk_node;	/* established or listening hash */
	struct list_head sk_bind_node;	/* bind hash, while it owns a port */
	atomic_t sk_refcnt;

	spinlock_t sk_lock;
	unsigned long sk_flags;
	unsigned char sk_shutdown;
	unsigned short sk_type;
	unsigned short sk_protocol;
	int sk_err;
	int sk_rcvbuf;
	int sk_rmem_alloc;
	u32 sk_ack_backlog;
	u32 sk_max_ack_backlog;
	long sk_rcvtimeo;
	struct sk_buff_head sk_receive_queue;
	wait_queue_head_t sk_wq;
	struct socket *sk_socket;
	struct proto *sk_prot;
	void (*sk_state_change)(struct sock *sk);
	void (*sk_data_ready)(struct sock *sk);
};
#define MAX_SCHEDULE_TIMEOUT (~0UL >> 1)

struct inet_sock {
	struct sock sk;
	u16 inet_sport;			/* network order */
	u32 inet_saddr;
	u16 inet_id;
	u8 tos;
	u8 ttl;
};
#define inet_daddr sk.sk_daddr
#define inet_rcv_saddr sk.sk_rcv_saddr
#define inet_dport sk.sk_dport
#define inet_num sk.sk_num
static inline struct inet_sock *inet_sk(const struct sock *sk)
{
	return (struct inet_sock *)sk;
}

struct request_sock {
	struct list_head dl_next;
	struct sock *sk;		/* the child, once created */
	u32 ir_rmt_addr, ir_loc_addr;
	u16 ir_rmt_port, ir_num;
	u32 rcv_isn, snt_isn;
	u8 num_retrans;
};

struct request_sock_queue {
	spinlock_t rskq_lock;
	struct list_head head;
	u32 qlen;
};

struct inet_connection_sock {
	struct inet_sock icsk_inet;
	struct request_sock_queue icsk_accept_queue;
	u8 icsk_ca_state;
	u8 icsk_retransmits;
	u32 icsk_rto;
	unsigned long icsk_timeout;
};
static inline struct inet_connection_sock *inet_csk(const struct sock *sk)
{
	return (struct inet_connection_sock *)sk;
}

struct tcp_sock {
	struct inet_connection_sock inet_conn;
	u32 rcv_nxt;
	u32 copied_seq;
	u32 snd_nxt;
	u32 snd_una;
	u32 rcv_wnd;
	u32 snd_wnd;
	u32 segs_in;
	u32 data_segs_in;
	u64 bytes_received;
	u64 bytes_sent;
	u64 bytes_acked;
};
static inline struct tcp_sock *tcp_sk(const struct sock *sk)
{
	return (struct tcp_sock *)sk;
}

static inline void sock_hold(struct sock *sk)
{
	atomic_inc(&sk->sk_refcnt);
}
void sk_free(struct sock *sk);
static inline void sock_put(struct sock *sk)
{
	if (atomic_dec_and_test(&sk->sk_refcnt))
		sk_free(sk);
}
static inline void lock_sock(struct sock *sk)
{
	spin_lock(&sk->sk_lock);
}
static inline void release_sock(struct sock *sk)
{
	spin_unlock(&sk->sk_lock);
}
static inline bool sk_acceptq_is_full(const struct sock *sk)
{
	return READ_ONCE(sk->sk_ack_backlog) > READ_ONCE(sk->sk_max_ack_backlog);
}
static inline long sock_rcvtimeo(const struct sock *sk, bool noblock)
{
	return noblock ? 0 : sk->sk_rcvtimeo;
}

struct sock *sk_alloc(struct net *net, int family, gfp_t priority, struct proto *prot,
		      int kern);
void sock_init_data(struct socket *sock, struct sock *sk);
void sock_def_readable(struct sock *sk);
int sock_create(int family, int type, int protocol, struct socket **res);
int __sock_create(struct net *net, int family, int type, int protocol,
		  struct socket **res, int kern);
struct socket *sock_alloc(void);
void sock_release(struct socket *sock);
struct file *sock_alloc_file(struct socket *sock, int flags, const char *dname);
struct socket *sockfd_lookup(int fd, int *err);
int __sys_socket(int family, int type, int protocol);
int __sys_bind(int fd, struct sockaddr __user *umyaddr, int addrlen);
int __sys_listen(int fd, int backlog);
int __sys_accept4(int fd, struct sockaddr __user *upeer_sockaddr,
		  int __user *upeer_addrlen, int flags);

/* inet (net/af_inet.c, net/inet_*.c) */
int inet_release(struct socket *sock);
int inet_bind(struct socket *sock, struct sockaddr *uaddr, int addr_len);
int inet_listen(struct socket *sock, int backlog);
int inet_accept(struct socket *sock, struct socket *newsock, int flags, bool kern);
int inet_getname(struct socket *sock, struct sockaddr *uaddr, int peer);
struct sock *inet_csk_accept(struct sock *sk, int flags, int *err, bool kern);
int inet_csk_listen_start(struct sock *sk);
void inet_csk_listen_stop(struct sock *sk);
int inet_csk_get_port(struct sock *sk, unsigned short snum);
struct sock *inet_csk_reqsk_queue_add(struct sock *sk, struct request_sock *req,
				      struct sock *child);
int inet_hash(struct sock *sk);
void inet_unhash(struct sock *sk);
bool inet_ehash_nolisten(struct sock *sk);
struct sock *__inet_lookup_established(u32 saddr, u16 sport, u32 daddr, u16 hnum);
struct sock *__inet_lookup_listener(struct sk_buff *skb, u32 saddr, u16 sport, u32 daddr,
				    u16 hnum);
void inet_hashinfo_init(void);

struct net_protocol {
	int (*handler)(struct sk_buff *skb);
	void (*err_handler)(struct sk_buff *skb, u32 info);
	unsigned int no_policy:1;
};
int inet_add_protocol(const struct net_protocol *prot, unsigned char num);
int ip_rcv(struct sk_buff *skb, struct net_device *dev, struct packet_type *pt,
	   struct net_device *orig_dev);
int ip_local_deliver(struct sk_buff *skb);

/* tcp */
extern struct proto tcp_prot;
int tcp_v4_rcv(struct sk_buff *skb);
int tcp_v4_do_rcv(struct sock *sk, struct sk_buff *skb);
int tcp_v4_conn_request(struct sock *sk, struct sk_buff *skb);
struct sock *tcp_create_openreq_child(const struct sock *sk, struct request_sock *req,
				      struct sk_buff *skb);
int tcp_rcv_state_process(struct sock *sk, struct sk_buff *skb);
void tcp_rcv_established(struct sock *sk, struct sk_buff *skb);
void tcp_set_state(struct sock *sk, int state);
void tcp_close(struct sock *sk, long timeout);
int tcp_v4_init_sock(struct sock *sk);
int tcp_recvmsg(struct sock *sk, char __user *buf, size_t len, int flags, int *addr_len);
int tcp_sendmsg(struct sock *sk, const char __user *buf, size_t size, int flags);
int tcp_ioctl(struct sock *sk, int cmd, unsigned long arg);
extern const char *const tcp_state_names[TCP_MAX_STATES];

#endif
