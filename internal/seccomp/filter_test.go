//go:build amd64

package seccomp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/kvm"
)

// runFilter executes prog over a call the way the kernel's classic BPF
// interpreter would, for the instructions compile emits, and fails the test
// on anything else: an unknown opcode, a jump or load out of bounds, a
// program that runs off its end.
func runFilter(t *testing.T, prog []unix.SockFilter, d seccompData) uint32 {
	t.Helper()
	pkt := make([]byte, sizeofData)
	le := binary.LittleEndian
	le.PutUint32(pkt[offNr:], uint32(d.Nr))
	le.PutUint32(pkt[offArch:], d.Arch)
	le.PutUint64(pkt[offIP:], d.IP)
	for i, a := range d.Args {
		le.PutUint64(pkt[offArgs+argWordSize*i:], a)
	}
	var a uint32
	for pc := 0; pc < len(prog); pc++ {
		in := prog[pc]
		switch in.Code {
		case opLoadAbs:
			if in.K%4 != 0 || in.K+4 > sizeofData {
				t.Fatalf("pc %d: load at %d, outside seccomp_data", pc, in.K)
			}
			a = le.Uint32(pkt[in.K:])
		case opAnd:
			a &= in.K
		case opJEq, opJGE:
			taken := a == in.K
			if in.Code == opJGE {
				taken = a >= in.K
			}
			off := int(in.Jf)
			if taken {
				off = int(in.Jt)
			}
			if pc+1+off >= len(prog) {
				t.Fatalf("pc %d: jump by %d past the end (%d instructions)", pc, off, len(prog))
			}
			pc += off
		case opRet:
			return in.K
		default:
			t.Fatalf("pc %d: opcode %#x not emulated", pc, in.Code)
		}
	}
	t.Fatalf("program of %d instructions ran off its end", len(prog))
	return 0
}

// ifCgo picks the expectation for this build: glibc's threads need a
// few more rules in a cgo build (cgo_on.go).
func ifCgo(cgo, static string) string {
	if len(cgoThreadFlags) > 0 {
		return cgo
	}
	return static
}

// call builds a native call of nr with args.
func call(nr int, args ...uint64) seccompData {
	d := seccompData{Nr: int32(nr), Arch: unix.AUDIT_ARCH_X86_64}
	copy(d.Args[:], args)
	return d
}

const testDeny = retTrap

func actionName(r uint32) string {
	switch r & retActionMask {
	case retAllow:
		return "allow"
	case testDeny:
		return "deny"
	case retErrno:
		return fmt.Sprintf("errno %d", r&retDataMask)
	}
	return fmt.Sprintf("%#x", r)
}

// TestVMMPolicy runs the compiled VMM policy over calls a running VMM makes
// and calls an attacker would, including each argument condition's
// boundaries.
func TestVMMPolicy(t *testing.T) {
	prog, err := compile(VMM(), unix.AUDIT_ARCH_X86_64, testDeny)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("VMM policy: %d instructions", len(prog))
	pid := uint64(os.Getpid())
	const kvmCreateVM = 0xae01
	rw := uint64(unix.PROT_READ | unix.PROT_WRITE)
	i386 := call(unix.SYS_FUTEX)
	i386.Arch = unix.AUDIT_ARCH_I386
	tests := []struct {
		name string
		d    seccompData
		want string
	}{
		{"futex", call(unix.SYS_FUTEX), "allow"},
		{"KVM_RUN", call(unix.SYS_IOCTL, 12, uint64(kvm.RuntimeIoctls()[0])), "allow"},
		{"every runtime KVM request", call(unix.SYS_IOCTL, 12, uint64(kvm.RuntimeIoctls()[len(kvm.RuntimeIoctls())-1])), "allow"},
		{"KVM_RUN, garbage in the high half (the kernel reads an unsigned int)", call(unix.SYS_IOCTL, 12, 0xdead_0000_0000_0000|0xae80), "allow"},
		{"KVM_CREATE_VM", call(unix.SYS_IOCTL, 12, kvmCreateVM), "deny"},
		{"TIOCSTI", call(unix.SYS_IOCTL, 0, unix.TIOCSTI), "deny"},
		{"SECCOMP_IOCTL_NOTIF_RECV", call(unix.SYS_IOCTL, 5, unix.SECCOMP_IOCTL_NOTIF_RECV), "deny"},
		{"openat", call(unix.SYS_OPENAT, 0xffffffffffffff9c, 0x1000, unix.O_RDONLY), ifCgo(fmt.Sprintf("errno %d", unix.EACCES), "deny")},
		{"open", call(unix.SYS_OPEN), "deny"},
		{"execve", call(unix.SYS_EXECVE), "deny"},
		{"execveat", call(unix.SYS_EXECVEAT), "deny"},
		{"ptrace", call(unix.SYS_PTRACE), "deny"},
		{"bind", call(unix.SYS_BIND), "deny"},
		{"socketpair AF_UNIX (DialVsock)", call(unix.SYS_SOCKETPAIR, unix.AF_UNIX, unix.SOCK_STREAM), "allow"},
		{"socketpair AF_INET", call(unix.SYS_SOCKETPAIR, unix.AF_INET, unix.SOCK_STREAM), "deny"},
		{"clone: a Go thread", call(unix.SYS_CLONE, threadCloneFlags), "allow"},
		{"clone: a glibc thread (cgo builds only)", call(unix.SYS_CLONE, glibcThreadCloneFlags), ifCgo("allow", "deny")},
		{"clone: fork", call(unix.SYS_CLONE, uint64(unix.SIGCHLD)), "deny"},
		{"clone: vfork", call(unix.SYS_CLONE, unix.CLONE_VM|unix.CLONE_VFORK|uint64(unix.SIGCHLD)), "deny"},
		{"clone: thread flags plus a high bit", call(unix.SYS_CLONE, 1<<32|threadCloneFlags), "deny"},
		{"clone: thread flags plus CLONE_NEWUSER", call(unix.SYS_CLONE, unix.CLONE_NEWUSER|threadCloneFlags), "deny"},
		{"clone3", call(unix.SYS_CLONE3), fmt.Sprintf("errno %d", unix.ENOSYS)},
		{"socket AF_UNIX", call(unix.SYS_SOCKET, unix.AF_UNIX, unix.SOCK_STREAM), "allow"},
		{"socket AF_INET", call(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_STREAM), "deny"},
		{"socket AF_NETLINK", call(unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW), "deny"},
		{"mmap rw", call(unix.SYS_MMAP, 0, 4096, rw), "allow"},
		{"mmap rwx", call(unix.SYS_MMAP, 0, 4096, rw|unix.PROT_EXEC), "deny"},
		{"mprotect none", call(unix.SYS_MPROTECT, 0, 4096, unix.PROT_NONE), "allow"},
		{"mprotect exec", call(unix.SYS_MPROTECT, 0, 4096, unix.PROT_READ|unix.PROT_EXEC), "deny"},
		{"tgkill own thread", call(unix.SYS_TGKILL, pid, 7, uint64(unix.SIGURG)), "allow"},
		{"tgkill another process", call(unix.SYS_TGKILL, pid+1, 7, uint64(unix.SIGURG)), "deny"},
		{"kill self", call(unix.SYS_KILL, pid, uint64(unix.SIGABRT)), "allow"},
		{"kill -1", call(unix.SYS_KILL, 0xffffffffffffffff, uint64(unix.SIGKILL)), "deny"},
		{"prctl PR_SET_VMA anon name", call(unix.SYS_PRCTL, prSetVMA, prSetVMAAnonName), "allow"},
		{"prctl PR_SET_VMA other", call(unix.SYS_PRCTL, prSetVMA, 1), "deny"},
		{"prctl PR_SET_NO_NEW_PRIVS", call(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1), "deny"},
		{"seccomp (no second filter)", call(unix.SYS_SECCOMP), "deny"},
		{"pwritev (disks)", call(unix.SYS_PWRITEV), "allow"},
		{"readlinkat (vhost-user only)", call(unix.SYS_READLINKAT), "deny"},
		{"the last rule's neighbour", call(unix.SYS_FALLOCATE + 1), "deny"},
		{"number 0 (read)", call(0), "allow"},
		{"i386 entry point, futex's number", i386, "deny"},
		{"x32 read", call(x32SyscallBit | unix.SYS_READ), "deny"},
		{"number past every table", call(0x3fff_ffff), "deny"},
	}
	for _, tc := range tests {
		if got := actionName(runFilter(t, prog, tc.d)); got != tc.want {
			t.Errorf("%s (nr %d, args %#x): %s, want %s", tc.name, tc.d.Nr, tc.d.Args[:3], got, tc.want)
		}
	}
}

// TestUserNetPolicies: the VMM of a machine on a user-mode network may
// reap and kill its network process but still opens no IP socket; that
// process (microvm-net) may open IPv4 and IPv6 sockets and stat files,
// opening one fails without killing it, and it makes no KVM request.
func TestUserNetPolicies(t *testing.T) {
	vmmProg, err := compile(VMMUserNet(), unix.AUDIT_ARCH_X86_64, testDeny)
	if err != nil {
		t.Fatal(err)
	}
	netProg, err := compile(UserNet(), unix.AUDIT_ARCH_X86_64, testDeny)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		d         seccompData
		vmm, unet string
	}{
		{"socket AF_UNIX", call(unix.SYS_SOCKET, unix.AF_UNIX, unix.SOCK_STREAM), "allow", "allow"},
		{"socket AF_INET", call(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_STREAM), "deny", "allow"},
		{"socket AF_INET6 UDP", call(unix.SYS_SOCKET, unix.AF_INET6, unix.SOCK_DGRAM), "deny", "allow"},
		{"socket AF_NETLINK", call(unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW), "deny", "deny"},
		{"socket AF_PACKET", call(unix.SYS_SOCKET, unix.AF_PACKET, unix.SOCK_RAW), "deny", "deny"},
		{"connect", call(unix.SYS_CONNECT), "allow", "allow"},
		{"accept4", call(unix.SYS_ACCEPT4), "allow", "allow"},
		{"setsockopt", call(unix.SYS_SETSOCKOPT), "deny", "allow"},
		{"setsockopt SO_SNDBUF", call(unix.SYS_SETSOCKOPT, 9, unix.SOL_SOCKET, unix.SO_SNDBUF), "allow", "allow"},
		{"setsockopt SO_RCVBUF", call(unix.SYS_SETSOCKOPT, 9, unix.SOL_SOCKET, unix.SO_RCVBUF), "deny", "allow"},
		{"setsockopt TCP_NODELAY", call(unix.SYS_SETSOCKOPT, 9, unix.IPPROTO_TCP, unix.TCP_NODELAY), "deny", "allow"},
		{"newfstatat", call(unix.SYS_NEWFSTATAT), "deny", "allow"},
		{"openat", call(unix.SYS_OPENAT, 0xffffffffffffff9c, 0x1000, unix.O_RDONLY), ifCgo(fmt.Sprintf("errno %d", unix.EACCES), "deny"), fmt.Sprintf("errno %d", unix.EACCES)},
		{"waitid", call(unix.SYS_WAITID), "allow", "deny"},
		{"pidfd_send_signal", call(unix.SYS_PIDFD_SEND_SIGNAL), "allow", "deny"},
		{"bind", call(unix.SYS_BIND), "deny", "deny"},
		{"listen", call(unix.SYS_LISTEN), "deny", "deny"},
		{"execve", call(unix.SYS_EXECVE), "deny", "deny"},
		{"KVM_RUN", call(unix.SYS_IOCTL, 12, uint64(kvm.RuntimeIoctls()[0])), "allow", "deny"},
	} {
		if got := actionName(runFilter(t, vmmProg, tc.d)); got != tc.vmm {
			t.Errorf("VMMUserNet: %s (nr %d, args %#x): %s, want %s", tc.name, tc.d.Nr, tc.d.Args[:3], got, tc.vmm)
		}
		if got := actionName(runFilter(t, netProg, tc.d)); got != tc.unet {
			t.Errorf("UserNet: %s (nr %d, args %#x): %s, want %s", tc.name, tc.d.Nr, tc.d.Args[:3], got, tc.unet)
		}
	}
}

// TestVhostUserPolicy: the back-end gets its vhost-user calls and no KVM
// request.
func TestVhostUserPolicy(t *testing.T) {
	prog, err := compile(VhostUserVsock(), unix.AUDIT_ARCH_X86_64, testDeny)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		d    seccompData
		want string
	}{
		{"KVM_RUN", call(unix.SYS_IOCTL, 3, 0xae80), "deny"},
		{"FIONREAD", call(unix.SYS_IOCTL, 3, unix.SIOCINQ), "allow"},
		{"readlinkat", call(unix.SYS_READLINKAT), "allow"},
		{"fstat", call(unix.SYS_FSTAT), "allow"},
		{"recvmsg", call(unix.SYS_RECVMSG), "allow"},
		{"mmap shared rw", call(unix.SYS_MMAP, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED, 9), "allow"},
		{"openat", call(unix.SYS_OPENAT), ifCgo(fmt.Sprintf("errno %d", unix.EACCES), "deny")},
		{"pwritev (no disks)", call(unix.SYS_PWRITEV), "deny"},
	}
	for _, tc := range tests {
		if got := actionName(runFilter(t, prog, tc.d)); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

// TestCPUProfilingPolicy: WithCPUProfiling adds the profiler's timers to a
// policy that has none, and leaves the rest as it was.
func TestCPUProfilingPolicy(t *testing.T) {
	for _, p := range []Policy{VMM(), VhostUserVsock()} {
		plain, err := compile(p, unix.AUDIT_ARCH_X86_64, testDeny)
		if err != nil {
			t.Fatal(err)
		}
		prof, err := compile(p.WithCPUProfiling(), unix.AUDIT_ARCH_X86_64, testDeny)
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name        string
			d           seccompData
			plain, prof string
		}{
			{"timer_create", call(unix.SYS_TIMER_CREATE), "deny", "allow"},
			{"timer_settime", call(unix.SYS_TIMER_SETTIME), "deny", "allow"},
			{"timer_delete", call(unix.SYS_TIMER_DELETE), "deny", "allow"},
			{"setitimer", call(unix.SYS_SETITIMER), "deny", "allow"},
			{"futex", call(unix.SYS_FUTEX), "allow", "allow"},
			{"openat", call(unix.SYS_OPENAT), ifCgo(fmt.Sprintf("errno %d", unix.EACCES), "deny"), fmt.Sprintf("errno %d", unix.EACCES)},
			{"execve", call(unix.SYS_EXECVE), "deny", "deny"},
		} {
			if got := actionName(runFilter(t, plain, tc.d)); got != tc.plain {
				t.Errorf("%s: %s: %s, want %s", p.Name(), tc.name, got, tc.plain)
			}
			if got := actionName(runFilter(t, prof, tc.d)); got != tc.prof {
				t.Errorf("%s with profiling: %s: %s, want %s", p.Name(), tc.name, got, tc.prof)
			}
		}
	}
}

// TestPolicyRules: every rule of both policies names a known call and says
// who needs it; each policy compiles for every deny action.
func TestPolicyRules(t *testing.T) {
	for _, p := range []Policy{VMM(), VhostUserVsock()} {
		for _, r := range p.rules {
			if strings.HasPrefix(Name(r.nr), "syscall ") {
				t.Errorf("%s: rule for unnamed call %d", p.Name(), r.nr)
			}
			if r.why == "" {
				t.Errorf("%s: rule for %s says nothing about who needs it", p.Name(), Name(r.nr))
			}
		}
		for _, deny := range []uint32{retTrap, retKillProc} {
			prog, err := compile(p, unix.AUDIT_ARCH_X86_64, deny)
			if err != nil {
				t.Fatalf("%s: %v", p.Name(), err)
			}
			if got := runFilter(t, prog, call(unix.SYS_EXECVE)); got != deny {
				t.Errorf("%s: execve gets %#x, want the deny action %#x", p.Name(), got, deny)
			}
		}
	}
}

// TestCompileErrors: policies the compiler must refuse rather than turn
// into a wrong program.
func TestCompileErrors(t *testing.T) {
	many := make([]uint32, maxJump)
	for i := range many {
		many[i] = uint32(i)
	}
	tests := []struct {
		name  string
		rules []rule
	}{
		{"two rules for one call", []rule{allow(unix.SYS_READ, "a"), allow(unix.SYS_READ, "b")}},
		{"negative number", []rule{allow(-1, "a")}},
		{"x32 number", []rule{allow(x32SyscallBit, "a")}},
		{"too many values for one jump", []rule{allowIf(unix.SYS_IOCTL, "a", argIn(1, many...))}},
		{"no values", []rule{allowIf(unix.SYS_IOCTL, "a", argIn(1))}},
		{"value outside its mask", []rule{allowIf(unix.SYS_MMAP, "a", cond{off: argLow(2), mask: 4, values: []uint32{8}})}},
		{"load outside the arguments", []rule{allowIf(unix.SYS_MMAP, "a", cond{off: offNr, mask: 1, values: []uint32{0}})}},
		{"errno with conditions", []rule{{nr: unix.SYS_CLONE3, errno: unix.ENOSYS, args: []cond{argIn(0, 1)}, why: "a"}}},
	}
	for _, tc := range tests {
		_, err := compile(Policy{name: "test", rules: tc.rules}, unix.AUDIT_ARCH_X86_64, testDeny)
		if !errors.Is(err, errPolicy) {
			t.Errorf("%s: compile = %v, want errPolicy", tc.name, err)
		}
	}
}

// addedCase is one call under a policy and under the policy with rules
// added: the action each gives.
type addedCase struct {
	name         string
	d            seccompData
	plain, added string
}

// checkAdded checks each case's action under base and under added (base
// with a With... method's rules), and that every rule of added has a name
// and a reason.
func checkAdded(t *testing.T, base, added Policy, label string, cases []addedCase) {
	t.Helper()
	plain, err := compile(base, unix.AUDIT_ARCH_X86_64, testDeny)
	if err != nil {
		t.Fatal(err)
	}
	more, err := compile(added, unix.AUDIT_ARCH_X86_64, testDeny)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		if got := actionName(runFilter(t, plain, tc.d)); got != tc.plain {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.plain)
		}
		if got := actionName(runFilter(t, more, tc.d)); got != tc.added {
			t.Errorf("%s with %s: %s, want %s", tc.name, label, got, tc.added)
		}
	}
	for _, r := range added.rules {
		if r.why == "" || strings.HasPrefix(Name(r.nr), "syscall ") {
			t.Errorf("rule for %s: unnamed or without a reason", Name(r.nr))
		}
	}
}

// TestSharesPolicy: WithShares allows the 9P server's file calls (openat
// too, which the plain policy fails with EACCES), and leaves the rest as
// it was.
func TestSharesPolicy(t *testing.T) {
	p := VMM()
	checkAdded(t, p, p.WithShares(), "shares", []addedCase{
		{"openat", call(unix.SYS_OPENAT), fmt.Sprintf("errno %d", unix.EACCES), "allow"},
		{"mkdirat", call(unix.SYS_MKDIRAT), "deny", "allow"},
		{"renameat", call(unix.SYS_RENAMEAT), "deny", "allow"},
		{"fchownat", call(unix.SYS_FCHOWNAT), "deny", "allow"},
		{"getdents64", call(unix.SYS_GETDENTS64), "deny", "allow"},
		{"unlinkat", call(unix.SYS_UNLINKAT), "allow", "allow"},
		{"futex", call(unix.SYS_FUTEX), "allow", "allow"},
		{"execve", call(unix.SYS_EXECVE), "deny", "deny"},
		{"mount", call(unix.SYS_MOUNT), "deny", "deny"},
	})
}

// TestCacheCommitsPolicy: WithCacheCommits allows what committing a cache
// clone and removing disks take (flock, renameat, fsync, openat), and no
// more than files: no exec, no mount.
func TestCacheCommitsPolicy(t *testing.T) {
	p := VMM()
	checkAdded(t, p, p.WithCacheCommits(), "caches", []addedCase{
		{"openat", call(unix.SYS_OPENAT), fmt.Sprintf("errno %d", unix.EACCES), "allow"},
		{"flock", call(unix.SYS_FLOCK), "deny", "allow"},
		{"renameat", call(unix.SYS_RENAMEAT), "deny", "allow"},
		{"fsync", call(unix.SYS_FSYNC), "deny", "allow"},
		{"mkdirat", call(unix.SYS_MKDIRAT), "deny", "allow"},
		{"fchmod", call(unix.SYS_FCHMOD), "deny", "allow"},
		{"execve", call(unix.SYS_EXECVE), "deny", "deny"},
		{"mount", call(unix.SYS_MOUNT), "deny", "deny"},
	})
}
