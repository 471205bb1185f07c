package main

import (
	"fmt"
	"os"
	"runtime"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/kvm"
	"github.com/microvm/microvm/kvm/guestmem"
)

// floorOK is what a successful kvm-floor child prints.
const floorOK = "kvm-floor: guest wrote 0 to port 0xf4"

// floorGuest is real-mode code at 0x1000: mov al, 0; out 0xf4, al; hlt.
var floorGuest = []byte{0xb0, 0x00, 0xe6, 0xf4, 0xf4}

// kvmFloor does what any KVM VMM must to run a guest to its first exit and
// tear it down, with the same memory size as the VMMs measured, and returns
// the process exit status. It uses the kvm package directly: no loader, no
// devices, no logging, no CLI.
func kvmFloor(size string, split bool) int {
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "kvm-floor: %v\n", err)
		return 1
	}
	memBytes, err := microvm.ParseSize(size)
	if err != nil {
		return fail(err)
	}
	runtime.LockOSThread()
	sys, err := kvm.Open()
	if err != nil {
		return fail(err)
	}
	defer sys.Close()
	vm, err := sys.CreateVM()
	if err != nil {
		return fail(err)
	}
	defer vm.Close()
	mem, err := guestmem.NewAnonymous(guestmem.Range{GPA: 0, Size: memBytes})
	if err != nil {
		return fail(err)
	}
	defer mem.Close()
	if err := mem.Write(0x1000, floorGuest); err != nil {
		return fail(err)
	}
	host, err := mem.HostAddr(0)
	if err != nil {
		return fail(err)
	}
	// Memory before the irqchip, as microvm does (see machine.go).
	if err := vm.SetMemoryRegion(0, 0, memBytes, host); err != nil {
		return fail(err)
	}
	steps := []func() error{func() error { return vm.SetTSSAddr(0xfffb_d000) }, vm.CreateIRQChip, vm.CreatePIT2}
	if split {
		steps = []func() error{func() error { return vm.SetTSSAddr(0xfffb_d000) }, func() error { return vm.EnableSplitIRQChip(24) }}
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return fail(err)
		}
	}
	v, err := vm.CreateVCPU(0)
	if err != nil {
		return fail(err)
	}
	defer v.Close()
	v.BindThread()
	sr, err := v.Sregs()
	if err != nil {
		return fail(err)
	}
	sr.CS.Base, sr.CS.Selector = 0, 0
	if err := v.SetSregs(sr); err != nil {
		return fail(err)
	}
	if err := v.SetRegs(kvm.Regs{RIP: 0x1000, RFLAGS: 2}); err != nil {
		return fail(err)
	}
	for {
		reason, err := v.Run()
		if err != nil {
			return fail(err)
		}
		if reason == kvm.ExitIntr {
			continue
		}
		io, err := v.IO()
		if reason != kvm.ExitIO || err != nil || io.Port != 0xf4 || len(io.Data) != 1 || io.Data[0] != 0 {
			return fail(fmt.Errorf("unexpected exit %v (%+v, %v)", reason, io, err))
		}
		fmt.Println(floorOK)
		return 0
	}
}
