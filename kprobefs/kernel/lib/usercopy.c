/* The user-copy primitives.  Each is a loop around one faulting instruction whose
 * exception-table fixup leaves the loop with the count of bytes not copied. */
#include "uaccess.h"

/* Copies n bytes with `rep movsb`; returns the number of bytes left uncopied. */
/* Quadwords first, then the tail (copy_user_generic_string's way): an emulated rep
 * iteration costs the same whatever it moves.  A fault leaves what was not copied. */
static noinline unsigned long copy_user_generic(void *to, const void *from, unsigned long n)
{
	unsigned long quads = n >> 3, tail = n & 7;

	if (n >= BULK_STRING_BYTES)
		__asm__ __volatile__(
			"1:	rep movsq\n"
			"2:\n"
			_ASM_EXTABLE(1b, 2b)
			_ASM_BULK_STRING(1b)
			: "+c"(quads), "+D"(to), "+S"(from)
			:
			: "memory");
	else
		__asm__ __volatile__(
			"1:	rep movsq\n"
			"2:\n"
			_ASM_EXTABLE(1b, 2b)
			: "+c"(quads), "+D"(to), "+S"(from)
			:
			: "memory");
	if (unlikely(quads))
		return quads * 8 + tail;
	__asm__ __volatile__(
		"1:	rep movsb\n"
		"2:\n"
		_ASM_EXTABLE(1b, 2b)
		: "+c"(tail), "+D"(to), "+S"(from)
		:
		: "memory");
	return tail;
}

unsigned long raw_copy_from_user(void *to, const void __user *from, unsigned long n)
{
	return copy_user_generic(to, (__force const void *)from, n);
}

unsigned long raw_copy_to_user(void __user *to, const void *from, unsigned long n)
{
	return copy_user_generic((__force void *)to, from, n);
}

unsigned long copy_from_user(void *to, const void __user *from, unsigned long n)
{
	unsigned long res = n;

	if (likely(access_ok(from, n)))
		res = raw_copy_from_user(to, from, n);
	if (unlikely(res))
		memset((char *)to + (n - res), 0, res);
	return res;
}

unsigned long copy_to_user(void __user *to, const void *from, unsigned long n)
{
	if (likely(access_ok(to, n)))
		return raw_copy_to_user(to, from, n);
	return n;
}

unsigned long clear_user(void __user *to, unsigned long n)
{
	if (!access_ok(to, n))
		return n;
	if (n >= BULK_STRING_BYTES)
		__asm__ __volatile__(
			"1:	rep stosb\n"
			"2:\n"
			_ASM_EXTABLE(1b, 2b)
			_ASM_BULK_STRING(1b)
			: "+c"(n), "+D"(to)
			: "a"(0)
			: "memory");
	else
		__asm__ __volatile__(
			"1:	rep stosb\n"
			"2:\n"
			_ASM_EXTABLE(1b, 2b)
			: "+c"(n), "+D"(to)
			: "a"(0)
			: "memory");
	return n;
}

/* Reads one byte of user memory; returns 0, or -EFAULT with *val untouched. */
static __always_inline int get_user_byte(char *val, const char __user *p)
{
	int err = 0;
	char c;

	__asm__ __volatile__(
		"1:	movb (%2), %1\n"
		"2:\n"
		".pushsection .text.unlikely\n"
		"3:	movl %3, %0\n"
		"	jmp 2b\n"
		".popsection\n"
		_ASM_EXTABLE(1b, 3b)
		: "+r"(err), "=q"(c)
		: "r"(p), "i"(-EFAULT));
	*val = c;
	return err;
}

/* Copies a NUL-terminated string of at most count bytes; returns its length (count if no
 * NUL was found) or -EFAULT. */
long strncpy_from_user(char *dst, const char __user *src, long count)
{
	long res = 0;

	if (count <= 0)
		return 0;
	if (!access_ok(src, 1))
		return -EFAULT;
	while (res < count) {
		char c;

		if ((unsigned long)(src + res) >= TASK_SIZE_MAX)
			return -EFAULT;
		if (get_user_byte(&c, src + res))
			return -EFAULT;
		dst[res] = c;
		if (!c)
			return res;
		res++;
	}
	return res;
}

/* 1 if the size bytes at from are all zero, 0 if one is not, -EFAULT. */
int check_zeroed_user(const void __user *from, size_t size)
{
	const char __user *p = from;
	size_t i;

	if (!access_ok(from, size))
		return -EFAULT;
	for (i = 0; i < size; i++) {
		char c;

		if (get_user_byte(&c, p + i))
			return -EFAULT;
		if (c)
			return 0;
	}
	return 1;
}

long strnlen_user(const char __user *str, long count)
{
	long n;

	for (n = 0; n < count; n++) {
		char c;

		if (get_user_byte(&c, str + n))
			return 0;
		if (!c)
			return n + 1;
	}
	return count + 1;
}

int __get_user_8(u64 *val, const void __user *ptr)
{
	int err = 0;
	u64 v = 0;

	if (!access_ok(ptr, 8))
		return -EFAULT;
	__asm__ __volatile__(
		"1:	movq (%2), %1\n"
		"2:\n"
		".pushsection .text.unlikely\n"
		"3:	movl %3, %0\n"
		"	jmp 2b\n"
		".popsection\n"
		_ASM_EXTABLE(1b, 3b)
		: "+r"(err), "+r"(v)
		: "r"(ptr), "i"(-EFAULT));
	*val = v;
	return err;
}

int __put_user_8(u64 val, void __user *ptr)
{
	int err = 0;

	if (!access_ok(ptr, 8))
		return -EFAULT;
	__asm__ __volatile__(
		"1:	movq %1, (%2)\n"
		"2:\n"
		".pushsection .text.unlikely\n"
		"3:	movl %3, %0\n"
		"	jmp 2b\n"
		".popsection\n"
		_ASM_EXTABLE(1b, 3b)
		: "+r"(err)
		: "r"(val), "r"(ptr), "i"(-EFAULT)
		: "memory");
	return err;
}

int __put_user_4(u32 val, void __user *ptr)
{
	int err = 0;

	if (!access_ok(ptr, 4))
		return -EFAULT;
	__asm__ __volatile__(
		"1:	movl %1, (%2)\n"
		"2:\n"
		".pushsection .text.unlikely\n"
		"3:	movl %3, %0\n"
		"	jmp 2b\n"
		".popsection\n"
		_ASM_EXTABLE(1b, 3b)
		: "+r"(err)
		: "r"(val), "r"(ptr), "i"(-EFAULT)
		: "memory");
	return err;
}

/* Reads kernel memory that may be unmapped; returns 0 or -EFAULT. */
long copy_from_kernel_nofault(void *dst, const void *src, size_t size)
{
	if ((unsigned long)src < TASK_SIZE_MAX)
		return -EFAULT;
	return copy_user_generic(dst, src, size) ? -EFAULT : 0;
}
