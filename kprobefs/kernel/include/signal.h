/* Signals: numbers, actions, and what a task has pending (Linux 6.1's x86_64 ABI). */
#ifndef _KPF_SIGNAL_H
#define _KPF_SIGNAL_H
#include "kernel.h"

#define _NSIG 64
#define SIGHUP 1
#define SIGINT 2
#define SIGQUIT 3
#define SIGKILL 9
#define SIGUSR1 10
#define SIGTERM 15
#define SIGCHLD 17
#define SIGCONT 18
#define SIGSTOP 19
#define SIGTSTP 20
#define SIGTTIN 21
#define SIGTTOU 22
#define SIGURG 23
#define SIGWINCH 28

#define SIG_DFL 0UL
#define SIG_IGN 1UL
#define SA_RESETHAND 0x80000000UL

/* si_code values (include/uapi/asm-generic/siginfo.h). */
#define SI_USER 0
#define SI_KERNEL 0x80
#define SI_TKILL (-6)
#define CLD_EXITED 1
#define CLD_KILLED 2
#define CLD_DUMPED 3

/* The user's struct sigaction, as x86_64's rt_sigaction takes it. */
struct sigaction {
	unsigned long sa_handler;
	unsigned long sa_flags;
	unsigned long sa_restorer;
	u64 sa_mask;
};
struct k_sigaction {
	struct sigaction sa;
};

/* The parts of a siginfo the signal events report. */
struct kernel_siginfo {
	int si_signo;
	int si_errno;
	int si_code;
	pid_t si_pid;
};
/* Not pointers: a signal sent without a siginfo (SI_USER) or from the kernel. */
#define SEND_SIG_NOINFO ((struct kernel_siginfo *)0)
#define SEND_SIG_PRIV ((struct kernel_siginfo *)1)

/* What a task has pending: one entry per signal (the legacy, non-queueing kind). */
struct sigpending {
	u64 signal;
	int host_exit;		/* the host's process died of a signal: this wait status */
	struct kernel_siginfo info[_NSIG];
};

struct task_struct;
int send_signal_info(int sig, struct kernel_siginfo *info, struct task_struct *t,
		     bool group);
void flush_signal_handlers(struct task_struct *t);
void exit_to_user_mode(void);
long host_task_killed(pid_t pid, int status);
static inline bool host_exit_pending(const struct sigpending *pending)
{
	return pending->host_exit != 0;
}
#endif
