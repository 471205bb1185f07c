package vmm

import (
	"testing"

	"github.com/microvm/microvm/kvm"
)

// TestIsResetState: the triple-fault log flags registers that are the
// processor's reset values (what KVM on AMD SVM hands back after a
// shutdown intercept), and only those.
func TestIsResetState(t *testing.T) {
	reset := func() (kvm.Regs, kvm.Sregs) {
		var r kvm.Regs
		var s kvm.Sregs
		r.RIP, r.RDX = 0xfff0, 0x800f12
		s.CS.Selector, s.CS.Base = 0xf000, 0xffff0000
		s.CR0 = 0x60000010
		return r, s
	}
	for _, tc := range []struct {
		name string
		edit func(*kvm.Regs, *kvm.Sregs)
		want bool
	}{
		{"reset values", func(*kvm.Regs, *kvm.Sregs) {}, true},
		{"long-mode kernel", func(r *kvm.Regs, s *kvm.Sregs) {
			r.RIP, s.CS.Selector, s.CS.Base, s.CR0 = 0xffffffff81000000, 0x10, 0, 0x80050033
		}, false},
		{"other rip", func(r *kvm.Regs, _ *kvm.Sregs) { r.RIP = 0xfff1 }, false},
		{"real-mode code at fff0 of segment 0", func(_ *kvm.Regs, s *kvm.Sregs) { s.CS.Selector, s.CS.Base = 0, 0 }, false},
		{"protected mode", func(_ *kvm.Regs, s *kvm.Sregs) { s.CR0 |= 1 }, false},
	} {
		r, s := reset()
		tc.edit(&r, &s)
		if got := isResetState(&r, &s); got != tc.want {
			t.Errorf("%s: isResetState = %v, want %v", tc.name, got, tc.want)
		}
	}
}
