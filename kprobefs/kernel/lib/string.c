/* String and memory helpers. */
#include "kernel.h"

void *memcpy(void *dst, const void *src, size_t n)
{
	void *ret = dst;

	size_t quads = n >> 3, tail = n & 7;

	if (n >= BULK_STRING_BYTES)
		__asm__ __volatile__("1: rep movsq\n\t" _ASM_BULK_STRING(1b)
				     : "+D"(dst), "+S"(src), "+c"(quads) : : "memory");
	else
		__asm__ __volatile__("rep movsq" : "+D"(dst), "+S"(src), "+c"(quads) : : "memory");
	__asm__ __volatile__("rep movsb" : "+D"(dst), "+S"(src), "+c"(tail) : : "memory");
	return ret;
}

/* Quadwords, then the tail: an emulated rep iteration costs the same whatever it
 * stores, and zeroing a task's stack a byte at a time was most of a fork. */
void *memset(void *s, int c, size_t n)
{
	void *ret = s;
	unsigned long pattern = 0x0101010101010101UL * (unsigned char)c;
	size_t quads = n >> 3, tail = n & 7;

	if (n >= BULK_STRING_BYTES)
		__asm__ __volatile__("1: rep stosq\n\t" _ASM_BULK_STRING(1b)
				     : "+D"(s), "+c"(quads) : "a"(pattern) : "memory");
	else
		__asm__ __volatile__("rep stosq" : "+D"(s), "+c"(quads) : "a"(pattern) : "memory");
	__asm__ __volatile__("rep stosb" : "+D"(s), "+c"(tail) : "a"(pattern) : "memory");
	return ret;
}

void *memmove(void *dst, const void *src, size_t n)
{
	unsigned char *d = dst;
	const unsigned char *s = src;

	if (d <= s || d >= s + n)
		return memcpy(dst, src, n);
	while (n--)
		d[n] = s[n];
	return dst;
}

int memcmp(const void *a, const void *b, size_t n)
{
	const unsigned char *p = a, *q = b;

	for (; n; n--, p++, q++)
		if (*p != *q)
			return *p - *q;
	return 0;
}

size_t strlen(const char *s)
{
	const char *p = s;

	while (*p)
		p++;
	return p - s;
}

size_t strnlen(const char *s, size_t max)
{
	size_t n = 0;

	while (n < max && s[n])
		n++;
	return n;
}

int strcmp(const char *a, const char *b)
{
	while (*a && *a == *b) {
		a++;
		b++;
	}
	return (unsigned char)*a - (unsigned char)*b;
}

int strncmp(const char *a, const char *b, size_t n)
{
	for (; n; n--, a++, b++) {
		if (*a != *b)
			return (unsigned char)*a - (unsigned char)*b;
		if (!*a)
			break;
	}
	return 0;
}

char *strchr(const char *s, int c)
{
	for (; *s != (char)c; s++)
		if (!*s)
			return NULL;
	return (char *)s;
}

char *strrchr(const char *s, int c)
{
	const char *last = NULL;

	do {
		if (*s == (char)c)
			last = s;
	} while (*s++);
	return (char *)last;
}

/* Copies at most size-1 bytes and always terminates; returns the length copied, or
 * -E2BIG (as size_t) when src did not fit. */
size_t strscpy(char *dst, const char *src, size_t size)
{
	size_t i;

	if (!size)
		return (size_t)-E2BIG;
	for (i = 0; i < size - 1 && src[i]; i++)
		dst[i] = src[i];
	dst[i] = 0;
	return src[i] ? (size_t)-E2BIG : i;
}
