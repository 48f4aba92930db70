/* Internet checksums (RFC 1071), computed on 16-bit words as they lie in memory: the
 * one's complement sum does not care about byte order as long as it is used throughout. */
#include "net.h"

static inline u32 add32_with_carry(u32 a, u32 b)
{
	u64 s = (u64)a + b;

	return (u32)s + (u32)(s >> 32);
}

u32 csum_partial(const void *buff, int len, u32 sum)
{
	const u8 *p = buff;
	u64 acc = sum;

	while (len >= 2) {
		acc += p[0] | (p[1] << 8);
		p += 2;
		len -= 2;
	}
	if (len)
		acc += p[0];
	while (acc >> 32)
		acc = (acc & 0xffffffffu) + (acc >> 32);
	return (u32)acc;
}

u16 csum_fold(u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (u16)~sum;
}

/* The TCP/UDP checksum over the IPv4 pseudo-header plus sum (the segment's own sum);
 * 0 when a received segment is intact.  len is in host order. */
u16 csum_tcpudp_magic(u32 saddr, u32 daddr, u32 len, u8 proto, u32 sum)
{
	sum = add32_with_carry(sum, saddr);
	sum = add32_with_carry(sum, daddr);
	sum = add32_with_carry(sum, htons((u16)len) + ((u32)proto << 8));
	return csum_fold(sum);
}
