/* The per-task descriptor table: allocation, install, lookup, close, fork and exit. */
#include "fs.h"

/* A slot handed out by get_unused_fd_flags() whose file is not installed yet. */
#define FD_RESERVED ((struct file *)1UL)

struct files_struct init_files = {
	.count = { 1 },
};

static inline bool fd_is_open(struct file *f)
{
	return f && f != FD_RESERVED;
}

static int alloc_fd(unsigned start, unsigned end, unsigned flags)
{
	struct files_struct *files = current->files;
	unsigned int fd;
	int error = -EMFILE;

	if (!files)
		return -EBADF;
	spin_lock(&files->file_lock);
	for (fd = start; fd < end && fd < NR_OPEN_DEFAULT; fd++) {
		if (!files->fd_array[fd]) {
			files->fd_array[fd] = FD_RESERVED;
			error = fd;
			break;
		}
	}
	spin_unlock(&files->file_lock);
	return error;
}

int get_unused_fd_flags(unsigned flags)
{
	return alloc_fd(0, NR_OPEN_DEFAULT, flags);
}

void put_unused_fd(unsigned int fd)
{
	struct files_struct *files = current->files;

	spin_lock(&files->file_lock);
	if (files->fd_array[fd] == FD_RESERVED)
		files->fd_array[fd] = NULL;
	spin_unlock(&files->file_lock);
}

/* Publishes file at a reserved fd; the table takes over the caller's reference. */
void fd_install(unsigned int fd, struct file *file)
{
	struct files_struct *files = current->files;

	spin_lock(&files->file_lock);
	BUG_ON(files->fd_array[fd] != FD_RESERVED);
	files->fd_array[fd] = file;
	spin_unlock(&files->file_lock);
}

/* The file at fd with a new reference, or NULL. */
static struct file *__fget_files(struct files_struct *files, unsigned int fd)
{
	struct file *file = NULL;

	if (!files || fd >= NR_OPEN_DEFAULT)
		return NULL;
	spin_lock(&files->file_lock);
	file = files->fd_array[fd];
	if (fd_is_open(file))
		get_file(file);
	else
		file = NULL;
	spin_unlock(&files->file_lock);
	return file;
}

struct file *fget(unsigned int fd)
{
	return __fget_files(current->files, fd);
}

/* Takes fd out of the table; returns its file (reference now the caller's) or NULL. */
static struct file *pick_file(struct files_struct *files, unsigned fd)
{
	struct file *file;

	if (fd >= NR_OPEN_DEFAULT)
		return NULL;
	spin_lock(&files->file_lock);
	file = files->fd_array[fd];
	if (fd_is_open(file))
		files->fd_array[fd] = NULL;
	else
		file = NULL;
	spin_unlock(&files->file_lock);
	return file;
}

int filp_close(struct file *filp, fl_owner_t id)
{
	if (!atomic_read(&filp->f_count)) {
		pr_err("VFS: Close: file count is 0\n");
		return 0;
	}
	fput(filp);
	return 0;
}

int close_fd(unsigned int fd)
{
	struct files_struct *files = current->files;
	struct file *file;

	if (!files)
		return -EBADF;
	file = pick_file(files, fd);
	if (!file)
		return -EBADF;
	return filp_close(file, files);
}

/* A copy of oldf for a child: every open file gets one more reference. */
struct files_struct *dup_fd(struct files_struct *oldf, int *errorp)
{
	struct files_struct *newf;
	unsigned int i;

	newf = kzalloc(sizeof(*newf), GFP_KERNEL);
	if (!newf) {
		*errorp = -ENOMEM;
		return NULL;
	}
	atomic_set(&newf->count, 1);
	spin_lock(&oldf->file_lock);
	for (i = 0; i < NR_OPEN_DEFAULT; i++) {
		struct file *f = oldf->fd_array[i];

		if (fd_is_open(f))
			newf->fd_array[i] = get_file(f);
	}
	spin_unlock(&oldf->file_lock);
	*errorp = 0;
	return newf;
}

static void close_files(struct files_struct *files)
{
	unsigned int i;

	for (i = 0; i < NR_OPEN_DEFAULT; i++) {
		struct file *file = pick_file(files, i);

		if (file)
			filp_close(file, files);
	}
}

static void put_files_struct(struct files_struct *files)
{
	if (atomic_dec_and_test(&files->count)) {
		close_files(files);
		if (files != &init_files)
			kfree(files);
	}
}

void exit_files(struct task_struct *tsk)
{
	struct files_struct *files = tsk->files;

	if (files) {
		tsk->files = NULL;
		put_files_struct(files);
	}
}
