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
// touches no Go state (no g, no stack of its own, no allocation): it puts
// the call's name and number into sigsysIov (sigsys_amd64.go), writes the
// report to descriptor 2 with one writev and ends the process with
// exit_group(ExitStatus); threads that come after the first wait for that.
// It never returns. The offsets into siginfo_t
// (include/uapi/asm-generic/siginfo.h) are sigaction.go's, and iovec's
// layout and a string header's, checked in layout_unsafe_test.go.
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
	MOVL	$0, AX		// sigsysOther[0]: not the filter's
	CMPL	const_offSiginfoCode(SI), $const_siCodeSeccomp
	JNE	other
	MOVL	$1, AX		// sigsysOther[1]: outside the table
	CMPL	const_offSigsysArch(SI), $const_auditArch
	JNE	other
	MOVL	const_offSigsysSyscall(SI), BX
	CMPL	BX, $const_sigsysEntries
	JAE	other		// unsigned: x32 numbers and beyond the table

	// sigsysIov[1] = syscallNames[BX], or sigsysNoName when empty.
	MOVQ	BX, CX
	SHLQ	$4, CX		// 16 bytes a string header
	LEAQ	·syscallNames(SB), R8
	ADDQ	CX, R8
	MOVQ	8(R8), R9	// length
	TESTQ	R9, R9
	JNZ	named
	LEAQ	·sigsysNoName(SB), R8
	MOVQ	8(R8), R9
named:
	MOVQ	0(R8), R10	// data
	MOVQ	R10, ·sigsysIov+16(SB)
	MOVQ	R9, ·sigsysIov+24(SB)

	// sigsysIov[2] = " (" + decimal BX + ")", built backwards from the
	// end of sigsysNum.
	LEAQ	·sigsysNum+const_sigsysNumSize(SB), R11	// end
	MOVQ	R11, DI
	DECQ	DI
	MOVB	$0x29, (DI)	// ')'
	MOVL	BX, AX
	MOVL	$10, CX
digit:
	XORL	DX, DX
	DIVL	CX		// AX = AX / 10, DX = AX % 10
	ADDL	$0x30, DX
	DECQ	DI
	MOVB	DX, (DI)
	TESTL	AX, AX
	JNZ	digit
	DECQ	DI
	MOVB	$0x28, (DI)	// '('
	DECQ	DI
	MOVB	$0x20, (DI)	// ' '
	MOVQ	DI, ·sigsysIov+32(SB)
	SUBQ	DI, R11
	MOVQ	R11, ·sigsysIov+40(SB)
	LEAQ	·sigsysIov(SB), SI
	MOVQ	$4, DX		// head, name, number, tail
	JMP	write

other:
	SHLQ	$4, AX		// 16 bytes an iovec
	LEAQ	·sigsysOther(SB), SI
	ADDQ	AX, SI
	MOVQ	$1, DX

write:
	MOVQ	$2, DI		// standard error
	MOVQ	$20, AX		// SYS_writev
	SYSCALL
	MOVQ	$const_ExitStatus, DI
	MOVQ	$231, AX	// SYS_exit_group
	SYSCALL
	INT	$3		// not reached
