package seccomp

// kernelSigaction mirrors the kernel's struct sigaction as rt_sigaction(2)
// takes it on x86-64 (arch/x86/include/uapi/asm/signal.h with
// SA_RESTORER): handler, flags, restorer, mask. Size checked in
// layout_unsafe_test.go.
type kernelSigaction struct {
	Handler  uintptr
	Flags    uint64
	Restorer uintptr
	Mask     uint64
}

// sigaction flags (include/uapi/asm-generic/signal-defs.h, x86's
// SA_RESTORER) and the kernel's sigset size, the last argument of
// rt_sigaction.
const (
	saSiginfo         = 0x4
	saOnstack         = 0x0800_0000
	saRestorer        = 0x0400_0000
	sigsetSize        = 8
	sizeofSigaction   = 32
	sizeofSiginfo     = 128
	offSiginfoCode    = 8  // si_code
	offSigsysCallAddr = 16 // _sigsys._call_addr
	offSigsysSyscall  = 24 // _sigsys._syscall
	offSigsysArch     = 28 // _sigsys._arch
)
