/* System call numbers (x86_64 ABI) and prototypes. */
#ifndef _KPF_SYSCALLS_H
#define _KPF_SYSCALLS_H
#include "sched.h"

#define __NR_read 0
#define __NR_write 1
#define __NR_open 2
#define __NR_close 3
#define __NR_stat 4
#define __NR_lseek 8
#define __NR_pread64 17
#define __NR_pwrite64 18
#define __NR_rt_sigaction 13
#define __NR_getpid 39
#define __NR_socket 41
#define __NR_accept 43
#define __NR_bind 49
#define __NR_listen 50
#define __NR_clone 56
#define __NR_fork 57
#define __NR_execve 59
#define __NR_exit 60
#define __NR_kill 62
#define __NR_wait4 61
#define __NR_uname 63
#define __NR_getcwd 79
#define __NR_chdir 80
#define __NR_mkdir 83
#define __NR_rmdir 84
#define __NR_unlink 87
#define __NR_symlink 88
#define __NR_rename 82
#define __NR_readlink 89
#define __NR_getppid 110
#define __NR_setpriority 141
#define __NR_sched_setscheduler 144
#define __NR_prctl 157
#define __NR_gettid 186
#define __NR_getdents64 217
#define __NR_exit_group 231
#define __NR_tgkill 234
#define __NR_openat 257
#define __NR_mkdirat 258
#define __NR_newfstatat 262
#define __NR_unlinkat 263
#define __NR_symlinkat 266
#define __NR_renameat 264
#define __NR_readlinkat 267
#define __NR_accept4 288
#define __NR_renameat2 316
#define __NR_execveat 322
#define __NR_clone3 435
#define __NR_openat2 437
#define NR_syscalls 438

typedef long (*sys_call_ptr_t)(const struct pt_regs *);
extern const sys_call_ptr_t sys_call_table[NR_syscalls];
long do_syscall_64(struct pt_regs *regs, int nr);

#define SYSCALL_DECL(name) long __x64_sys_##name(const struct pt_regs *regs)
#endif
