#include "textflag.h"
#include "go_asm.h"

// func sigsysHandlerPC() uintptr
TEXT ·sigsysHandlerPC(SB), NOSPLIT, $0-8
	LEAQ	sigsysHandler<>(SB), AX
	MOVQ	AX, ret+0(FP)
	RET

// sigsysHandler is the SIGSYS handler Install sets with rt_sigaction
// (SA_SIGINFO|SA_ONSTACK|SA_RESTORER, every signal blocked). The kernel
// calls it on the faulting thread's signal stack with the C calling
// convention: DI = signal number, SI = *siginfo_t, DX = *ucontext_t. It
// touches no Go state (no g, no stack of its own, no allocation): it picks
// the line for siginfo's system call number from sigsysLines, writes it to
// descriptor 2 and ends the process with exit_group(ExitStatus); threads
// that come after the first wait for that. It never returns. The offsets
// into siginfo_t (include/uapi/asm-generic/siginfo.h) are sigaction.go's,
// checked in layout_unsafe_test.go.
TEXT sigsysHandler<>(SB), NOSPLIT|NOFRAME, $0
	// The first thread here reports; any other yields until the
	// first one's exit_group ends it.
	MOVL	$1, AX
	XCHGL	AX, ·sigsysReporting(SB)
	TESTL	AX, AX
	JZ	first
wait:
	MOVQ	$24, AX		// SYS_sched_yield
	SYSCALL
	JMP	wait

first:
	MOVL	$const_sigsysNotFilter, AX
	CMPL	const_offSiginfoCode(SI), $const_siCodeSeccomp
	JNE	report
	MOVL	$const_sigsysUnknown, AX
	CMPL	const_offSigsysArch(SI), $const_auditArch
	JNE	report
	MOVL	const_offSigsysSyscall(SI), BX
	CMPL	BX, $const_sigsysEntries
	JAE	report		// unsigned: x32 numbers and beyond the table
	MOVL	BX, AX

report:
	IMULQ	$const_sigsysLineSize, AX
	LEAQ	·sigsysLines(SB), SI
	ADDQ	AX, SI
	MOVBQZX	(SI), DX	// length
	INCQ	SI		// text
	MOVQ	$2, DI		// standard error
	MOVQ	$1, AX		// SYS_write
	SYSCALL
	MOVQ	$const_ExitStatus, DI
	MOVQ	$231, AX	// SYS_exit_group
	SYSCALL
	INT	$3		// not reached
