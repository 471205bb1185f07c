//go:build amd64

package seccomp

import (
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sigsysInfo is siginfo_t as the kernel fills it in for SIGSYS
// (include/uapi/asm-generic/siginfo.h: si_signo, si_errno, si_code, the
// union, aligned to 8 on 64-bit, whose _sigsys member is _call_addr,
// _syscall, _arch).
type sigsysInfo struct {
	Signo, Errno, Code int32
	_                  int32
	CallAddr           uintptr
	Syscall            int32
	Arch               uint32
}

// TestLayouts checks the Go mirrors of the kernel's structures against the
// sizes and offsets of include/uapi/linux/seccomp.h and filter.h on x86-64.
func TestLayouts(t *testing.T) {
	var d seccompData
	var si sigsysInfo
	var act kernelSigaction
	var iov iovec
	name := syscallNames[0]
	tests := []struct {
		name      string
		got, want uintptr
	}{
		{"sizeof(struct seccomp_data)", unsafe.Sizeof(d), sizeofData},
		{"sizeof(struct iovec)", unsafe.Sizeof(iov), 16},
		{"iovec.iov_len", unsafe.Offsetof(iov.len), 8},
		{"sizeof(a Go string header), read as an iovec by the SIGSYS handler", unsafe.Sizeof(name), 16},
		{"a string header's data, at iov_base", uintptr(unsafe.Pointer(unsafe.StringData(name))), (*[2]uintptr)(unsafe.Pointer(&name))[0]},
		{"a string header's length, at iov_len", uintptr(len(name)), (*[2]uintptr)(unsafe.Pointer(&name))[1]},
		{"seccomp_data.nr", unsafe.Offsetof(d.Nr), offNr},
		{"seccomp_data.arch", unsafe.Offsetof(d.Arch), offArch},
		{"seccomp_data.instruction_pointer", unsafe.Offsetof(d.IP), offIP},
		{"seccomp_data.args", unsafe.Offsetof(d.Args), offArgs},
		{"sizeof(seccomp_data.args[0])", unsafe.Sizeof(d.Args[0]), argWordSize},
		{"sizeof(struct sock_filter)", unsafe.Sizeof(unix.SockFilter{}), 8},
		{"sizeof(struct sock_fprog)", unsafe.Sizeof(unix.SockFprog{}), 16},
		{"sizeof(struct sigaction) for rt_sigaction", unsafe.Sizeof(act), sizeofSigaction},
		{"sigaction.sa_flags", unsafe.Offsetof(act.Flags), 8},
		{"sigaction.sa_restorer", unsafe.Offsetof(act.Restorer), 16},
		{"sigaction.sa_mask", unsafe.Offsetof(act.Mask), 24},
		{"sizeof(sigset_t) in the kernel", unsafe.Sizeof(act.Mask), sigsetSize},
		{"sizeof(siginfo_t)", unsafe.Sizeof(unix.Siginfo{}), sizeofSiginfo},
		{"siginfo_t.si_code (x/sys)", unsafe.Offsetof(unix.Siginfo{}.Code), offSiginfoCode},
		{"siginfo_t.si_code", unsafe.Offsetof(si.Code), offSiginfoCode},
		{"siginfo_t._sigsys._call_addr", unsafe.Offsetof(si.CallAddr), offSigsysCallAddr},
		{"siginfo_t._sigsys._syscall", unsafe.Offsetof(si.Syscall), offSigsysSyscall},
		{"siginfo_t._sigsys._arch", unsafe.Offsetof(si.Arch), offSigsysArch},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("%s = %d, want %d", tc.name, tc.got, tc.want)
		}
	}
	if argLow(5) != offArgs+40 || argHigh(0) != offArgs+4 {
		t.Errorf("argLow(5) = %d, argHigh(0) = %d; want %d, %d", argLow(5), argHigh(0), offArgs+40, offArgs+4)
	}
}
