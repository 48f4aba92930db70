/* printk: records go into log_buf, a ring of text lines, each "<level>[seconds] text".
 * The host reads it by symbol (dmesg, without the levels) and gets each line for its
 * own log too; /dev/kmsg (devkmsg_fops) reads it one record at a time, as Linux's does:
 * "level,sequence,microseconds,-;text". */
#include "sched.h"
#include "fs.h"
#include "uaccess.h"

#define LOG_BUF_LEN (64 * 1024)
char log_buf[LOG_BUF_LEN] __aligned(64);
unsigned long log_next;		/* total bytes ever written; the ring holds the last LOG_BUF_LEN */
unsigned long log_first;	/* where the oldest whole line starts (a total-byte offset) */
u64 log_first_seq;		/* and its sequence number */
u64 log_next_seq;		/* the sequence number of the next line */
int console_loglevel = 7;
static DEFINE_SPINLOCK(logbuf_lock);

static char log_char(unsigned long pos)
{
	return log_buf[pos % LOG_BUF_LEN];
}

/* Drops whole lines from the front until len more bytes fit; caller holds logbuf_lock. */
static void log_make_room(size_t len)
{
	while (log_next + len - log_first > LOG_BUF_LEN) {
		while (log_first < log_next && log_char(log_first) != '\n')
			log_first++;
		log_first++;
		log_first_seq++;
	}
}

static void log_store(const char *text, size_t len)
{
	size_t i;

	for (i = 0; i < len; i++)
		log_buf[(log_next + i) % LOG_BUF_LEN] = text[i];
	log_next += len;
}

/* The console (the host's log): as Linux's, whoever holds console_lock prints every
 * record not printed yet, in console_unlock(); a printk that finds the console taken
 * leaves its record to the holder (console_trylock), so printk never waits on it, in
 * an interrupt either. */
static int console_locked;
static unsigned long console_pos;	/* the next unprinted byte of log_buf */
static u64 console_seq;			/* and its record's sequence number */

int console_trylock(void)
{
	return !__atomic_exchange_n(&console_locked, 1, __ATOMIC_ACQUIRE);
}

/* Copies the record at console_pos (its text, without "<level>[seconds] ") and its
 * level; caller holds logbuf_lock and the console. */
static int console_next_record(char *text, int size, int *level)
{
	unsigned long pos = console_pos;
	int n = 0;

	if (pos < log_first) {			/* overwritten meanwhile: skip what is gone */
		pos = log_first;
		console_seq = log_first_seq;
	}
	*level = log_char(pos + 1) - '0';
	while (pos < log_next && log_char(pos) != ']')
		pos++;
	pos += 2;				/* "] " */
	while (pos < log_next && log_char(pos) != '\n') {
		if (n < size - 1)
			text[n++] = log_char(pos);
		pos++;
	}
	console_pos = pos + 1;
	console_seq++;
	return n;
}

noinline void console_unlock(void)
{
	char text[256];
	int n, level;

again:
	for (;;) {
		spin_lock(&logbuf_lock);
		if (console_seq >= log_next_seq) {
			spin_unlock(&logbuf_lock);
			break;
		}
		n = console_next_record(text, sizeof(text), &level);
		spin_unlock(&logbuf_lock);
		hypercall(HC_CONSOLE, text, n, level, 0);
	}
	__atomic_store_n(&console_locked, 0, __ATOMIC_RELEASE);
	/* a record stored after the check above, whose printk found the console taken */
	if (READ_ONCE(console_seq) < READ_ONCE(log_next_seq) && console_trylock())
		goto again;
}

static int printk_get_level(const char *buffer)
{
	if (buffer[0] == '<' && buffer[1] >= '0' && buffer[1] <= '7' && buffer[2] == '>')
		return buffer[1] - '0';
	return -1;
}

#define DEFAULT_MESSAGE_LOGLEVEL 4

static int vprintk_level(int level, const char *fmt, __builtin_va_list args)
{
	char line[256];
	char prefix[40];
	u64 ts = ktime_get_ns();
	int n, p;

	n = vsnprintf(line, sizeof(line), fmt, args);
	if (n >= (int)sizeof(line))
		n = sizeof(line) - 1;
	if (n && line[n - 1] == '\n')
		n--;
	p = snprintf(prefix, sizeof(prefix), "<%d>[%5lu.%06lu] ", level,
		     (unsigned long)(ts / 1000000000), (unsigned long)(ts % 1000000000) / 1000);
	spin_lock(&logbuf_lock);
	log_make_room(p + n + 1);
	log_store(prefix, p);
	log_store(line, n);
	log_store("\n", 1);
	log_next_seq++;
	spin_unlock(&logbuf_lock);
	if (console_trylock())
		console_unlock();
	return n;
}

int vprintk(const char *fmt, __builtin_va_list args)
{
	int level = printk_get_level(fmt);

	if (level >= 0)
		fmt += 3;
	return vprintk_level(level < 0 ? DEFAULT_MESSAGE_LOGLEVEL : level, fmt, args);
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

static int printk_level_plain(int level, const char *fmt, ...)
{
	__builtin_va_list args;
	int r;

	__builtin_va_start(args, fmt);
	r = vprintk_level(level, fmt, args);
	__builtin_va_end(args);
	return r;
}

/* ---- /dev/kmsg ------------------------------------------------------------------ */

struct devkmsg_user {
	unsigned long pos;	/* the next record to read (a total-byte offset) */
	u64 seq;		/* and its sequence number */
};

static int devkmsg_open(struct inode *inode, struct file *file)
{
	struct devkmsg_user *user = kmalloc(sizeof(*user), GFP_KERNEL);

	if (!user)
		return -ENOMEM;
	spin_lock(&logbuf_lock);
	user->pos = log_first;
	user->seq = log_first_seq;
	spin_unlock(&logbuf_lock);
	file->private_data = user;
	return 0;
}

static int devkmsg_release(struct inode *inode, struct file *file)
{
	kfree(file->private_data);
	file->private_data = NULL;
	return 0;
}

/* One record a read, as Linux: -EINVAL when it does not fit, -EPIPE once when records
 * were overwritten before they were read.  At the end of the log a read returns 0 (or
 * -EAGAIN with O_NONBLOCK): this kernel has no signals to end a read that waits for
 * the next message, and a FUSE request must not sleep without a bound. */
static ssize_t devkmsg_read(struct file *file, char __user *buf, size_t count,
			    loff_t *ppos)
{
	struct devkmsg_user *user = file->private_data;
	char line[320], record[400];
	unsigned long pos, sec = 0, usec = 0;
	int level = DEFAULT_MESSAGE_LOGLEVEL;
	size_t n = 0, len;
	u64 seq;
	char *text;

	spin_lock(&logbuf_lock);
	if (user->pos < log_first) {
		user->pos = log_first;
		user->seq = log_first_seq;
		spin_unlock(&logbuf_lock);
		return -EPIPE;
	}
	if (user->pos >= log_next) {
		spin_unlock(&logbuf_lock);
		return (file->f_flags & O_NONBLOCK) ? -EAGAIN : 0;
	}
	for (pos = user->pos; pos < log_next && log_char(pos) != '\n'; pos++)
		if (n < sizeof(line) - 1)
			line[n++] = log_char(pos);
	line[n] = '\0';
	seq = user->seq;
	spin_unlock(&logbuf_lock);

	text = line;
	if (text[0] == '<' && text[1] >= '0' && text[1] <= '7' && text[2] == '>') {
		level = text[1] - '0';
		text += 3;
	}
	if (*text == '[') {
		for (text++; *text == ' '; text++)
			;
		for (; *text >= '0' && *text <= '9'; text++)
			sec = sec * 10 + (*text - '0');
		if (*text == '.')
			for (text++; *text >= '0' && *text <= '9'; text++)
				usec = usec * 10 + (*text - '0');
		if (*text == ']')
			text++;
		if (*text == ' ')
			text++;
	}
	len = snprintf(record, sizeof(record), "%d,%llu,%lu,-;%s\n", level,
		       (unsigned long long)seq, sec * 1000000 + usec, text);
	if (len >= sizeof(record))
		len = sizeof(record) - 1;
	if (len > count)
		return -EINVAL;
	if (copy_to_user(buf, record, len))
		return -EFAULT;
	user->pos = pos + 1;
	user->seq = seq + 1;
	return len;
}

/* A message from user space: "<level>text" (level 0-7, default 4), one line. */
static ssize_t devkmsg_write(struct file *file, const char __user *buf, size_t count,
			     loff_t *ppos)
{
	char line[200];
	size_t len = min(count, sizeof(line) - 1);
	char *text = line;
	int level;

	if (copy_from_user(line, buf, len))
		return -EFAULT;
	line[len] = '\0';
	if (len && line[len - 1] == '\n')
		line[len - 1] = '\0';
	level = printk_get_level(line);
	if (level >= 0)
		text += 3;
	else
		level = DEFAULT_MESSAGE_LOGLEVEL;
	printk_level_plain(level, "%s", text);
	return count;
}

static loff_t devkmsg_llseek(struct file *file, loff_t offset, int whence)
{
	struct devkmsg_user *user = file->private_data;

	if (offset)
		return -ESPIPE;
	spin_lock(&logbuf_lock);
	switch (whence) {
	case SEEK_SET:
		user->pos = log_first;
		user->seq = log_first_seq;
		break;
	case SEEK_END:
	case SEEK_DATA:
		user->pos = log_next;
		user->seq = log_next_seq;
		break;
	default:
		spin_unlock(&logbuf_lock);
		return -EINVAL;
	}
	spin_unlock(&logbuf_lock);
	return 0;
}

const struct file_operations devkmsg_fops = {
	.open = devkmsg_open,
	.release = devkmsg_release,
	.read = devkmsg_read,
	.write = devkmsg_write,
	.llseek = devkmsg_llseek,
};
