package seccomp

import (
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// evalOCI runs a compiled program on one system call in x/net/bpf's
// interpreter, an implementation other than the kernel's and ours. Its
// loads are big-endian, so each 32-bit word of seccomp_data is stored
// big-endian here to read back as the kernel's native load would.
func evalOCI(t *testing.T, f *OCIFilter, arch uint32, nr int, args ...uint64) uint32 {
	t.Helper()
	var raw []bpf.RawInstruction
	for b := f.Program; len(b) > 0; b = b[8:] {
		raw = append(raw, bpf.RawInstruction{Op: binary.NativeEndian.Uint16(b), Jt: b[2], Jf: b[3], K: binary.NativeEndian.Uint32(b[4:])})
	}
	ins, ok := bpf.Disassemble(raw)
	if !ok {
		t.Fatalf("the program has instructions x/net/bpf does not know")
	}
	vm, err := bpf.NewVM(ins)
	if err != nil {
		t.Fatal(err)
	}
	pkt := make([]byte, sizeofData)
	binary.BigEndian.PutUint32(pkt[offNr:], uint32(nr))
	binary.BigEndian.PutUint32(pkt[offArch:], arch)
	for i, a := range args {
		binary.BigEndian.PutUint32(pkt[argLow(i):], uint32(a))
		binary.BigEndian.PutUint32(pkt[argHigh(i):], uint32(a>>32))
	}
	r, err := vm.Run(pkt)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(r)
}

func ptrUint(v uint) *uint { return &v }

func TestCompileOCI(t *testing.T) {
	p := &specs.LinuxSeccomp{
		DefaultAction: specs.ActErrno,
		Architectures: []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32},
		Syscalls: []specs.LinuxSyscall{
			{Names: []string{"read", "write", "no_such_call"}, Action: specs.ActAllow},
			{Names: []string{"personality"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: 8, Op: specs.OpEqualTo}}},
			{Names: []string{"personality"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: 0xffffffff, Op: specs.OpEqualTo}}},
			// clone without CLONE_NEWUSER: containerd's default profile's form.
			{Names: []string{"clone"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: unix.CLONE_NEWUSER, ValueTwo: 0, Op: specs.OpMaskedEqual}}},
			{Names: []string{"mkdir"}, Action: specs.ActErrno, ErrnoRet: ptrUint(uint(unix.EACCES))},
			{Names: []string{"kill"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{
				{Index: 0, Value: 1 << 32, Op: specs.OpGreaterThan}, {Index: 1, Value: 15, Op: specs.OpLessEqual}}},
			{Names: []string{"tkill"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{
				{Index: 0, Value: 1<<32 | 5, Op: specs.OpGreaterEqual}, {Index: 1, Value: 9, Op: specs.OpNotEqual}}},
			{Names: []string{"tgkill"}, Action: specs.ActLog, Args: []specs.LinuxSeccompArg{{Index: 2, Value: 1<<32 | 5, Op: specs.OpLessThan}}},
			{Names: []string{"ptrace"}, Action: specs.ActKillProcess},
		},
	}
	f, err := CompileOCI(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Unknown) != 1 || f.Unknown[0] != "no_such_call" {
		t.Errorf("Unknown = %v, want [no_such_call]", f.Unknown)
	}
	const x86 = unix.AUDIT_ARCH_X86_64
	eperm, eacces := uint32(retErrno|uint32(unix.EPERM)), uint32(retErrno|uint32(unix.EACCES))
	for _, tc := range []struct {
		what string
		arch uint32
		nr   int
		args []uint64
		want uint32
	}{
		{"read", x86, unix.SYS_READ, nil, retAllow},
		{"write", x86, unix.SYS_WRITE, nil, retAllow},
		{"open: the default", x86, unix.SYS_OPEN, nil, eperm},
		{"personality(8)", x86, unix.SYS_PERSONALITY, []uint64{8}, retAllow},
		{"personality(0xffffffff): the second rule", x86, unix.SYS_PERSONALITY, []uint64{0xffffffff}, retAllow},
		{"personality(1<<32|8): the high word counts", x86, unix.SYS_PERSONALITY, []uint64{1<<32 | 8}, eperm},
		{"personality(0)", x86, unix.SYS_PERSONALITY, []uint64{0}, eperm},
		{"clone(CLONE_THREAD)", x86, unix.SYS_CLONE, []uint64{unix.CLONE_THREAD | unix.CLONE_VM}, retAllow},
		{"clone(CLONE_NEWUSER)", x86, unix.SYS_CLONE, []uint64{unix.CLONE_NEWUSER | unix.CLONE_VM}, eperm},
		{"mkdir: errnoRet", x86, unix.SYS_MKDIR, nil, eacces},
		{"kill(1<<32+1, 15)", x86, unix.SYS_KILL, []uint64{1<<32 + 1, 15}, retAllow},
		{"kill(1<<32, 15): not greater", x86, unix.SYS_KILL, []uint64{1 << 32, 15}, eperm},
		{"kill(2<<32, 16): second condition", x86, unix.SYS_KILL, []uint64{2 << 32, 16}, eperm},
		{"kill(5, 1): low word large, high small", x86, unix.SYS_KILL, []uint64{0xffffffff, 1}, eperm},
		{"tkill(1<<32|5, 1)", x86, unix.SYS_TKILL, []uint64{1<<32 | 5, 1}, retAllow},
		{"tkill(1<<32|4, 1): less", x86, unix.SYS_TKILL, []uint64{1<<32 | 4, 1}, eperm},
		{"tkill(2<<32, 9): signal 9 refused", x86, unix.SYS_TKILL, []uint64{2 << 32, 9}, eperm},
		{"tkill(2<<32, 1<<32|9): NE on the high word", x86, unix.SYS_TKILL, []uint64{2 << 32, 1<<32 | 9}, retAllow},
		{"tgkill(.., .., 1<<32|4)", x86, unix.SYS_TGKILL, []uint64{0, 0, 1<<32 | 4}, retLog},
		{"tgkill(.., .., 0xffffffff)", x86, unix.SYS_TGKILL, []uint64{0, 0, 0xffffffff}, retLog},
		{"tgkill(.., .., 1<<32|5)", x86, unix.SYS_TGKILL, []uint64{0, 0, 1<<32 | 5}, eperm},
		{"ptrace", x86, unix.SYS_PTRACE, nil, retKillProc},
		{"i386 read", unix.AUDIT_ARCH_I386, 3, nil, retKillProc},
		{"x32 read", x86, x32SyscallBit | unix.SYS_READ, nil, retKillProc},
	} {
		if got := evalOCI(t, f, tc.arch, tc.nr, tc.args...); got != tc.want {
			t.Errorf("%s: %#x, want %#x", tc.what, got, tc.want)
		}
	}

	if f, err := CompileOCI(nil); f != nil || err != nil {
		t.Errorf("CompileOCI(nil) = %v, %v; want no filter", f, err)
	}
	for _, bad := range []*specs.LinuxSeccomp{
		{DefaultAction: specs.ActNotify},
		{DefaultAction: "SCMP_ACT_BOGUS"},
		{DefaultAction: specs.ActAllow, ListenerPath: "/run/x.sock"},
		{DefaultAction: specs.ActAllow, Flags: []specs.LinuxSeccompFlag{"SECCOMP_FILTER_FLAG_TSYNC"}},
		{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{{Names: []string{"read"}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 6, Op: specs.OpEqualTo}}}}},
		{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{{Names: []string{"read"}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 0, Op: "SCMP_CMP_BOGUS"}}}}},
		{DefaultAction: specs.ActErrno, DefaultErrnoRet: ptrUint(1 << 20)},
	} {
		if _, err := CompileOCI(bad); !errors.Is(err, ErrOCIProfile) {
			t.Errorf("CompileOCI(%+v): %v, want ErrOCIProfile", bad, err)
		}
	}
}

// A profile as big as containerd's default (every x86-64 call allowed,
// many with conditions) still fits the kernel's limits: the skip jumps
// stay short and the program under 4096 instructions.
func TestCompileOCILarge(t *testing.T) {
	p := &specs.LinuxSeccomp{DefaultAction: specs.ActErrno}
	for nr, n := range syscallNames {
		if n == "" {
			continue
		}
		sc := specs.LinuxSyscall{Names: []string{n}, Action: specs.ActAllow}
		if nr%7 == 0 {
			sc.Args = []specs.LinuxSeccompArg{{Index: 0, Value: 1, Op: specs.OpNotEqual}}
		}
		p.Syscalls = append(p.Syscalls, sc)
	}
	f, err := CompileOCI(p)
	if err != nil {
		t.Fatal(err)
	}
	if got := evalOCI(t, f, unix.AUDIT_ARCH_X86_64, unix.SYS_EXECVE); got != retAllow {
		t.Errorf("execve: %#x, want allow", got)
	}
	if got := evalOCI(t, f, unix.AUDIT_ARCH_X86_64, 7*20, 1); got != retErrno|uint32(unix.EPERM) {
		t.Errorf("syscall 140 with argument 1: %#x, want EPERM", got)
	}
}

const envOCIChild = "SECCOMP_TEST_OCI_CHILD"

// TestInstallProgram installs a compiled profile in a child process with
// the real kernel: mkdir fails with the profile's errno, other calls run,
// and the filter shows in /proc/self/status.
func TestInstallProgram(t *testing.T) {
	if os.Getenv(envOCIChild) == "1" {
		runtime.LockOSThread()
		dir := t.TempDir() + "/d"
		errno := uint(unix.EACCES)
		f, err := CompileOCI(&specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{
			{Names: []string{"mkdir", "mkdirat"}, Action: specs.ActErrno, ErrnoRet: &errno}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			t.Fatal(err)
		}
		if err := InstallProgram(f.Program, f.Flags); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mkdir(dir, 0o755); err != unix.EACCES {
			t.Errorf("mkdir under the filter: %v, want EACCES", err)
		}
		if unix.Getpid() <= 0 {
			t.Error("getpid")
		}
		st, _ := os.ReadFile("/proc/thread-self/status")
		if !strings.Contains(string(st), "Seccomp:\t2") {
			t.Errorf("/proc/thread-self/status has no filter mode 2:\n%s", st)
		}
		return
	}
	if err := actionAvail(retErrno); err != nil {
		t.Skipf("no seccomp filters here: %v", err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestInstallProgram$", "-test.v")
	cmd.Env = append(os.Environ(), envOCIChild+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestInstallProgram") {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if err := InstallProgram([]byte{1, 2, 3}, 0); err == nil {
		t.Error("a program of 3 bytes installed")
	}
}
