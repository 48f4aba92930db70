/* User-memory access.  Every instruction that touches user memory has an __ex_table
 * entry, so a bad pointer makes the access fail with -EFAULT instead of an oops. */
#ifndef _KPF_UACCESS_H
#define _KPF_UACCESS_H
#include "kernel.h"

/* One exception-table entry: faulting instruction, fixup, both absolute. */
struct exception_table_entry {
	unsigned long insn, fixup;
};
#define _ASM_EXTABLE(from, to) \
	".pushsection __ex_table,\"a\"\n\t.balign 8\n\t.quad " #from ", " #to "\n\t.popsection\n\t"

static inline bool access_ok(const void __user *addr, unsigned long size)
{
	unsigned long a = (unsigned long)addr;

	return size <= TASK_SIZE_MAX && a <= TASK_SIZE_MAX - size;
}

unsigned long raw_copy_from_user(void *to, const void __user *from, unsigned long n);
unsigned long raw_copy_to_user(void __user *to, const void *from, unsigned long n);
unsigned long copy_from_user(void *to, const void __user *from, unsigned long n);
unsigned long copy_to_user(void __user *to, const void *from, unsigned long n);
long strncpy_from_user(char *dst, const char __user *src, long count);
long strnlen_user(const char __user *str, long count);
unsigned long clear_user(void __user *to, unsigned long n);
int __get_user_8(u64 *val, const void __user *ptr);
int __put_user_4(u32 val, void __user *ptr);
int __put_user_8(u64 val, void __user *ptr);
long copy_from_kernel_nofault(void *dst, const void *src, size_t size);
int check_zeroed_user(const void __user *from, size_t size);

/* A struct of ksize bytes from one of usize: a shorter one is zero-filled, a longer one
 * must be zero past ksize (-E2BIG if not); 0 or -errno. */
static inline int copy_struct_from_user(void *dst, size_t ksize, const void __user *src,
					size_t usize)
{
	size_t size = usize < ksize ? usize : ksize;
	size_t rest = usize < ksize ? ksize - usize : usize - ksize;

	if (usize < ksize) {
		memset((char *)dst + size, 0, rest);
	} else if (usize > ksize) {
		int ret = check_zeroed_user((const char __user *)src + size, rest);

		if (ret <= 0)
			return ret ?: -E2BIG;
	}
	if (copy_from_user(dst, src, size))
		return -EFAULT;
	return 0;
}

#define put_user(x, ptr) \
	(sizeof(*(ptr)) == 8 ? __put_user_8((u64)(x), (ptr)) : __put_user_4((u32)(x), (ptr)))
#define get_user(x, ptr) ({ u64 __v = 0; int __e = __get_user_8(&__v, (ptr)); \
	(x) = (typeof(x))__v; __e; })

const struct exception_table_entry *search_exception_tables(unsigned long addr);
#endif
