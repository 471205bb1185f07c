package vmm

import (
	"strings"
	"testing"

	"github.com/microvm/microvm/kvm"
)

// TestCheckCPUID: a restore refuses saved CPUID that lists a feature the
// host's KVM does not offer, and accepts the bits the machine or KVM set
// themselves (HTT, hypervisor, TSC deadline, OSXSAVE, ...) and leaves the
// leaves that list no features alone.
func TestCheckCPUID(t *testing.T) {
	host := kvm.CPUID{
		{Function: 1, ECX: 1 << 13, EDX: 1 << 4},
		{Function: 7, EBX: 1 << 5},
		{Function: 0x8000_0001, EDX: 1 << 27},
	}
	ok := kvm.CPUID{
		{Function: 0, EAX: 0x16, EBX: 0x756e6547},
		{Function: 1, EBX: 0xff01_0800, ECX: 1<<13 | 1<<24 | 1<<27 | 1<<31, EDX: 1<<4 | 1<<28},
		{Function: 7, EBX: 1 << 5},
		{Function: 0x4000_0010, EAX: 2_000_000},
	}
	if err := checkCPUID(ok, host); err != nil {
		t.Errorf("a guest of this host: %v", err)
	}
	// A PVM host's vCPUs report the host CPU's bits, beyond KVM's table.
	reported := kvm.CPUID{{Function: 7, EBX: 1<<5 | 1<<16}}
	if err := checkCPUID(kvm.CPUID{{Function: 7, EBX: 1<<5 | 1<<16}}, host, reported); err != nil {
		t.Errorf("bits a vCPU of this host reports: %v", err)
	}
	for _, tc := range []struct {
		name  string
		saved kvm.CPUID
		want  string
	}{
		{"AVX2 the host lacks", kvm.CPUID{{Function: 7, EBX: 1<<5 | 1<<16}}, "7.0.EBX bits 0x10000"},
		{"RDTSCP the host lacks", kvm.CPUID{{Function: 0x8000_0001, EDX: 1<<27 | 1<<26}}, "0x80000001.EDX bits 0x4000000"},
		{"a leaf the host has not", kvm.CPUID{{Function: 7, Index: 0, EDX: 1}}, "7.0.EDX bits 0x1"},
	} {
		if err := checkCPUID(tc.saved, host); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error naming %s", tc.name, err, tc.want)
		}
	}
}
