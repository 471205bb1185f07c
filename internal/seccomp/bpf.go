package seccomp

import (
	"golang.org/x/sys/unix"
)

// seccompData mirrors the kernel's struct seccomp_data
// (include/uapi/linux/seccomp.h), the packet a filter reads: the system
// call number, the audit architecture, the instruction pointer and the six
// arguments, each as the raw 64-bit register. Filters load it 32 bits at a
// time at the offsets below (checked against this layout in
// layout_unsafe_test.go).
type seccompData struct {
	Nr   int32
	Arch uint32
	IP   uint64
	Args [6]uint64
}

// Offsets into seccomp_data, and its size.
const (
	offNr       = 0
	offArch     = 4
	offIP       = 8
	offArgs     = 16
	sizeofData  = 64
	argWordSize = 8 // each argument is a u64: two 32-bit words, low word first on little-endian x86-64
)

// argLow and argHigh are the offsets of the low and high 32 bits of
// argument i.
func argLow(i int) uint32  { return uint32(offArgs + argWordSize*i) }
func argHigh(i int) uint32 { return argLow(i) + 4 }

// Classic BPF opcodes a seccomp filter uses (include/uapi/linux/filter.h,
// spelled with x/sys/unix's constants): loads from the packet, an AND on the
// accumulator, conditional jumps against a constant, and returns.
const (
	opLoadAbs = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS  // A = packet[k:k+4]
	opAnd     = unix.BPF_ALU | unix.BPF_AND | unix.BPF_K // A &= k
	opJEq     = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K // pc += (A == k) ? jt : jf
	opJGE     = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K // pc += (A >= k) ? jt : jf
	opRet     = unix.BPF_RET | unix.BPF_K                // return k
)

// maxJump is the farthest a conditional jump reaches (jt and jf are u8).
const maxJump = 255

// maxInstructions is BPF_MAXINSNS, the longest program the kernel loads.
const maxInstructions = 4096

// x32SyscallBit marks x32-ABI system call numbers (__X32_SYSCALL_BIT): the
// same kernel entry point, other numbers. The filter refuses them all.
const x32SyscallBit = 0x4000_0000

// Seccomp return values (SECCOMP_RET_*): the action in the high 16 bits,
// data (an errno) in the low 16.
const (
	retAllow      = unix.SECCOMP_RET_ALLOW
	retErrno      = unix.SECCOMP_RET_ERRNO
	retTrap       = unix.SECCOMP_RET_TRAP
	retKillProc   = unix.SECCOMP_RET_KILL_PROCESS
	retDataMask   = unix.SECCOMP_RET_DATA
	retActionMask = unix.SECCOMP_RET_ACTION_FULL
)

func stmt(code uint16, k uint32) unix.SockFilter {
	return unix.SockFilter{Code: code, K: k}
}

func jump(code uint16, k uint32, jt, jf uint8) unix.SockFilter {
	return unix.SockFilter{Code: code, Jt: jt, Jf: jf, K: k}
}
