/* Number parsing, hashing and checksums. */
#include "kernel.h"

static int _parse_integer_digit(char c, unsigned int base)
{
	unsigned int v;

	if (c >= '0' && c <= '9')
		v = c - '0';
	else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
		v = (c | 0x20) - 'a' + 10;
	else
		return -1;
	return v < base ? (int)v : -1;
}

unsigned long simple_strtoul(const char *cp, char **endp, unsigned int base)
{
	unsigned long result = 0;
	int d;

	if (!base) {
		base = 10;
		if (cp[0] == '0') {
			base = 8;
			if ((cp[1] | 0x20) == 'x') {
				base = 16;
				cp += 2;
			}
		}
	}
	while ((d = _parse_integer_digit(*cp, base)) >= 0) {
		result = result * base + d;
		cp++;
	}
	if (endp)
		*endp = (char *)cp;
	return result;
}

/* kstrtol: the whole string (one trailing newline allowed) must be a number. */
int kstrtol(const char *s, unsigned int base, long *res)
{
	char *end;
	int neg = 0;
	unsigned long v;

	if (*s == '-') {
		neg = 1;
		s++;
	} else if (*s == '+') {
		s++;
	}
	if (_parse_integer_digit(*s, base ? base : 16) < 0)
		return -EINVAL;
	v = simple_strtoul(s, &end, base);
	if (*end == '\n')
		end++;
	if (*end)
		return -EINVAL;
	*res = neg ? -(long)v : (long)v;
	return 0;
}

#define rol32(w, s) (((w) << (s)) | ((w) >> (32 - (s))))
#define __jhash_mix(a, b, c) { \
	a -= c; a ^= rol32(c, 4); c += b; b -= a; b ^= rol32(a, 6); a += c; \
	c -= b; c ^= rol32(b, 8); b += a; a -= c; a ^= rol32(c, 16); c += b; \
	b -= a; b ^= rol32(a, 19); a += c; c -= b; c ^= rol32(b, 4); b += a; }
#define __jhash_final(a, b, c) { \
	c ^= b; c -= rol32(b, 14); a ^= c; a -= rol32(c, 11); b ^= a; b -= rol32(a, 25); \
	c ^= b; c -= rol32(b, 16); a ^= c; a -= rol32(c, 4); b ^= a; b -= rol32(a, 14); \
	c ^= b; c -= rol32(b, 24); }

/* Bob Jenkins' lookup3 hash over length bytes. */
u32 jhash(const void *key, u32 length, u32 initval)
{
	const u8 *k = key;
	u32 a, b, c;

	a = b = c = 0xdeadbeef + length + initval;
	while (length > 12) {
		a += k[0] | k[1] << 8 | k[2] << 16 | (u32)k[3] << 24;
		b += k[4] | k[5] << 8 | k[6] << 16 | (u32)k[7] << 24;
		c += k[8] | k[9] << 8 | k[10] << 16 | (u32)k[11] << 24;
		__jhash_mix(a, b, c);
		length -= 12;
		k += 12;
	}
	switch (length) {
	case 12: c += (u32)k[11] << 24; /* fall through */
	case 11: c += k[10] << 16; /* fall through */
	case 10: c += k[9] << 8; /* fall through */
	case 9: c += k[8]; /* fall through */
	case 8: b += (u32)k[7] << 24; /* fall through */
	case 7: b += k[6] << 16; /* fall through */
	case 6: b += k[5] << 8; /* fall through */
	case 5: b += k[4]; /* fall through */
	case 4: a += (u32)k[3] << 24; /* fall through */
	case 3: a += k[2] << 16; /* fall through */
	case 2: a += k[1] << 8; /* fall through */
	case 1: a += k[0];
		__jhash_final(a, b, c);
		break;
	case 0:
		break;
	}
	return c;
}

/* The IPv4 header checksum over ihl 32-bit words; 0 means the header is intact. */
u16 ip_fast_csum(const void *iph, unsigned int ihl)
{
	const u16 *p = iph;
	u32 sum = 0;
	unsigned int i;

	for (i = 0; i < ihl * 2; i++)
		sum += p[i];
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return (u16)~sum;
}

u32 crc32_le(u32 crc, const u8 *p, size_t len)
{
	int i;

	while (len--) {
		crc ^= *p++;
		for (i = 0; i < 8; i++)
			crc = (crc >> 1) ^ (crc & 1 ? 0xedb88320 : 0);
	}
	return crc;
}
