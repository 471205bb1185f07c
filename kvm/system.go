package kvm

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// DevicePath is where the KVM device node lives.
const DevicePath = "/dev/kvm"

// ErrUnavailable is returned (wrapped) when KVM cannot be used at all: the
// device is missing or not accessible, or the API version is wrong.
var ErrUnavailable = errors.New("KVM is not available")

// ErrMissingCapability is returned (wrapped) when KVM lacks a capability
// microvm needs.
var ErrMissingCapability = errors.New("KVM lacks a required capability")

// RequiredCaps are the capabilities a VM needs: memory slots, the in-kernel
// irqchip and PIT, and the eventfd plumbing used for virtio kicks (ioeventfd)
// and interrupts (irqfd).
var RequiredCaps = []Cap{CapUserMemory, CapIRQChip, CapPIT2, CapIRQFD, CapIOEventFD, CapSetTSSAddr, CapExtCPUID, CapImmediateExit}

// System is an open /dev/kvm.
type System struct {
	f        *os.File
	once     sync.Once
	mmapSize int
}

// Open opens /dev/kvm and checks the API version and RequiredCaps.
func Open() (*System, error) {
	return OpenPath(DevicePath)
}

// openHint says what to do about a /dev/kvm that cannot be opened.
func openHint(err error) string {
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENODEV), errors.Is(err, unix.ENXIO):
		return " (this host offers no KVM: enable virtualization and load kvm_intel or kvm_amd, " +
			"or, from a microvm checkout, run it in the nested-KVM box: scripts/kvmbox -- bin/microvm run ...)"
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return " (no permission: run as root or join the group that owns /dev/kvm, usually kvm)"
	}
	return ""
}

// OpenPath is Open for a device node at another path (tests).
func OpenPath(path string) (*System, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err // name the path once
		}
		return nil, fmt.Errorf("%w: open %s: %w%s", ErrUnavailable, path, err, openHint(err))
	}
	s := &System{f: f}
	v, err := ioctl(s.fd(), kvmGetAPIVersion, 0)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("%w: KVM_GET_API_VERSION: %w", ErrUnavailable, err)
	}
	if v != expectedAPIVersion {
		s.Close()
		return nil, fmt.Errorf("%w: API version %d, want %d", ErrUnavailable, v, expectedAPIVersion)
	}
	if err := s.Require(RequiredCaps...); err != nil {
		s.Close()
		return nil, err
	}
	n, err := ioctl(s.fd(), kvmGetVCPUMmapSize, 0)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("kvm: KVM_GET_VCPU_MMAP_SIZE: %w", err)
	}
	if n < runMinSize {
		s.Close()
		return nil, fmt.Errorf("kvm: vCPU mmap size %d is smaller than struct kvm_run", n)
	}
	s.mmapSize = int(n)
	return s, nil
}

func (s *System) fd() uintptr { return s.f.Fd() }

// Close closes /dev/kvm. VMs created from it stay usable.
func (s *System) Close() error {
	var err error
	s.once.Do(func() { err = s.f.Close() })
	return err
}

// CheckExtension returns KVM_CHECK_EXTENSION's answer for c: 0 when
// unsupported, otherwise a capability-specific positive value.
func (s *System) CheckExtension(c Cap) int {
	r, err := ioctl(s.fd(), kvmCheckExtension, uintptr(c))
	if err != nil {
		return 0
	}
	return int(r)
}

// Require checks that every capability in caps is present and names all the
// missing ones in its error.
func (s *System) Require(caps ...Cap) error {
	var missing []string
	for _, c := range caps {
		if s.CheckExtension(c) <= 0 {
			missing = append(missing, c.String())
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %v", ErrMissingCapability, missing)
	}
	return nil
}

// MaxVCPUs is the largest number of vCPUs a VM may have.
func (s *System) MaxVCPUs() int {
	if n := s.CheckExtension(CapMaxVCPUs); n > 0 {
		return n
	}
	if n := s.CheckExtension(CapNrVCPUs); n > 0 {
		return n
	}
	return 4 // the documented default when neither capability answers
}

// SupportedCPUID returns KVM_GET_SUPPORTED_CPUID: the CPUID leaves KVM can
// present to a guest, a starting point for each vCPU's table.
func (s *System) SupportedCPUID() (CPUID, error) {
	c := &cpuid2{Nent: maxCPUIDEntries}
	if _, err := ioctlPtr(s.fd(), kvmGetSupportedCPUID, c); err != nil {
		return nil, fmt.Errorf("kvm: KVM_GET_SUPPORTED_CPUID: %w", err)
	}
	if c.Nent > maxCPUIDEntries {
		return nil, fmt.Errorf("kvm: KVM_GET_SUPPORTED_CPUID returned %d entries", c.Nent)
	}
	return append(CPUID(nil), c.Entries[:c.Nent]...), nil
}

// CreateVM creates a VM with no memory, irqchip or vCPUs yet.
func (s *System) CreateVM() (*VM, error) {
	fd, err := ioctl(s.fd(), kvmCreateVM, 0)
	if err != nil {
		return nil, fmt.Errorf("kvm: KVM_CREATE_VM: %w", err)
	}
	return &VM{f: os.NewFile(fd, "kvm-vm"), mmapSize: s.mmapSize}, nil
}

// MSRIndexList returns KVM_GET_MSR_INDEX_LIST: the MSRs KVM supports and a
// VMM should save and restore with a vCPU's state (VCPU.SaveState), the
// architectural ones the host has and KVM's own (kvmclock, async PF, ...).
// Some may still be unreadable on a given vCPU (VCPU.ReadMSRs skips those).
func (s *System) MSRIndexList() ([]uint32, error) {
	// Ask with no room first: KVM answers E2BIG and says how many there are.
	n := uint32(0)
	for range 8 {
		// struct kvm_msr_list: nmsrs, then the indices.
		buf := make([]uint32, 1+n)
		buf[0] = n
		_, err := ioctlPtr(s.fd(), kvmGetMSRIndexList, &buf[0])
		switch {
		case errors.Is(err, unix.E2BIG) && buf[0] > n:
			n = buf[0] // KVM says how many there are: ask again with room for them
			continue
		case err != nil:
			return nil, fmt.Errorf("kvm: KVM_GET_MSR_INDEX_LIST: %w", err)
		case buf[0] > n:
			return nil, fmt.Errorf("kvm: KVM_GET_MSR_INDEX_LIST returned %d indices for room for %d", buf[0], n)
		}
		return append([]uint32(nil), buf[1:1+buf[0]]...), nil
	}
	return nil, fmt.Errorf("kvm: KVM_GET_MSR_INDEX_LIST: the list kept growing (last %d)", n)
}
