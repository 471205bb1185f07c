package seccomp

import (
	"encoding/binary"
	"errors"
	"fmt"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// ErrOCIProfile is wrapped by CompileOCI's errors: a profile this compiler
// refuses (an unknown action, operator or flag, a notify action, an
// argument index past 5, a program too long).
var ErrOCIProfile = errors.New("seccomp: OCI profile")

// OCIFilter is an OCI seccomp profile compiled for x86-64: the BPF program
// as the kernel takes it (struct sock_filter, 8 bytes an instruction, in
// this machine's byte order) and the filter flags.
type OCIFilter struct {
	Program []byte
	Flags   uint32 // SECCOMP_FILTER_FLAG_LOG, SECCOMP_FILTER_FLAG_SPEC_ALLOW
	// Unknown are the profile's system call names this architecture does
	// not have: skipped, as runc skips them (profiles list several
	// architectures' calls).
	Unknown []string
}

// The return values of actions beyond the VMM policy's (bpf.go).
const (
	retKillThread = unix.SECCOMP_RET_KILL_THREAD
	retTrace      = unix.SECCOMP_RET_TRACE
	retLog        = unix.SECCOMP_RET_LOG
)

// Jump opcodes beyond bpf.go's.
const opJGT = unix.BPF_JMP | unix.BPF_JGT | unix.BPF_K

// CompileOCI compiles an OCI runtime spec's linux.seccomp for x86-64 (how
// the containerd shim applies a container's profile inside the guest):
//
//	load arch; not x86-64 -> kill the process
//	load nr; x32 numbers -> kill the process
//	per system call named: nr == N ? its rules in order, the first whose
//	    conditions all hold returns its action; none -> the default action
//	the default action
//
// Other architectures the profile lists (x86, x32) are not compiled: their
// calls kill the process, as libseccomp does for an architecture missing
// from a filter. Conditions compare the 64-bit arguments unsigned, as
// libseccomp does; SCMP_CMP_MASKED_EQ is (arg & value) == valueTwo.
// nil or an empty profile is no filter (nil, nil).
func CompileOCI(p *specs.LinuxSeccomp) (*OCIFilter, error) {
	if p == nil || (p.DefaultAction == "" && len(p.Syscalls) == 0) {
		return nil, nil
	}
	if p.ListenerPath != "" {
		return nil, fmt.Errorf("%w: listenerPath (SCMP_ACT_NOTIFY) is not supported", ErrOCIProfile)
	}
	out := &OCIFilter{}
	for _, f := range p.Flags {
		switch f {
		case specs.LinuxSeccompFlagLog:
			out.Flags |= unix.SECCOMP_FILTER_FLAG_LOG
		case specs.LinuxSeccompFlagSpecAllow:
			out.Flags |= unix.SECCOMP_FILTER_FLAG_SPEC_ALLOW
		default:
			return nil, fmt.Errorf("%w: flag %q is not supported", ErrOCIProfile, f)
		}
	}
	def, err := ociAction(p.DefaultAction, p.DefaultErrnoRet)
	if err != nil {
		return nil, fmt.Errorf("%w: defaultAction: %w", ErrOCIProfile, err)
	}
	nums := map[string]int{}
	for nr, n := range syscallNames {
		if n != "" {
			nums[n] = nr
		}
	}
	// The rules of each call, in the profile's order.
	var order []int
	rules := map[int][]specs.LinuxSyscall{}
	for _, sc := range p.Syscalls {
		for _, name := range sc.Names {
			nr, ok := nums[name]
			if !ok {
				out.Unknown = append(out.Unknown, name)
				continue
			}
			if _, seen := rules[nr]; !seen {
				order = append(order, nr)
			}
			rules[nr] = append(rules[nr], sc)
		}
	}

	var a asm
	// The kill returns sit right after their tests: a jump to the end of
	// a long program would not fit in a byte.
	a.ins(stmt(opLoadAbs, offArch))
	native := a.label()
	a.jeq(unix.AUDIT_ARCH_X86_64, native, next)
	a.ins(stmt(opRet, retKillProc))
	a.place(native)
	a.ins(stmt(opLoadAbs, offNr))
	notX32 := a.label()
	a.jump(opJGE, x32SyscallBit, next, notX32)
	a.ins(stmt(opRet, retKillProc))
	a.place(notX32)
	for _, nr := range order {
		skip := a.label()
		a.jeq(uint32(nr), next, skip)
		for _, sc := range rules[nr] {
			act, err := ociAction(sc.Action, sc.ErrnoRet)
			if err != nil {
				return nil, fmt.Errorf("%w: %s: %w", ErrOCIProfile, Name(nr), err)
			}
			fail := a.label()
			for _, c := range sc.Args {
				if err := a.cond(c, fail); err != nil {
					return nil, fmt.Errorf("%w: %s: %w", ErrOCIProfile, Name(nr), err)
				}
			}
			a.ins(stmt(opRet, act))
			a.place(fail)
		}
		a.ins(stmt(opRet, def)) // the accumulator may hold an argument now
		a.place(skip)
	}
	a.ins(stmt(opRet, def))
	prog, err := a.resolve()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrOCIProfile, err)
	}
	if len(prog) > maxInstructions {
		return nil, fmt.Errorf("%w: %d instructions, more than the kernel's %d", ErrOCIProfile, len(prog), maxInstructions)
	}
	out.Program = make([]byte, 0, 8*len(prog))
	for _, in := range prog {
		out.Program = binary.NativeEndian.AppendUint16(out.Program, in.Code)
		out.Program = append(out.Program, in.Jt, in.Jf)
		out.Program = binary.NativeEndian.AppendUint32(out.Program, in.K)
	}
	return out, nil
}

// ociAction is the filter return value of an OCI action; errnoRet (EPERM
// when nil) goes with SCMP_ACT_ERRNO and SCMP_ACT_TRACE.
func ociAction(a specs.LinuxSeccompAction, errnoRet *uint) (uint32, error) {
	errno := uint32(unix.EPERM)
	if errnoRet != nil {
		if *errnoRet > retDataMask {
			return 0, fmt.Errorf("errnoRet %d out of range", *errnoRet)
		}
		errno = uint32(*errnoRet)
	}
	switch a {
	case specs.ActAllow:
		return retAllow, nil
	case specs.ActErrno:
		return retErrno | errno, nil
	case specs.ActTrace:
		return retTrace | errno, nil
	case specs.ActKill, specs.ActKillThread:
		return retKillThread, nil
	case specs.ActKillProcess:
		return retKillProc, nil
	case specs.ActTrap:
		return retTrap, nil
	case specs.ActLog:
		return retLog, nil
	case specs.ActNotify:
		return 0, errors.New("SCMP_ACT_NOTIFY is not supported (no listener)")
	}
	return 0, fmt.Errorf("unknown action %q", a)
}

// cond emits one argument condition: it falls through when the condition
// holds and jumps to fail when it does not. The 64-bit argument is
// compared as two 32-bit words, the high one first.
func (a *asm) cond(c specs.LinuxSeccompArg, fail string) error {
	if c.Index > 5 {
		return fmt.Errorf("argument index %d (want 0 to 5)", c.Index)
	}
	i := int(c.Index)
	hi, lo := uint32(c.Value>>32), uint32(c.Value)
	pass := a.label()
	switch c.Op {
	case specs.OpEqualTo:
		a.ins(stmt(opLoadAbs, argHigh(i)))
		a.jeq(hi, next, fail)
		a.ins(stmt(opLoadAbs, argLow(i)))
		a.jeq(lo, next, fail)
	case specs.OpNotEqual:
		a.ins(stmt(opLoadAbs, argHigh(i)))
		a.jeq(hi, next, pass)
		a.ins(stmt(opLoadAbs, argLow(i)))
		a.jeq(lo, fail, next)
	case specs.OpMaskedEqual:
		// libseccomp: (arg & datum_a) == datum_b, with value as datum_a.
		whi, wlo := uint32(c.ValueTwo>>32), uint32(c.ValueTwo)
		a.ins(stmt(opLoadAbs, argHigh(i)))
		a.ins(stmt(opAnd, hi))
		a.jeq(whi, next, fail)
		a.ins(stmt(opLoadAbs, argLow(i)))
		a.ins(stmt(opAnd, lo))
		a.jeq(wlo, next, fail)
	case specs.OpGreaterThan, specs.OpGreaterEqual, specs.OpLessThan, specs.OpLessEqual:
		// Greater: the high word decides unless equal, then the low one.
		// Less is the negation of greater-or-equal (and so on), with the
		// two exits swapped.
		yes, no := pass, fail
		if c.Op == specs.OpLessThan || c.Op == specs.OpLessEqual {
			yes, no = fail, pass
		}
		lowOp := uint16(opJGT)
		if c.Op == specs.OpGreaterEqual || c.Op == specs.OpLessThan {
			lowOp = opJGE
		}
		a.ins(stmt(opLoadAbs, argHigh(i)))
		a.jump(opJGT, hi, yes, next)
		a.jeq(hi, next, no)
		a.ins(stmt(opLoadAbs, argLow(i)))
		a.jump(lowOp, lo, yes, no)
	default:
		return fmt.Errorf("unknown operator %q", c.Op)
	}
	a.place(pass)
	return nil
}

// next, as a jump target, is the instruction after the jump.
const next = ""

// asm assembles a program whose conditional jumps name labels, resolved
// once every label is placed; a jump farther than 255 instructions is an
// error (classic BPF's jt and jf are a byte).
type asm struct {
	prog   []unix.SockFilter
	jt, jf []string       // per instruction: target labels ("" next)
	at     map[string]int // label -> instruction index
	n      int            // labels made
}

func (a *asm) ins(in unix.SockFilter) {
	a.prog = append(a.prog, in)
	a.jt, a.jf = append(a.jt, next), append(a.jf, next)
}

func (a *asm) jump(op uint16, k uint32, jt, jf string) {
	a.prog = append(a.prog, jump(op, k, 0, 0))
	a.jt, a.jf = append(a.jt, jt), append(a.jf, jf)
}

func (a *asm) jeq(k uint32, jt, jf string) { a.jump(opJEq, k, jt, jf) }

// label makes a fresh label name.
func (a *asm) label() string {
	a.n++
	return fmt.Sprintf("L%d", a.n)
}

// place puts label l at the next instruction.
func (a *asm) place(l string) {
	if a.at == nil {
		a.at = map[string]int{}
	}
	a.at[l] = len(a.prog)
}

func (a *asm) resolve() ([]unix.SockFilter, error) {
	off := func(i int, l string) (uint8, error) {
		if l == next {
			return 0, nil
		}
		t, ok := a.at[l]
		if !ok {
			return 0, fmt.Errorf("jump to an unplaced label %s", l)
		}
		d := t - (i + 1)
		if d < 0 || d > maxJump {
			return 0, fmt.Errorf("a jump of %d instructions (a rule too long)", d)
		}
		return uint8(d), nil
	}
	for i := range a.prog {
		var err error
		if a.prog[i].Jt, err = off(i, a.jt[i]); err != nil {
			return nil, err
		}
		if a.prog[i].Jf, err = off(i, a.jf[i]); err != nil {
			return nil, err
		}
	}
	return a.prog, nil
}
