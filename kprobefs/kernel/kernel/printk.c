/* printk: records go into log_buf, a ring the host reads by symbol ("dmesg"), each line
 * prefixed with its timestamp; the host also gets each line for its own log. */
#include "sched.h"

#define LOG_BUF_LEN (64 * 1024)
char log_buf[LOG_BUF_LEN] __aligned(64);
unsigned long log_next;		/* total bytes ever written; the ring holds the last LOG_BUF_LEN */
int console_loglevel = 7;
static DEFINE_SPINLOCK(logbuf_lock);

static void log_store(const char *text, size_t len)
{
	size_t i;

	for (i = 0; i < len; i++)
		log_buf[(log_next + i) % LOG_BUF_LEN] = text[i];
	log_next += len;
}

static int printk_get_level(const char *buffer)
{
	if (buffer[0] == '<' && buffer[1] >= '0' && buffer[1] <= '7' && buffer[2] == '>')
		return buffer[1] - '0';
	return -1;
}

int vprintk(const char *fmt, __builtin_va_list args)
{
	char line[256];
	char prefix[32];
	int level = printk_get_level(fmt);
	u64 ts = ktime_get_ns();
	int n, p;

	if (level >= 0)
		fmt += 3;
	n = vsnprintf(line, sizeof(line), fmt, args);
	if (n >= (int)sizeof(line))
		n = sizeof(line) - 1;
	p = snprintf(prefix, sizeof(prefix), "[%5lu.%06lu] ", (unsigned long)(ts / 1000000000),
		     (unsigned long)(ts % 1000000000) / 1000);
	spin_lock(&logbuf_lock);
	log_store(prefix, p);
	log_store(line, n);
	if (n && line[n - 1] != '\n')
		log_store("\n", 1);
	spin_unlock(&logbuf_lock);
	hypercall(HC_CONSOLE, line, n, level < 0 ? 4 : level, 0);
	return n;
}

int printk(const char *fmt, ...)
{
	__builtin_va_list args;
	int r;

	__builtin_va_start(args, fmt);
	r = vprintk(fmt, args);
	__builtin_va_end(args);
	return r;
}
