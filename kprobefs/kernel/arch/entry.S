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
	EXC_STUB asm_exc_nmi, exc_nmi, 1
	EXC_STUB asm_exc_int3, exc_int3, 0
	EXC_STUB asm_exc_invalid_op, exc_invalid_op, 0
	EXC_STUB asm_exc_general_protection, exc_general_protection, 1
	EXC_STUB asm_exc_page_fault, exc_page_fault, 1

/* ---- ftrace: the call sites __mcount_loc lists call __fentry__; boot turns them into
 * 5-byte NOPs.  An enabled site calls a trampoline of its own, which the kprobes engine
 * builds in kprobe_insn_area. */
	.globl __fentry__
	.type __fentry__, @function
__fentry__:
	ret
	.size __fentry__, .-__fentry__

/* ---- kprobes' own text: never probeable (the loader blacklists this whole section).
 *
 * Each *_call label below is a 5-byte NOP the host watches: reaching it is the call into
 * the probe handler, which runs on the live registers (the host reads and writes them
 * directly, so nothing is saved to memory first). */

	.section .kprobes.text, "ax"

/* Optimized-probe detour template.  A detour buffer is a copy of
 * [optprobe_template_entry, optprobe_template_end) followed by the relocated probed
 * instructions and a jump back.  It leaves %rsp in optprobe_sp (an absolute address:
 * the copy runs anywhere) for the host, which reads it from memory rather than asking
 * the CPU. */
	.globl optprobe_template_entry
	.type optprobe_template_entry, @function
optprobe_template_entry:
	movq %rsp, optprobe_sp
	.globl optprobe_template_call
optprobe_template_call:
	.byte 0x0f, 0x1f, 0x44, 0x00, 0x00
	.globl optprobe_template_end
optprobe_template_end:
	ud2
	.size optprobe_template_entry, .-optprobe_template_entry

/* The general registers of a struct pt_regs, pushed from di down to r15 (below the
 * orig_ax..ss words the caller pushed first), and popped back. */
.macro PUSH_PT_REGS_GPRS
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
.endm
.macro POP_PT_REGS_GPRS
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
.endm

/* The detour template of an optimized probe whose handler is kernel code (a natively
 * recorded trace event), as Linux's own optprobe template: build a struct pt_regs on the
 * stack, call handler(arg, regs), restore every register and the flags.  The host
 * patches the ip (a sign-extended imm32: all text is in the top 2 GiB), how far above
 * the saved registers regs->sp points (the probe's %rsp in a detour; one slot more in
 * an ftrace trampoline, past the return address to the site), the argument and the
 * call's target.  Nothing here touches the flags before pushfq or after popfq (lea, not
 * add, moves %rsp).  An ftrace trampoline is this template and a ret. */
	.globl optprobe_native_template_entry
	.type optprobe_native_template_entry, @function
optprobe_native_template_entry:
	pushq $0x18			/* ss */
	pushq %rax			/* sp, filled in below */
	pushfq				/* flags */
	pushq $0x10			/* cs */
	.globl optprobe_native_template_ip
optprobe_native_template_ip:
	.byte 0x68, 0, 0, 0, 0		/* pushq $imm32: ip */
	pushq $-1			/* orig_ax */
	PUSH_PT_REGS_GPRS
	.globl optprobe_native_template_sp
optprobe_native_template_sp:
	.byte 0x48, 0x8d, 0x84, 0x24, 21*8, 0, 0, 0	/* leaq 21*8(%rsp), %rax */
	movq %rax, 19*8(%rsp)		/* sp: where it was at the probe */
	movq %rsp, %rsi
	.globl optprobe_native_template_arg
optprobe_native_template_arg:
	.byte 0x48, 0xbf, 0, 0, 0, 0, 0, 0, 0, 0	/* movabsq $arg, %rdi */
	.globl optprobe_native_template_call
optprobe_native_template_call:
	.byte 0xe8, 0, 0, 0, 0		/* call handler */
	POP_PT_REGS_GPRS
	leaq 3*8(%rsp), %rsp		/* orig_ax, ip, cs */
	popfq
	leaq 2*8(%rsp), %rsp		/* sp, ss */
	.globl optprobe_native_template_end
optprobe_native_template_end:
	ud2
	.size optprobe_native_template_entry, .-optprobe_native_template_entry

/* The body of a return trampoline whose handler is kernel code: the function's ret
 * landed here; a slot is pushed where the return address was and a struct pt_regs
 * built below it (regs->sp is the caller's, above the slot); \handler(regs) returns
 * the real return address, which goes into the slot.  It ends with every register and
 * the flags as the function returned them, %rsp at the slot, for the final ret. */
.macro RET_TRAMPOLINE_FRAME handler
	pushq $0			/* the real return address goes here */
	pushq $0x18			/* ss */
	pushq %rax			/* sp, filled in below */
	pushfq
	pushq $0x10			/* cs */
	pushq $0			/* ip: the handler sets it */
	pushq $-1			/* orig_ax */
	PUSH_PT_REGS_GPRS
	leaq 22*8(%rsp), %rax		/* past the registers and the slot */
	movq %rax, 19*8(%rsp)
	movq %rsp, %rdi
	call \handler
	movq %rax, 21*8(%rsp)		/* into the slot */
	POP_PT_REGS_GPRS
	leaq 3*8(%rsp), %rsp		/* orig_ax, ip, cs */
	popfq
	leaq 2*8(%rsp), %rsp		/* sp, ss */
.endm

/* A return probe replaces a return address with this.  The function's ret lands here,
 * with %rsp just above the slot that held the return address; %rsp is left in
 * kretprobe_tramp_sp and the host's handler (at kretprobe_trampoline_call) leaves the
 * real return address in kretprobe_tramp_ret, which goes back into the slot for the
 * ret.  The host reads and writes memory rather than the CPU's registers (a register
 * access costs it more than the rest of its lookup), and checks the slot against its
 * pending returns.  Each trampoline is one straight-line block, aligned so that it
 * never crosses a page: nothing runs between the hook and the push of what it wrote
 * (a handler's own kernel calls run inside the hook, before it writes). */
	.balign 32
	.globl kretprobe_trampoline
	.type kretprobe_trampoline, @function
kretprobe_trampoline:
	movq %rsp, kretprobe_tramp_sp(%rip)
	.globl kretprobe_trampoline_call
kretprobe_trampoline_call:
	.byte 0x0f, 0x1f, 0x44, 0x00, 0x00
	pushq kretprobe_tramp_ret(%rip)
	ret
	.size kretprobe_trampoline, .-kretprobe_trampoline

/* A natively recorded return probe replaces a return address with this.  The function's
 * ret lands here: a slot is pushed where the return address was, a struct pt_regs is
 * built below it (regs->sp is the caller's, above the slot), and
 * trace_native_ret_handler(regs) records the event and returns the real return
 * address, which goes into the slot for the final ret. */
	.globl trace_native_ret_trampoline
	.type trace_native_ret_trampoline, @function
trace_native_ret_trampoline:
	RET_TRAMPOLINE_FRAME trace_native_ret_handler
	ret
	.size trace_native_ret_trampoline, .-trace_native_ret_trampoline

/* A return probe whose entry was kernel code (kprobes_native.c) replaces a return
 * address with this.  As trace_native_ret_trampoline, kretprobe_native_ret_handler(regs)
 * gives back the real return address, for the slot; then, with every register as the
 * function returned it and %rsp at the slot, the host's handler runs in a code hook on
 * kretprobe_native_call, reading the CPU's struct kretprobe_native_ret. */
	.globl kretprobe_native_trampoline
	.type kretprobe_native_trampoline, @function
kretprobe_native_trampoline:
	RET_TRAMPOLINE_FRAME kretprobe_native_ret_handler
	.globl kretprobe_native_call
kretprobe_native_call:
	.byte 0x0f, 0x1f, 0x44, 0x00, 0x00
	ret
	.size kretprobe_native_trampoline, .-kretprobe_native_trampoline

/* The same contract for fprobe exit hooks (rethook). */
	.balign 32
	.globl rethook_trampoline
	.type rethook_trampoline, @function
rethook_trampoline:
	movq %rsp, rethook_tramp_sp(%rip)
	.globl rethook_trampoline_call
rethook_trampoline_call:
	.byte 0x0f, 0x1f, 0x44, 0x00, 0x00
	pushq rethook_tramp_ret(%rip)
	ret
	.size rethook_trampoline, .-rethook_trampoline

/* What the return trampolines and the host pass each other (%rsp after the function's
 * ret, and the real return address), and %rsp at the last optimized probe's detour. */
	.pushsection .data
	.balign 8
	.globl kretprobe_tramp_sp
kretprobe_tramp_sp:
	.quad 0
	.globl kretprobe_tramp_ret
kretprobe_tramp_ret:
	.quad 0
	.globl rethook_tramp_sp
rethook_tramp_sp:
	.quad 0
	.globl rethook_tramp_ret
rethook_tramp_ret:
	.quad 0
	.globl optprobe_sp
optprobe_sp:
	.quad 0
	.popsection

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
	.fill 1024 * 1024, 1, 0xcc
	.size kprobe_insn_area, .-kprobe_insn_area
	.globl kprobe_insn_area_end
kprobe_insn_area_end:

/* ---- interrupts.  The host delivers one as an interrupt gate does: on the current
 * (kernel) stack, aligned to 16 bytes, it pushes ss, rsp, rflags, cs and rip, then the
 * vector where an exception's error code goes (pt_regs->orig_ax), clears IF and enters
 * here.  Entry code is noinstr: never probed. */
	.section .noinstr.text, "ax"
	.globl asm_common_interrupt
	.type asm_common_interrupt, @function
asm_common_interrupt:
	cld
	PUSH_PT_REGS_GPRS
	movq %rsp, %rdi
	movq 15*8(%rsp), %rsi		/* the vector */
	call common_interrupt
	POP_PT_REGS_GPRS
	addq $8, %rsp			/* the vector */
	iretq
	.size asm_common_interrupt, .-asm_common_interrupt

/* The descriptors iretq checks: kernel code at 0x10 (64-bit), kernel data at 0x18. */
	.data
	.balign 16
	.globl gdt_table
	.type gdt_table, @object
gdt_table:
	.quad 0, 0, 0x00af9b000000ffff, 0x00cf93000000ffff
	.size gdt_table, .-gdt_table
