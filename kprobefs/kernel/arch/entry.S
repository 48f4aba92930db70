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

/* ---- kprobes' own text: never probeable (the loader blacklists this whole section). */
	.section .kprobes.text, "ax"
	.globl ftrace_caller
	.type ftrace_caller, @function
ftrace_caller:
	nop
	ret
	.size ftrace_caller, .-ftrace_caller

	.globl ftrace_regs_caller
	.type ftrace_regs_caller, @function
ftrace_regs_caller:
	nop
	ret
	.size ftrace_regs_caller, .-ftrace_regs_caller

	.globl ftrace_stub
	.type ftrace_stub, @function
ftrace_stub:
	ret
	.size ftrace_stub, .-ftrace_stub

/* A return probe replaces a return address with this; the engine catches the first
 * byte and resumes at the real return address.  Reached without the engine: BUG. */
	.globl kretprobe_trampoline
	.type kretprobe_trampoline, @function
kretprobe_trampoline:
	nop
	ud2
	.size kretprobe_trampoline, .-kretprobe_trampoline

/* Return hook for fprobe exits, same contract as kretprobe_trampoline. */
	.globl rethook_trampoline
	.type rethook_trampoline, @function
rethook_trampoline:
	nop
	ud2
	.size rethook_trampoline, .-rethook_trampoline

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
