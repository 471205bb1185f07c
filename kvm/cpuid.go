package kvm

import (
	"fmt"
	"sort"
	"strings"
)

// CPUID is a vCPU's CPUID table (the entries of a struct kvm_cpuid2).
type CPUID []CPUIDEntry

// Reg names a CPUID output register.
type Reg int

// CPUID output registers.
const (
	EAX Reg = iota
	EBX
	ECX
	EDX
)

// Feature is one CPUID feature bit.
type Feature struct {
	Leaf, Subleaf uint32
	Reg           Reg
	Bit           uint
}

// Features that can be hidden from the guest by name (--cpu-hide). The names
// are those of /proc/cpuinfo.
var Features = map[string]Feature{
	"cx16":   {1, 0, ECX, 13},
	"x2apic": {1, 0, ECX, 21},
	"movbe":  {1, 0, ECX, 22},
	"popcnt": {1, 0, ECX, 23},
	"aes":    {1, 0, ECX, 25},
	"xsave":  {1, 0, ECX, 26},
	"avx":    {1, 0, ECX, 28},
	"rdrand": {1, 0, ECX, 30},
	// Announced by microvm itself when KVM emulates it (TSCDeadline).
	"tsc_deadline_timer": {1, 0, ECX, 24},
	"mtrr":               {1, 0, EDX, 12},
	"pge":                {1, 0, EDX, 13},
	"fsgsbase":           {7, 0, EBX, 0},
	"avx2":               {7, 0, EBX, 5},
	"smep":               {7, 0, EBX, 7},
	"erms":               {7, 0, EBX, 9},
	"invpcid":            {7, 0, EBX, 10},
	"avx512f":            {7, 0, EBX, 16},
	"smap":               {7, 0, EBX, 20},
	"pku":                {7, 0, ECX, 3},
	"la57":               {7, 0, ECX, 16},
	"rdpid":              {7, 0, ECX, 22},
	"pdpe1gb":            {0x80000001, 0, EDX, 26},
	"rdtscp":             {0x80000001, 0, EDX, 27},
}

// FeatureNames lists the names Features knows, sorted.
func FeatureNames() []string {
	names := make([]string, 0, len(Features))
	for n := range Features {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// ParseFeatures turns a comma-separated list of feature names into Features.
func ParseFeatures(list string) ([]Feature, error) {
	var out []Feature
	for _, n := range strings.Split(list, ",") {
		n = strings.ToLower(strings.TrimSpace(n))
		if n == "" {
			continue
		}
		f, ok := Features[n]
		if !ok {
			return nil, fmt.Errorf("unknown CPU feature %q (known: %s)", n, strings.Join(FeatureNames(), ", "))
		}
		out = append(out, f)
	}
	return out, nil
}

// Find returns the entry for leaf/subleaf, or nil. Leaves that are not indexed
// match any subleaf.
func (c CPUID) Find(leaf, subleaf uint32) *CPUIDEntry {
	for i := range c {
		e := &c[i]
		if e.Function != leaf {
			continue
		}
		if e.Flags&cpuidFlagSignificantIndex == 0 || e.Index == subleaf {
			return e
		}
	}
	return nil
}

const cpuidFlagSignificantIndex = 1 // KVM_CPUID_FLAG_SIGNIFCANT_INDEX

// Get returns register r of the entry.
func (e *CPUIDEntry) Get(r Reg) uint32 { return *e.reg(r) }

func (e *CPUIDEntry) reg(r Reg) *uint32 {
	switch r {
	case EAX:
		return &e.EAX
	case EBX:
		return &e.EBX
	case ECX:
		return &e.ECX
	default:
		return &e.EDX
	}
}

// Has reports whether feature f is present.
func (c CPUID) Has(f Feature) bool {
	e := c.Find(f.Leaf, f.Subleaf)
	return e != nil && *e.reg(f.Reg)&(1<<f.Bit) != 0
}

// Hide clears feature f.
func (c CPUID) Hide(f Feature) {
	if e := c.Find(f.Leaf, f.Subleaf); e != nil {
		*e.reg(f.Reg) &^= 1 << f.Bit
	}
}

// TSCDeadline is CPUID.1:ECX[24], the local APIC's TSC-deadline timer mode.
// KVM emulates it whenever KVM_CAP_TSC_DEADLINE_TIMER is present but leaves
// it out of KVM_GET_SUPPORTED_CPUID: the VMM announces it (QEMU, Firecracker
// and Cloud Hypervisor all do). Without it Linux calibrates its LAPIC timer
// against the PIT, which a split irqchip does not have, and stops at its
// first sleep ("APIC timer disabled due to verification failure").
var TSCDeadline = Feature{1, 0, ECX, 24}

// Show sets feature f: the counterpart of Hide, for bits KVM emulates but
// does not report as supported.
func (c CPUID) Show(f Feature) {
	if e := c.Find(f.Leaf, f.Subleaf); e != nil {
		*e.reg(f.Reg) |= 1 << f.Bit
	}
}

// Hypervisor CPUID leaves (Linux Documentation/virt/kvm/x86/cpuid.rst).
const (
	leafHypervisorBase = 0x40000000
	// leafTiming is the timing leaf hypervisors (VMware, QEMU with
	// vmware-cpuid-freq) provide: EAX = TSC kHz, EBX = APIC bus kHz.
	leafTiming = 0x40000010
)

// WithTSCFrequency returns a copy of c that announces the TSC frequency in
// the hypervisor timing leaf 0x40000010 (raising the hypervisor leaf range to
// include it), so guests need not calibrate the TSC against a timer.
func (c CPUID) WithTSCFrequency(tscKHz, apicBusKHz uint32) CPUID {
	out := make(CPUID, 0, len(c)+1)
	for _, e := range c {
		if e.Function == leafTiming {
			continue
		}
		if e.Function == leafHypervisorBase && e.EAX < leafTiming {
			e.EAX = leafTiming
		}
		out = append(out, e)
	}
	return append(out, CPUIDEntry{Function: leafTiming, EAX: tscKHz, EBX: apicBusKHz})
}

// ForVCPU returns a copy of c adjusted for vCPU id of n: its APIC id in leaf 1
// and in the x2APIC topology leaves 0xB/0x1F, the logical processor count, and
// the hypervisor-present bit.
func (c CPUID) ForVCPU(id, n int) CPUID {
	out := append(CPUID(nil), c...)
	for i := range out {
		e := &out[i]
		switch e.Function {
		case 1:
			e.EBX = e.EBX&0x0000ffff | uint32(id)<<24 | uint32(min(n, 255))<<16
			e.EDX |= 1 << 28 // HTT: the count in EBX[23:16] is valid
			e.ECX |= 1 << 31 // hypervisor present
		case 0xb, 0x1f:
			e.EDX = uint32(id)
		}
	}
	return out
}
