package seccomp

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Policy is an allow-list: the system calls a process may make once the
// filter is installed, some of them only with given arguments. Every other
// call, and every call made through another architecture's entry point, is
// forbidden. VMM and VhostUserVsock build the policies microvm uses.
type Policy struct {
	name  string
	rules []rule
}

// Name says which process the policy is for ("microvm run"), as messages
// show it.
func (p Policy) Name() string { return p.name }

// rule allows one system call when every condition in args holds (a rule
// without conditions allows every call of nr), or, with errno set, makes it
// fail with that errno without running it.
type rule struct {
	nr    int
	args  []cond
	errno unix.Errno
	// why says who needs the call, for the policy's reader and tests.
	why string
}

// cond is a condition on one 32-bit word of the arguments:
// word&mask must be one of values. A 64-bit argument compared whole is two
// conds, one per half.
type cond struct {
	off    uint32 // offset in seccomp_data: argLow(i) or argHigh(i)
	mask   uint32 // 0xffffffff: the whole word
	values []uint32
}

// allow allows every call of nr.
func allow(nr int, why string) rule { return rule{nr: nr, why: why} }

// allowIf allows nr when every condition holds.
func allowIf(nr int, why string, cs ...cond) rule { return rule{nr: nr, args: cs, why: why} }

// fail makes nr return errno without running.
func fail(nr int, errno unix.Errno, why string) rule { return rule{nr: nr, errno: errno, why: why} }

// argIn: the low 32 bits of argument i are one of values. For arguments the
// kernel declares int or unsigned int (a file descriptor, a socket domain,
// an ioctl request) the kernel itself ignores the high half, so the filter
// does too.
func argIn(i int, values ...uint32) cond {
	return cond{off: argLow(i), mask: 0xffff_ffff, values: values}
}

// arg64In: argument i, all 64 bits, is one of values, each below 2^32
// (for unsigned long arguments such as clone's flags): the low half is one
// of them and the high half is zero.
func arg64In(i int, values ...uint32) []cond {
	return []cond{
		{off: argLow(i), mask: 0xffff_ffff, values: values},
		{off: argHigh(i), mask: 0xffff_ffff, values: []uint32{0}},
	}
}

// argClear: the bits of mask are clear in the low 32 bits of argument i.
func argClear(i int, mask uint32) cond {
	return cond{off: argLow(i), mask: mask, values: []uint32{0}}
}

// errPolicy marks a policy the compiler cannot turn into a program.
var errPolicy = errors.New("seccomp: bad policy")

// compile turns p into a classic BPF program for the architecture arch
// (an AUDIT_ARCH_* value) whose forbidden calls return deny. Layout:
//
//	load arch; wrong architecture -> deny
//	load nr; x32 numbers -> deny
//	per rule: nr == rule.nr ? (conditions ? allow : deny) : next rule
//	deny
//
// Every jump is forward and short: a rule's block ends in a return, so the
// accumulator still holds nr wherever a rule is skipped. The kernel's
// per-architecture action cache (Linux 5.11+) recognises the rules without
// conditions and lets those calls bypass the filter altogether.
func compile(p Policy, arch uint32, deny uint32) ([]unix.SockFilter, error) {
	prog := []unix.SockFilter{
		stmt(opLoadAbs, offArch),
		jump(opJEq, arch, 1, 0),
		stmt(opRet, deny),
		stmt(opLoadAbs, offNr),
		jump(opJGE, x32SyscallBit, 0, 1),
		stmt(opRet, deny),
	}
	seen := map[int]bool{}
	for _, r := range p.rules {
		if r.nr < 0 || r.nr >= x32SyscallBit {
			return nil, fmt.Errorf("%w: system call number %d", errPolicy, r.nr)
		}
		if seen[r.nr] {
			return nil, fmt.Errorf("%w: %s has two rules", errPolicy, Name(r.nr))
		}
		seen[r.nr] = true
		if r.errno != 0 && (len(r.args) > 0 || r.errno > retDataMask) {
			return nil, fmt.Errorf("%w: %s: errno %d with conditions or out of range", errPolicy, Name(r.nr), r.errno)
		}
		block, err := ruleBlock(r, deny)
		if err != nil {
			return nil, err
		}
		if len(block) > maxJump {
			return nil, fmt.Errorf("%w: %s: %d instructions of conditions, more than a jump reaches", errPolicy, Name(r.nr), len(block))
		}
		prog = append(prog, jump(opJEq, uint32(r.nr), 0, uint8(len(block))))
		prog = append(prog, block...)
	}
	prog = append(prog, stmt(opRet, deny))
	if len(prog) > maxInstructions {
		return nil, fmt.Errorf("%w: %d instructions, more than the kernel's %d", errPolicy, len(prog), maxInstructions)
	}
	return prog, nil
}

// ruleBlock is what runs once nr matched r: a return for a rule without
// conditions, else each condition in turn (load the word, mask it, compare
// with each value; no match returns deny) and a final allow.
func ruleBlock(r rule, deny uint32) ([]unix.SockFilter, error) {
	switch {
	case r.errno != 0:
		return []unix.SockFilter{stmt(opRet, retErrno|uint32(r.errno))}, nil
	case len(r.args) == 0:
		return []unix.SockFilter{stmt(opRet, retAllow)}, nil
	}
	var b []unix.SockFilter
	for _, c := range r.args {
		n := len(c.values)
		if n == 0 || n >= maxJump || c.mask == 0 || c.off < offArgs || c.off >= sizeofData || c.off%4 != 0 {
			return nil, fmt.Errorf("%w: %s: malformed argument condition %+v", errPolicy, Name(r.nr), c)
		}
		b = append(b, stmt(opLoadAbs, c.off))
		if c.mask != 0xffff_ffff {
			b = append(b, stmt(opAnd, c.mask))
		}
		for i, v := range c.values {
			if v&^c.mask != 0 {
				return nil, fmt.Errorf("%w: %s: value %#x has bits outside mask %#x", errPolicy, Name(r.nr), v, c.mask)
			}
			// Match: skip the remaining compares and the deny, to
			// the next condition (or the final allow).
			b = append(b, jump(opJEq, v, uint8(n-i), 0))
		}
		b = append(b, stmt(opRet, deny))
	}
	return append(b, stmt(opRet, retAllow)), nil
}
