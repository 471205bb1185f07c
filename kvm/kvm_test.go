package kvm

import (
	"errors"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/internal/testing/testenv"
)

// TestLayoutSizes checks every struct that mirrors a kernel layout against
// sizeof() of the C struct (x86-64, include/uapi/linux/kvm.h).
func TestLayoutSizes(t *testing.T) {
	tests := []struct {
		name string
		got  uintptr
		want uintptr
	}{
		{"kvm_regs", unsafe.Sizeof(Regs{}), 144},
		{"kvm_sregs", unsafe.Sizeof(Sregs{}), 312},
		{"kvm_segment", unsafe.Sizeof(Segment{}), 24},
		{"kvm_dtable", unsafe.Sizeof(DTable{}), 16},
		{"kvm_fpu", unsafe.Sizeof(FPU{}), 416},
		{"kvm_lapic_state", unsafe.Sizeof(LAPICState{}), 1024},
		{"kvm_msr_entry", unsafe.Sizeof(MSR{}), 16},
		{"kvm_cpuid_entry2", unsafe.Sizeof(CPUIDEntry{}), 40},
		{"kvm_userspace_memory_region", unsafe.Sizeof(userspaceMemoryRegion{}), 32},
		{"kvm_irqfd", unsafe.Sizeof(irqfd{}), 32},
		{"kvm_ioeventfd", unsafe.Sizeof(ioeventfd{}), 64},
		{"kvm_pit_config", unsafe.Sizeof(pitConfig{}), 64},
		{"kvm_irq_level", unsafe.Sizeof(irqLevel{}), 8},
		{"kvm_mp_state", unsafe.Sizeof(mpState{}), 4},
		{"kvm_enable_cap", unsafe.Sizeof(enableCap{}), 104},
		{"kvm_irq_routing_entry", unsafe.Sizeof(irqRoutingEntry{}), 48},
		{"kvm_irq_routing header", unsafe.Offsetof(irqRouting{}.Entries), 8},
		{"kvm_msi", unsafe.Sizeof(kvmMSI{}), 32},
		{"kvm_cpuid2 header", unsafe.Offsetof(cpuid2{}.Entries), 8},
		{"kvm_msrs header", unsafe.Offsetof(msrs{}.Entries), 8},
		{"kvm_xsave", unsafe.Sizeof(XSAVE{}), 4096},
		{"kvm_xcr", unsafe.Sizeof(XCR{}), 16},
		{"kvm_xcrs", unsafe.Sizeof(XCRs{}), 392},
		{"kvm_vcpu_events", unsafe.Sizeof(VCPUEvents{}), 64},
		{"kvm_vcpu_events.sipi_vector", unsafe.Offsetof(VCPUEvents{}.SIPIVector), 16},
		{"kvm_vcpu_events.flags", unsafe.Offsetof(VCPUEvents{}.Flags), 20},
		{"kvm_vcpu_events.smi", unsafe.Offsetof(VCPUEvents{}.SMI), 24},
		{"kvm_vcpu_events.triple_fault", unsafe.Offsetof(VCPUEvents{}.TripleFault), 28},
		{"kvm_vcpu_events.exception_has_payload", unsafe.Offsetof(VCPUEvents{}.ExceptionHasPayload), 55},
		{"kvm_vcpu_events.exception_payload", unsafe.Offsetof(VCPUEvents{}.ExceptionPayload), 56},
		{"kvm_debugregs", unsafe.Sizeof(DebugRegs{}), 128},
		{"kvm_clock_data", unsafe.Sizeof(ClockData{}), 48},
		{"kvm_irqchip", unsafe.Sizeof(IRQChip{}), 520},
		{"kvm_pic_state", unsafe.Sizeof(PICState{}), 16},
		{"kvm_ioapic_state", unsafe.Sizeof(IOAPICState{}), 216},
		{"kvm_ioapic_state.redirtbl", unsafe.Offsetof(IOAPICState{}.RedirTbl), 24},
		{"kvm_pit_channel_state", unsafe.Sizeof(PITChannelState{}), 24},
		{"kvm_pit_channel_state.count_load_time", unsafe.Offsetof(PITChannelState{}.CountLoadTime), 16},
		{"kvm_pit_state2", unsafe.Sizeof(PITState2{}), 112},
		{"kvm_dirty_log", unsafe.Sizeof(dirtyLog{}), 16},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("%s: Go size %d, kernel size %d", tc.name, tc.got, tc.want)
		}
	}
}

// TestIoctlNumbers pins the request numbers to the values <linux/kvm.h>
// produces (printed by a C program on x86-64).
func TestIoctlNumbers(t *testing.T) {
	tests := map[string][2]uint64{
		"KVM_GET_API_VERSION":        {kvmGetAPIVersion, 0xae00},
		"KVM_CREATE_VM":              {kvmCreateVM, 0xae01},
		"KVM_GET_SUPPORTED_CPUID":    {kvmGetSupportedCPUID, 0xc008ae05},
		"KVM_SET_USER_MEMORY_REGION": {kvmSetUserMemoryRegion, 0x4020ae46},
		"KVM_IRQFD":                  {kvmIRQFD, 0x4020ae76},
		"KVM_CREATE_PIT2":            {kvmCreatePIT2, 0x4040ae77},
		"KVM_IOEVENTFD":              {kvmIOEventFD, 0x4040ae79},
		"KVM_RUN":                    {kvmRun, 0xae80},
		"KVM_GET_REGS":               {kvmGetRegs, 0x8090ae81},
		"KVM_SET_SREGS":              {kvmSetSregs, 0x4138ae84},
		"KVM_GET_MSRS":               {kvmGetMSRs, 0xc008ae88},
		"KVM_SET_MSRS":               {kvmSetMSRs, 0x4008ae89},
		"KVM_GET_FPU":                {kvmGetFPU, 0x81a0ae8c},
		"KVM_SET_LAPIC":              {kvmSetLAPIC, 0x4400ae8f},
		"KVM_SET_CPUID2":             {kvmSetCPUID2, 0x4008ae90},
		"KVM_GET_MP_STATE":           {kvmGetMPState, 0x8004ae98},
		"KVM_GET_TSC_KHZ":            {kvmGetTSCKHz, 0xaea3},
		"KVM_ENABLE_CAP":             {kvmEnableCap, 0x4068aea3},
		"KVM_SET_GSI_ROUTING":        {kvmSetGSIRouting, 0x4008ae6a},
		"KVM_SIGNAL_MSI":             {kvmSignalMSI, 0x4020aea5},
		"KVM_GET_MSR_INDEX_LIST":     {kvmGetMSRIndexList, 0xc004ae02},
		"KVM_GET_DIRTY_LOG":          {kvmGetDirtyLog, 0x4010ae42},
		"KVM_GET_IRQCHIP":            {kvmGetIRQChip, 0xc208ae62},
		"KVM_SET_IRQCHIP":            {kvmSetIRQChip, 0x8208ae63},
		"KVM_SET_CLOCK":              {kvmSetClock, 0x4030ae7b},
		"KVM_GET_CLOCK":              {kvmGetClock, 0x8030ae7c},
		"KVM_GET_CPUID2":             {kvmGetCPUID2, 0xc008ae91},
		"KVM_SET_MP_STATE":           {kvmSetMPState, 0x4004ae99},
		"KVM_GET_VCPU_EVENTS":        {kvmGetVCPUEvents, 0x8040ae9f},
		"KVM_SET_VCPU_EVENTS":        {kvmSetVCPUEvents, 0x4040aea0},
		"KVM_GET_PIT2":               {kvmGetPIT2, 0x8070ae9f},
		"KVM_SET_PIT2":               {kvmSetPIT2, 0x4070aea0},
		"KVM_GET_DEBUGREGS":          {kvmGetDebugRegs, 0x8080aea1},
		"KVM_SET_DEBUGREGS":          {kvmSetDebugRegs, 0x4080aea2},
		"KVM_SET_TSC_KHZ":            {kvmSetTSCKHz, 0xaea2},
		"KVM_GET_XSAVE":              {kvmGetXSAVE, 0x9000aea4},
		"KVM_SET_XSAVE":              {kvmSetXSAVE, 0x5000aea5},
		"KVM_GET_XCRS":               {kvmGetXCRs, 0x8188aea6},
		"KVM_SET_XCRS":               {kvmSetXCRs, 0x4188aea7},
	}
	for name, v := range tests {
		if v[0] != v[1] {
			t.Errorf("%s = %#x, want %#x", name, v[0], v[1])
		}
	}
}

func TestCPUIDEdit(t *testing.T) {
	c := CPUID{
		{Function: 1, ECX: 1<<13 | 1<<26, EBX: 0x00010800},
		{Function: 0xb, Index: 0, Flags: cpuidFlagSignificantIndex},
		{Function: 0xb, Index: 1, Flags: cpuidFlagSignificantIndex},
	}
	if !c.Has(Features["cx16"]) {
		t.Fatal("cx16 not seen")
	}
	c.Hide(Features["cx16"])
	if c.Has(Features["cx16"]) || !c.Has(Features["xsave"]) {
		t.Fatalf("Hide(cx16) left ECX=%#x", c[0].ECX)
	}
	v := c.ForVCPU(3, 4)
	if got := v[0].EBX >> 24; got != 3 {
		t.Errorf("APIC id = %d, want 3", got)
	}
	if got := v[0].EBX >> 16 & 0xff; got != 4 {
		t.Errorf("logical count = %d, want 4", got)
	}
	if v[2].EDX != 3 || c[2].EDX != 0 {
		t.Errorf("x2APIC id %d (original %d)", v[2].EDX, c[2].EDX)
	}
	if _, err := ParseFeatures("cx16, XSAVE"); err != nil {
		t.Fatal(err)
	}
	if _, err := ParseFeatures("cx16,bogus"); err == nil {
		t.Fatal("unknown feature accepted")
	}
}

func TestWithTSCFrequency(t *testing.T) {
	c := CPUID{{Function: 0x40000000, EAX: 0x40000001}, {Function: 0x40000001}}
	got := c.WithTSCFrequency(2_500_000, 1_000_000)
	if e := got.Find(0x40000000, 0); e == nil || e.EAX != 0x40000010 {
		t.Fatalf("hypervisor max leaf not raised: %+v", e)
	}
	if e := got.Find(0x40000010, 0); e == nil || e.EAX != 2_500_000 || e.EBX != 1_000_000 {
		t.Fatalf("timing leaf = %+v", e)
	}
	if c[0].EAX != 0x40000001 || len(c) != 2 {
		t.Fatal("WithTSCFrequency modified its receiver")
	}
	again := got.WithTSCFrequency(3_000_000, 1_000_000)
	if n := len(again); n != len(got) {
		t.Fatalf("second call added a duplicate leaf (%d entries, want %d)", n, len(got))
	}
}

func TestOpenMissingDevice(t *testing.T) {
	_, err := OpenPath("/nonexistent/kvm")
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, unix.ENOENT) {
		t.Fatalf("err = %v, want ErrUnavailable wrapping ENOENT", err)
	}
	msg := err.Error()
	// The path and the cause once each, then what to do about it.
	if n := strings.Count(msg, "/nonexistent/kvm"); n != 1 {
		t.Errorf("%q names the path %d times, want once", msg, n)
	}
	if n := strings.Count(msg, "no such file or directory"); n != 1 {
		t.Errorf("%q gives the cause %d times, want once", msg, n)
	}
	if !strings.Contains(msg, "scripts/kvmbox") || !strings.Contains(msg, "kvm_amd") {
		t.Errorf("%q does not say what to do", msg)
	}
}

// TestTSCDeadlineShow: microvm sets CPUID.1:ECX[24] itself (KVM emulates the
// timer but never reports the bit), and --cpu-hide can take it away again.
func TestTSCDeadlineShow(t *testing.T) {
	c := CPUID{{Function: 0, EAX: 0xd}, {Function: 1, ECX: 1 << 13}}
	if c.Has(TSCDeadline) {
		t.Fatal("bit set before Show")
	}
	c.Show(TSCDeadline)
	if !c.Has(TSCDeadline) || c[1].ECX != 1<<13|1<<24 {
		t.Fatalf("after Show: ECX %#x, want CX16 and TSC-deadline", c[1].ECX)
	}
	fs, err := ParseFeatures("tsc_deadline_timer")
	if err != nil {
		t.Fatal(err)
	}
	c.Hide(fs[0])
	if c.Has(TSCDeadline) {
		t.Fatal("--cpu-hide tsc_deadline_timer left the bit set")
	}
	CPUID{{Function: 0}}.Show(TSCDeadline) // no leaf 1: nothing to set, no panic
}

// openKVM opens /dev/kvm. Without one, testenv.RequireKVM decides: under
// make test the test is queued for the nested-KVM box, which runs it later
// in the same run; elsewhere it is skipped, or fails under CI=true.
func openKVM(t *testing.T, need ...testenv.Need) *System {
	t.Helper()
	testenv.RequireKVM(t, need...)
	s, err := Open()
	if err != nil {
		t.Fatalf("KVM: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestRealModeOut runs a few real-mode instructions that write to a port and
// checks the decoded I/O exit, and that ioeventfd/irqfd registration works.
func TestRealModeOut(t *testing.T) {
	s := openKVM(t)
	vm, err := s.CreateVM()
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Close()
	if err := vm.SetTSSAddr(0xfffbd000); err != nil {
		t.Fatal(err)
	}
	if err := vm.CreateIRQChip(); err != nil {
		t.Fatal(err)
	}
	if err := vm.CreatePIT2(); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(-1, 0, 0x10000, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	// mov al, 0x2a; out 0xf4, al; mov ax,[0x2000] (MMIO hole read);
	// out 0xf4, al; jmp $
	copy(mem[0x1000:], []byte{0xb0, 0x2a, 0xe6, 0xf4, 0xa1, 0x00, 0x20, 0xe6, 0xf4, 0xeb, 0xfe})
	if err := vm.SetMemoryRegion(0, 0, 0x2000, uintptr(unsafe.Pointer(&mem[0]))); err != nil {
		t.Fatal(err)
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(efd)
	if err := vm.RegisterIRQFD(efd, 5); err != nil {
		t.Fatal(err)
	}
	if err := vm.UnregisterIRQFD(efd, 5); err != nil {
		t.Fatal(err)
	}
	for _, level := range []bool{true, false} {
		if err := vm.IRQLine(5, level); err != nil {
			t.Fatal(err)
		}
	}
	dm := uint64(1)
	ioe := IOEventFD{FD: efd, Addr: 0xd0000050, Len: 4, Datamatch: &dm}
	if err := vm.RegisterIOEventFD(ioe); err != nil {
		t.Fatal(err)
	}
	if err := vm.UnregisterIOEventFD(ioe); err != nil {
		t.Fatal(err)
	}

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	v, err := vm.CreateVCPU(0)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	v.BindThread()
	// With the in-kernel irqchip the boot vCPU starts runnable and any
	// other waits for INIT/SIPI.
	if st, err := v.MPState(); err != nil || st != MPStateRunnable {
		t.Fatalf("vCPU 0 MP state %d, %v; want runnable", st, err)
	}
	ap, err := vm.CreateVCPU(1)
	if err != nil {
		t.Fatal(err)
	}
	defer ap.Close()
	if st, err := ap.MPState(); err != nil || st != MPStateUninitialized {
		t.Fatalf("vCPU 1 MP state %d, %v; want uninitialized", st, err)
	}
	sr, err := v.Sregs()
	if err != nil {
		t.Fatal(err)
	}
	sr.CS.Base, sr.CS.Selector = 0, 0
	if err := v.SetSregs(sr); err != nil {
		t.Fatal(err)
	}
	if err := v.SetRegs(Regs{RIP: 0x1000, RFLAGS: 2}); err != nil {
		t.Fatal(err)
	}
	reason, err := v.Run()
	if err != nil {
		t.Fatal(err)
	}
	if reason != ExitIO {
		t.Fatalf("exit %v, want KVM_EXIT_IO", reason)
	}
	io, err := v.IO()
	if err != nil {
		t.Fatal(err)
	}
	if !io.Out || io.Port != 0xf4 || io.Size != 1 || len(io.Data) != 1 || io.Data[0] != 0x2a {
		t.Fatalf("I/O exit %+v", io)
	}
	reason, err = v.Run()
	if err != nil {
		t.Fatal(err)
	}
	if reason != ExitMMIO {
		t.Fatalf("exit %v, want KVM_EXIT_MMIO", reason)
	}
	mm, err := v.MMIO()
	if err != nil {
		t.Fatal(err)
	}
	if mm.Write || mm.Addr != 0x2000 || len(mm.Data) != 2 {
		t.Fatalf("MMIO exit %+v", mm)
	}
	mm.Data[0], mm.Data[1] = 0x34, 0x12
	// A Kick before Run makes Run return at once.
	v.Kick()
	if reason, err = v.Run(); err != nil || reason != ExitIntr {
		t.Fatalf("Run after Kick = %v, %v; want KVM_EXIT_INTR", reason, err)
	}
	for reason, err = v.Run(); err == nil && reason == ExitIntr; reason, err = v.Run() {
		// a runtime signal; run again
	}
	if err != nil || reason != ExitIO {
		t.Fatalf("Run = %v, %v; want KVM_EXIT_IO", reason, err)
	}
	if io, _ := v.IO(); io.Data[0] != 0x34 {
		t.Fatalf("MMIO read result not delivered: out %#x", io.Data[0])
	}
	// The guest now spins; a Kick from another goroutine interrupts KVM_RUN.
	var kicked atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(50 * time.Millisecond)
		kicked.Store(true)
		v.Kick()
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !kicked.Load() && time.Now().Before(deadline) {
		if reason, err = v.Run(); err != nil || reason != ExitIntr {
			t.Fatalf("Run while kicked = %v, %v; want KVM_EXIT_INTR", reason, err)
		}
	}
	<-done
	if !kicked.Load() {
		t.Fatal("Kick did not interrupt the spinning guest")
	}
}

// TestSplitIRQChip checks the split-irqchip plumbing against KVM: enabling
// it, routing a GSI to an MSI, binding an irqfd to it, and injecting an MSI.
// (Whether the guest takes the interrupt cannot be observed on a PVM host.)
func TestSplitIRQChip(t *testing.T) {
	s := openKVM(t)
	if err := s.Require(CapSplitIRQChip, CapSignalMSI); err != nil {
		t.Skip(err)
	}
	vm, err := s.CreateVM()
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Close()
	if err := vm.EnableSplitIRQChip(24); err != nil {
		t.Fatal(err)
	}
	// Newer kernels refuse a PIT without the in-kernel PIC (ENOENT);
	// 6.1, the nested-KVM box's L1, still creates one. microvm never asks
	// for a PIT in split mode, so either answer is the kernel's to give.
	if err := vm.CreatePIT2(); err == nil {
		t.Log("this KVM creates a PIT without an in-kernel PIC")
	}
	v, err := vm.CreateVCPU(0)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if err := v.SetupLINT(); err != nil {
		t.Fatalf("in-kernel LAPIC missing in split mode: %v", err)
	}
	routes := []MSIRoute{{GSI: 5, AddrLo: 0xfee00000, Data: 0x31}}
	if err := vm.SetGSIRouting(routes); err != nil {
		t.Fatal(err)
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(efd)
	if err := vm.RegisterIRQFD(efd, 5); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Write(efd, []byte{1, 0, 0, 0, 0, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	if _, err := vm.SignalMSI(0xfee00000, 0, 0x32); err != nil {
		t.Fatal(err)
	}
	if err := vm.SetGSIRouting(nil); err != nil {
		t.Fatalf("clearing the routes: %v", err)
	}
	if err := vm.SetGSIRouting(make([]MSIRoute, maxRoutes+1)); err == nil {
		t.Error("an oversized routing table was accepted")
	}
}
