/* trace_printk() (include/trace_printk.h): records of the ftrace system's print,
 * bprint and bputs types, written into the top trace array by the kernel's recorder
 * (trace_native.c).  The host sets each type's TNP_RECORD while tracing is on there
 * (and options/trace_printk is set).  Formatting uses a buffer per CPU and nesting
 * level (6.1's get_trace_buf), so an interrupt that prints while process context is
 * formatting takes the next one; interrupts stay as the caller had them, which the
 * record's flags show. */
#include "hardirq.h"
#include "tracepoint.h"
#include "trace_native.h"
#include "trace_printk.h"

#define TRACE_PRINT 5
#define TRACE_BPRINT 6
#define TRACE_BPUTS 14
#define TRACE_BUF_SIZE 1024

struct trace_native_probe trace_print_tp = { .type = TRACE_PRINT };
struct trace_native_probe trace_bprint_tp = { .type = TRACE_BPRINT };
struct trace_native_probe trace_bputs_tp = { .type = TRACE_BPUTS };

#define TRACE_BUF_NEST 4	/* process, softirq, hardirq, NMI */

struct trace_buffer_struct {
	int nesting;
	char buffer[TRACE_BUF_NEST][TRACE_BUF_SIZE] __aligned(8);
};
static struct trace_buffer_struct trace_printk_bufs[NR_CPUS];

static char *get_trace_buf(void)
{
	struct trace_buffer_struct *b = &trace_printk_bufs[smp_processor_id()];

	if (b->nesting >= TRACE_BUF_NEST)
		return NULL;
	b->nesting++;
	barrier();
	return b->buffer[b->nesting - 1];
}

static void put_trace_buf(void)
{
	barrier();
	trace_printk_bufs[smp_processor_id()].nesting--;
}

/* Where the module loader keeps a copy of each format a module brings (6.1's
 * hold_module_trace_bprintk_format kmallocs them): never freed, so the records that
 * point at them stay readable after the module goes. */
char trace_bprintk_fmt_area[16384] __aligned(8);

struct print_entry {
	struct trace_entry ent;
	unsigned long ip;
	char buf[];
};
struct bprint_entry {
	struct trace_entry ent;
	unsigned long ip;
	const char *fmt;
	u32 buf[];
};
struct bputs_entry {
	struct trace_entry ent;
	unsigned long ip;
	const char *str;
};

/* ---- vbin_printf: the arguments a format converts, in binary, as 6.1 packs them: an
 * integer of under 8 bytes at its own alignment, one of 8 bytes as two u32s, a string's
 * bytes and its NUL; returns the u32 words used. */
static bool is_alnum(char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

#define SAVE(type, value) do {						\
	type __v = (type)(value);					\
	str = (char *)ALIGN((unsigned long)str, sizeof(type) < 8 ? sizeof(type) : 4); \
	if (str + sizeof(type) <= end)					\
		memcpy(str, &__v, sizeof(type));			\
	str += sizeof(type);						\
} while (0)

/* A width or a precision: `*` takes an int argument, digits none. */
#define SKIP_FIELD() do {						\
	if (*fmt == '*') {						\
		SAVE(int, __builtin_va_arg(args, int));			\
		fmt++;							\
	}								\
	while (*fmt >= '0' && *fmt <= '9')				\
		fmt++;							\
} while (0)

static u32 vbin_printf(u32 *bin_buf, size_t size, const char *fmt, __builtin_va_list args)
{
	char *str = (char *)bin_buf, *end = (char *)(bin_buf + size);

	while (*fmt) {
		int qualifier = 0;

		if (*fmt++ != '%')
			continue;
		if (*fmt == '%') {
			fmt++;
			continue;
		}
		while (*fmt == '-' || *fmt == '+' || *fmt == ' ' || *fmt == '#' || *fmt == '0')
			fmt++;
		SKIP_FIELD();		/* width */
		if (*fmt == '.') {
			fmt++;
			SKIP_FIELD();	/* precision */
		}
		if (*fmt == 'h' || *fmt == 'l' || *fmt == 'z' || *fmt == 't' || *fmt == 'L') {
			qualifier = *fmt++;
			if (qualifier == *fmt) {	/* hh, ll */
				qualifier = qualifier == 'h' ? 'H' : 'L';
				fmt++;
			}
		}
		switch (*fmt++) {
		case 'c':
			SAVE(char, __builtin_va_arg(args, int));
			break;
		case 's': {
			const char *s = __builtin_va_arg(args, const char *);
			size_t len;

			if ((unsigned long)s < PAGE_SIZE)
				s = "(null)";
			len = strlen(s) + 1;
			if (str + len < end)
				memcpy(str, s, len);
			str += len;
			break;
		}
		case 'p':
			SAVE(unsigned long, __builtin_va_arg(args, void *));
			while (is_alnum(*fmt))
				fmt++;
			break;
		case 'd': case 'i': case 'u': case 'x': case 'X': case 'o':
			switch (qualifier) {
			case 'L': case 'l': case 'z': case 't':
				SAVE(unsigned long, __builtin_va_arg(args, unsigned long));
				break;
			case 'h':
				SAVE(short, __builtin_va_arg(args, int));
				break;
			case 'H':
				SAVE(char, __builtin_va_arg(args, int));
				break;
			default:
				SAVE(int, __builtin_va_arg(args, int));
			}
			break;
		case '\0':
			fmt--;
			break;
		default:
			break;
		}
	}
	return (u32 *)ALIGN((unsigned long)str, sizeof(u32)) - bin_buf;
}

int __trace_bprintk(unsigned long ip, const char *fmt, ...)
{
	struct trace_event_buffer fb;
	struct bprint_entry *entry;
	__builtin_va_list args;
	u32 *buf, len;

	if (!fmt || !(READ_ONCE(trace_bprint_tp.flags) & TNP_RECORD))
		return 0;
	buf = (u32 *)get_trace_buf();
	if (!buf)
		return 0;
	__builtin_va_start(args, fmt);
	len = vbin_printf(buf, TRACE_BUF_SIZE / sizeof(u32), fmt, args);
	__builtin_va_end(args);
	if (len > TRACE_BUF_SIZE / sizeof(u32))
		goto out;
	entry = trace_buffer_lock_reserve(&fb, &trace_bprint_tp, sizeof(*entry) + sizeof(u32) * len);
	if (entry) {
		entry->ip = ip;
		entry->fmt = fmt;
		memcpy(entry->buf, buf, sizeof(u32) * len);
		trace_event_buffer_commit(&fb);
	}
out:
	put_trace_buf();
	return len;
}

static int trace_print_record(unsigned long ip, const char *text, int len, bool newline)
{
	struct trace_event_buffer fb;
	struct print_entry *entry;

	entry = trace_buffer_lock_reserve(&fb, &trace_print_tp, sizeof(*entry) + len + 2);
	if (!entry)
		return 0;
	entry->ip = ip;
	memcpy(entry->buf, text, len);
	if (newline && (!len || text[len - 1] != '\n'))	/* __trace_puts adds one */
		entry->buf[len++] = '\n';
	entry->buf[len] = 0;
	fb.len = sizeof(*entry) - sizeof(entry->ent) + len + 1;
	trace_event_buffer_commit(&fb);
	return len;
}

int __trace_printk(unsigned long ip, const char *fmt, ...)
{
	__builtin_va_list args;
	char *buf;
	int len;

	if (!(READ_ONCE(trace_print_tp.flags) & TNP_RECORD))
		return 0;
	buf = get_trace_buf();
	if (!buf)
		return 0;
	__builtin_va_start(args, fmt);
	len = vsnprintf(buf, TRACE_BUF_SIZE, fmt, args);
	__builtin_va_end(args);
	if (len >= TRACE_BUF_SIZE)
		len = TRACE_BUF_SIZE - 1;
	len = trace_print_record(ip, buf, len, false);
	put_trace_buf();
	return len;
}

int __trace_puts(unsigned long ip, const char *str, int size)
{
	if (!(READ_ONCE(trace_print_tp.flags) & TNP_RECORD))
		return 0;
	if (size > TRACE_BUF_SIZE - 2)
		size = TRACE_BUF_SIZE - 2;
	return trace_print_record(ip, str, size, true);
}

int __trace_bputs(unsigned long ip, const char *str)
{
	struct trace_event_buffer fb;
	struct bputs_entry *entry;

	if (!(READ_ONCE(trace_bputs_tp.flags) & TNP_RECORD))
		return 0;
	entry = trace_buffer_lock_reserve(&fb, &trace_bputs_tp, sizeof(*entry));
	if (!entry)
		return 0;
	entry->ip = ip;
	entry->str = str;
	trace_event_buffer_commit(&fb);
	return 1;
}
