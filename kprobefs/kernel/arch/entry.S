/* Low-level entry code: context switch, fork return, exception stubs, and the areas
 * the kprobes engine owns (trampolines and instruction slots).  Exceptions are delivered
 * by the host, which builds a struct pt_regs on the interrupted stack and enters the stub
 * with %rsp pointing at it; the stub returns through the HC_IRET hypercall. */

#define HC_IRET 5

	.text
/* struct task_struct *__switch_to_asm(prev, next, &prev->thread.sp, next->thread.sp) */
	.globl __switch_to_asm
	.type __switch_to_asm, @function
__switch_to_asm:
	pushq %rbp
	pushq %rbx
	pushq %r12
	pushq %r13
	pushq %r14
	pushq %r15
	movq %rsp, (%rdx)
	movq %rcx, %rsp
	popq %r15
	popq %r14
	popq %r13
	popq %r12
	popq %rbx
	popq %rbp
	jmp __switch_to
	.size __switch_to_asm, .-__switch_to_asm

/* A new task starts here with %rax = prev, %rbx = fn (or 0 for a user task), %r12 = arg. */
	.globl ret_from_fork
	.type ret_from_fork, @function
ret_from_fork:
	movq %rax, %rdi
	call schedule_tail
	testq %rbx, %rbx
	jz 1f
	movq %r12, %rdi
	call *%rbx
	movq %rax, %rdi
	call do_exit
1:	call user_mode_loop
	ud2
	.size ret_from_fork, .-ret_from_fork

.macro EXC_STUB name, handler, has_error
	.globl \name
	.type \name, @function
\name:
	movq %rsp, %rdi
	.if \has_error
	movq 15*8(%rsp), %rsi
	.endif
	call \handler
	movq %rsp, %rdi
	movl $HC_IRET, %eax
	int $0x81
	ud2
	.size \name, .-\name
.endm

	EXC_STUB asm_exc_divide_error, exc_divide_error, 0
	EXC_STUB asm_exc_debug, exc_debug, 0
	EXC_STUB asm_exc_int3, exc_int3, 0
	EXC_STUB asm_exc_invalid_op, exc_invalid_op, 0
	EXC_STUB asm_exc_general_protection, exc_general_protection, 1
	EXC_STUB asm_exc_page_fault, exc_page_fault, 1

/* ---- ftrace: the call sites __mcount_loc lists call __fentry__; boot turns them into
 * 5-byte NOPs.  The tracer re-points a site at ftrace_caller / ftrace_regs_caller. */
	.globl __fentry__
	.type __fentry__, @function
__fentry__:
	ret
	.size __fentry__, .-__fentry__

/* ---- kprobes' own text: never probeable (the loader blacklists this whole section).
 *
 * The trampolines below save the interrupted registers as a struct pt_regs on the stack,
 * publish its address in this CPU's pcpu.trap_regs (%gs:24), and reach an instruction the
 * host watches (the *_call labels): the host's handler reads and may change the frame
 * in memory, then the trampoline restores the registers from it. */

#define PCPU_TRAP_REGS %gs:24

/* Push a struct pt_regs below the current %rsp, whose value goes into regs->sp.  The
 * caller has already pushed nothing; flags are saved before anything changes them. */
.macro SAVE_PT_REGS
	pushq %rsp			/* ss slot: the interrupted %rsp, moved to sp below */
	pushq %rsp			/* sp slot */
	pushfq				/* flags */
	leaq -24(%rsp), %rsp		/* cs, ip, orig_ax */
	pushq %rdi
	pushq %rsi
	pushq %rdx
	pushq %rcx
	pushq %rax
	pushq %r8
	pushq %r9
	pushq %r10
	pushq %r11
	pushq %rbx
	pushq %rbp
	pushq %r12
	pushq %r13
	pushq %r14
	pushq %r15
	movq 20*8(%rsp), %rax
	movq %rax, 19*8(%rsp)
	movq $0x10, 17*8(%rsp)
	movq $-1, 15*8(%rsp)
	movq %rsp, PCPU_TRAP_REGS
.endm

/* Restore every register but %rsp from the frame and pop it, leaving %rsp where
 * SAVE_PT_REGS found it.  Flags come back last. */
.macro RESTORE_PT_REGS
	popq %r15
	popq %r14
	popq %r13
	popq %r12
	popq %rbp
	popq %rbx
	popq %r11
	popq %r10
	popq %r9
	popq %r8
	popq %rax
	popq %rcx
	popq %rdx
	popq %rsi
	popq %rdi
	leaq 24(%rsp), %rsp
	popfq
	leaq 16(%rsp), %rsp
.endm

	.section .kprobes.text, "ax"

/* Optimized-probe detour template.  Each detour buffer is a copy of
 * [optprobe_template_entry, optprobe_template_end) followed by the relocated probed
 * instructions and a jump back; the host watches the copy of optprobe_template_call. */
	.globl optprobe_template_entry
	.type optprobe_template_entry, @function
optprobe_template_entry:
	SAVE_PT_REGS
	.globl optprobe_template_call
optprobe_template_call:
	.byte 0x0f, 0x1f, 0x44, 0x00, 0x00
	RESTORE_PT_REGS
	.globl optprobe_template_end
optprobe_template_end:
	ud2
	.size optprobe_template_entry, .-optprobe_template_entry

/* ftrace: a site enabled for a callback with registers calls here.  The host runs the
 * ftrace ops at ftrace_regs_call; regs->ip starts as the return address (site + 5) and a
 * handler may change it to divert the return; regs->sp is the traced function's stack
 * pointer at its entry, so [regs->sp] is its return address. */
	.globl ftrace_regs_caller
	.type ftrace_regs_caller, @function
ftrace_regs_caller:
	SAVE_PT_REGS
	movq 21*8(%rsp), %rax
	movq %rax, 16*8(%rsp)		/* regs->ip = the return address */
	addq $8, 19*8(%rsp)		/* regs->sp = the traced function's own stack */
	.globl ftrace_regs_call
ftrace_regs_call:
	.byte 0x0f, 0x1f, 0x44, 0x00, 0x00
	movq 16*8(%rsp), %rax
	movq %rax, 21*8(%rsp)		/* return to regs->ip */
	RESTORE_PT_REGS
	ret
	.size ftrace_regs_caller, .-ftrace_regs_caller

/* ftrace without registers: the host only needs the site, read from the stack. */
	.globl ftrace_caller
	.type ftrace_caller, @function
ftrace_caller:
	.globl ftrace_call
ftrace_call:
	.byte 0x0f, 0x1f, 0x44, 0x00, 0x00
	ret
	.size ftrace_caller, .-ftrace_caller

	.globl ftrace_stub
	.type ftrace_stub, @function
ftrace_stub:
	ret
	.size ftrace_stub, .-ftrace_stub

/* A return probe replaces a return address with this.  A slot for the real return
 * address is pushed first; the host's handler at kretprobe_trampoline_call fills it in
 * (and sees regs->ax = the return value), then the trampoline returns there. */
	.globl kretprobe_trampoline
	.type kretprobe_trampoline, @function
kretprobe_trampoline:
	pushq $0
	SAVE_PT_REGS
	.globl kretprobe_trampoline_call
kretprobe_trampoline_call:
	.byte 0x0f, 0x1f, 0x44, 0x00, 0x00
	RESTORE_PT_REGS
	ret
	.size kretprobe_trampoline, .-kretprobe_trampoline

/* The same contract for fprobe exit hooks (rethook). */
	.globl rethook_trampoline
	.type rethook_trampoline, @function
rethook_trampoline:
	pushq $0
	SAVE_PT_REGS
	.globl rethook_trampoline_call
rethook_trampoline_call:
	.byte 0x0f, 0x1f, 0x44, 0x00, 0x00
	RESTORE_PT_REGS
	ret
	.size rethook_trampoline, .-rethook_trampoline

/* Where the host's direct calls into kernel functions return to. */
	.globl host_call_return
	.type host_call_return, @function
host_call_return:
	ud2
	.size host_call_return, .-host_call_return

/* Instruction slots and optprobe detour buffers are carved out of this area, which lies
 * within +-2 GiB of all kernel text as relative jumps need. */
	.balign 4096
	.globl kprobe_insn_area
	.type kprobe_insn_area, @object
kprobe_insn_area:
	.fill 256 * 1024, 1, 0xcc
	.size kprobe_insn_area, .-kprobe_insn_area
	.globl kprobe_insn_area_end
kprobe_insn_area_end:
