package kvm

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/internal/testing/testenv"
)

// TestIRQChipAccessors checks that the typed views of struct kvm_irqchip's
// union encode exactly the kernel layout (the Go structs' in-memory form,
// whose sizes TestLayoutSizes pins).
func TestIRQChipAccessors(t *testing.T) {
	if n := binary.Size(PICState{}); n != 16 {
		t.Fatalf("binary.Size(PICState) = %d, want 16", n)
	}
	if n := binary.Size(IOAPICState{}); n != 216 {
		t.Fatalf("binary.Size(IOAPICState) = %d, want 216", n)
	}
	var c IRQChip
	p := PICState{IRR: 1, IMR: 0xfb, ISR: 4, IRQBase: 0x20, InitState: 2, ELCR: 0x0c, ELCRMask: 0xf8}
	c.SetPIC(p)
	if got := *(*PICState)(unsafe.Pointer(&c.Chip[0])); got != p {
		t.Errorf("SetPIC wrote %+v, want %+v", got, p)
	}
	if got := c.PIC(); got != p {
		t.Errorf("PIC() = %+v, want %+v", got, p)
	}

	c = IRQChip{ChipID: IRQChipIOAPIC}
	s := IOAPICState{BaseAddress: 0xfec00000, IORegSel: 0x10, ID: 2, IRR: 1 << 4}
	for i := range s.RedirTbl {
		s.RedirTbl[i] = 1<<16 | uint64(0x30+i) | uint64(i)<<56
	}
	c.SetIOAPIC(s)
	if got := *(*IOAPICState)(unsafe.Pointer(&c.Chip[0])); got != s {
		t.Errorf("SetIOAPIC wrote %+v, want %+v", got, s)
	}
	if got := c.IOAPIC(); got != s {
		t.Errorf("IOAPIC() = %+v, want %+v", got, s)
	}
}

func TestXSTATEBV(t *testing.T) {
	var x XSAVE
	x.Region[128], x.Region[129] = 0x7, 0x2
	if got := x.XSTATEBV(); got != 0x2_0000_0007 {
		t.Fatalf("XSTATEBV = %#x", got)
	}
}

// snapGuest is a real-mode loop at snapEntry (CS=0): it counts in BX, steps
// SI by 3, doubles the x87 ST0 (which starts at 1.0), stores BX at
// snapCounterAddr and OUTs it (16 bits) to port 0xf4, forever.
var snapGuest = []byte{
	0xba, 0xf4, 0x00, // 1000: mov dx, 0xf4
	0xd9, 0xe8, //       1003: fld1
	0x43,             // 1005: inc bx (loop)
	0x83, 0xc6, 0x03, // 1006: add si, 3
	0xd8, 0xc0, //       1009: fadd st0, st0
	0x89, 0x1e, 0x00, 0x30, // 100b: mov [0x3000], bx
	0x89, 0xd8, // 100f: mov ax, bx
	0xef,       // 1011: out dx, ax
	0xeb, 0xf1, // 1012: jmp 1005
}

const (
	snapEntry       = 0x1000
	snapOutRIP      = 0x1011 // the OUT
	snapAfterOutRIP = 0x1012 // the instruction after it
	snapCounterAddr = 0x3000
	snapMemSize     = 0x10000
	snapPages       = snapMemSize / PageSize
)

// snapMachine is one VM of the snapshot test: full in-kernel irqchip and
// PIT, 64 KiB of RAM in slot 0 with dirty logging, vCPU 0.
type snapMachine struct {
	vm  *VM
	mem []byte
	v   *VCPU
}

func newSnapMachine(t *testing.T, s *System, cpuid CPUID) *snapMachine {
	t.Helper()
	mem, err := unix.Mmap(-1, 0, snapMemSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	vm, err := s.CreateVM()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vm.Close() })
	if err := vm.SetTSSAddr(0xfffbd000); err != nil {
		t.Fatal(err)
	}
	if err := vm.CreateIRQChip(); err != nil {
		t.Fatal(err)
	}
	if err := vm.CreatePIT2(); err != nil {
		t.Fatal(err)
	}
	if err := vm.SetMemoryRegionFlags(0, 0, snapMemSize, uintptr(unsafe.Pointer(&mem[0])), MemLogDirtyPages); err != nil {
		t.Fatal(err)
	}
	v, err := vm.CreateVCPU(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	if cpuid != nil {
		if err := v.SetCPUID(cpuid); err != nil {
			t.Fatal(err)
		}
	}
	return &snapMachine{vm: vm, mem: mem, v: v}
}

// nextOut runs the vCPU to its next exit, which must be the guest's OUT,
// and returns the value written.
func (m *snapMachine) nextOut(t *testing.T) uint16 {
	t.Helper()
	for {
		reason, err := m.v.Run()
		if err != nil {
			t.Fatal(err)
		}
		if reason == ExitIntr {
			continue // a runtime signal
		}
		if reason != ExitIO {
			r, _ := m.v.Regs()
			t.Fatalf("exit %v at RIP %#x, want the guest's OUT", reason, r.RIP)
		}
		io, err := m.v.IO()
		if err != nil {
			t.Fatal(err)
		}
		if !io.Out || io.Port != 0xf4 || io.Size != 2 || len(io.Data) != 2 {
			t.Fatalf("I/O exit %+v, want a 16-bit OUT to 0xf4", io)
		}
		return binary.LittleEndian.Uint16(io.Data)
	}
}

// dirtyPages returns the page numbers set in a dirty bitmap.
func dirtyPages(bitmap []uint64) []int {
	var pages []int
	for i, w := range bitmap {
		for w != 0 {
			b := bits.TrailingZeros64(w)
			pages = append(pages, i*64+b)
			w &^= 1 << b
		}
	}
	return pages
}

// TestSnapshotRoundTrip runs a guest, stops it after a few exits, saves the
// vCPU and VM state, restores them with a copy of its memory into a second
// VM and checks that the copy continues exactly where the original stopped,
// in lockstep with the original. Along the way it checks dirty logging,
// batched MSR reads that skip what KVM cannot read, and the typed irqchip
// and PIT state.
func TestSnapshotRoundTrip(t *testing.T) {
	// The guest's x87 instructions run at CPL0, which PVM emulates and fails.
	s := openKVM(t, testenv.NeedKernelFPU)
	cpuid, err := s.SupportedCPUID()
	if err != nil {
		t.Fatal(err)
	}
	msrIndices, err := s.MSRIndexList()
	if err != nil {
		t.Fatal(err)
	}
	if len(msrIndices) == 0 {
		t.Fatal("KVM_GET_MSR_INDEX_LIST returned no MSRs")
	}
	t.Logf("KVM lists %d MSRs to save", len(msrIndices))

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	a := newSnapMachine(t, s, cpuid)
	copy(a.mem[snapEntry:], snapGuest)

	// Entry state, with markers in registers the guest never touches.
	sr, err := a.v.Sregs()
	if err != nil {
		t.Fatal(err)
	}
	sr.CS.Base, sr.CS.Selector = 0, 0
	if err := a.v.SetSregs(sr); err != nil {
		t.Fatal(err)
	}
	if err := a.v.SetRegs(Regs{RIP: snapEntry, RFLAGS: 2, RSI: 0x100, RDI: 0xd1d1, RBP: 0xb0b0, R12: 0x1212_3434_5656_7878}); err != nil {
		t.Fatal(err)
	}
	// Debug registers: a DR0 that only a restore carries over (DR7 leaves
	// it disabled).
	dr, err := a.v.DebugRegs()
	if err != nil {
		t.Fatal(err)
	}
	dr.DB[0] = 0x1234_5678
	if err := a.v.SetDebugRegs(dr); err != nil {
		t.Fatal(err)
	}
	// A TSC far from the count a new VM starts at: older kernels take a
	// restored TSC within a second of that for a synchronization and keep
	// their own (RestoreState).
	const tsc = 1 << 40
	if err := a.v.SetMSRs([]MSR{{Index: msrIA32TSC, Data: tsc}}); err != nil {
		t.Fatal(err)
	}
	// XCR0 = x87|SSE where the guest may have it (the reset value is x87).
	wantXCR0 := uint64(1)
	if e := cpuid.Find(0xd, 0); cpuid.Has(Features["xsave"]) && e != nil && e.EAX&2 != 0 {
		xcrs, err := a.v.XCRs()
		if err != nil {
			t.Fatal(err)
		}
		xcrs.NrXCRs, xcrs.XCRs[0] = 1, XCR{XCR: 0, Value: 3}
		if err := a.v.SetXCRs(xcrs); err != nil {
			t.Fatal(err)
		}
		wantXCR0 = 3
	} else {
		t.Log("no XSAVE/SSE in the guest CPUID: XCR0 stays at its reset value")
	}

	// VM state that differs from a new VM's: the master PIC's mask, an
	// IOAPIC route and the PIT's channel 2 count (channel 2 raises no IRQ).
	pic, err := a.vm.IRQChip(IRQChipPICMaster)
	if err != nil {
		t.Fatal(err)
	}
	ps := pic.PIC()
	ps.IMR = 0xa5
	pic.SetPIC(ps)
	if err := a.vm.SetIRQChip(pic); err != nil {
		t.Fatal(err)
	}
	ioapic, err := a.vm.IRQChip(IRQChipIOAPIC)
	if err != nil {
		t.Fatal(err)
	}
	is := ioapic.IOAPIC()
	if is.BaseAddress != 0xfec00000 {
		t.Errorf("IOAPIC base %#x, want 0xfec00000", is.BaseAddress)
	}
	const route5 = 1<<16 | 1<<15 | 0x35 // masked, level, vector 0x35
	is.RedirTbl[5] = route5
	ioapic.SetIOAPIC(is)
	if err := a.vm.SetIRQChip(ioapic); err != nil {
		t.Fatal(err)
	}
	pit, err := a.vm.PIT2()
	if err != nil {
		t.Fatal(err)
	}
	pit.Channels[2].Count = 0x1234
	if err := a.vm.SetPIT2(pit); err != nil {
		t.Fatal(err)
	}

	// Dirty logging: nothing before the guest runs.
	if _, err := a.vm.DirtyLog(0, snapPages-1); err == nil {
		t.Error("DirtyLog accepted a bitmap smaller than the slot")
	}
	if _, err := a.vm.DirtyLog(1, snapPages); err == nil {
		t.Error("DirtyLog accepted a slot that does not exist")
	}
	log, err := a.vm.DirtyLog(0, snapPages)
	if err != nil {
		t.Fatal(err)
	}
	if p := dirtyPages(log); len(p) != 0 {
		t.Errorf("pages %v dirty before the guest ran", p)
	}

	const steps = 5
	for i := 1; i <= steps; i++ {
		if got := a.nextOut(t); got != uint16(i) {
			t.Fatalf("OUT #%d wrote %d, want %d", i, got, i)
		}
	}

	// The guest wrote its counter page: it is dirty, once.
	log, err = a.vm.DirtyLog(0, snapPages)
	if err != nil {
		t.Fatal(err)
	}
	if len(log) != 1 {
		t.Fatalf("bitmap of %d words for %d pages", len(log), snapPages)
	}
	checkDirty(t, "original", log)
	if log, err = a.vm.DirtyLog(0, snapPages); err != nil {
		t.Fatal(err)
	} else if p := dirtyPages(log); len(p) != 0 {
		t.Errorf("pages %v still dirty after the log was read", p)
	}

	// MSR reads in batches, skipping what KVM cannot read.
	const bogus = 0xdead_beef
	var many []uint32
	for i := range 3*maxMSRs + 5 {
		switch i {
		case 0, maxMSRs - 1, maxMSRs + 7, 3 * maxMSRs:
			many = append(many, bogus)
		default:
			many = append(many, 0x174) // IA32_SYSENTER_CS
		}
	}
	read, skipped, err := a.v.ReadMSRs(many)
	if err != nil {
		t.Fatal(err)
	}
	if len(read) != len(many)-4 || len(skipped) != 4 {
		t.Errorf("ReadMSRs: %d read, skipped %#x; want %d and 4 x %#x", len(read), skipped, len(many)-4, bogus)
	}
	for _, m := range read {
		if m.Index != 0x174 {
			t.Fatalf("ReadMSRs returned MSR %#x", m.Index)
		}
	}
	for _, idx := range skipped {
		if idx != bogus {
			t.Errorf("ReadMSRs skipped %#x", idx)
		}
	}
	if _, err := a.v.MSRs(0x174, bogus); err == nil || !strings.Contains(err.Error(), "0xdeadbeef") {
		t.Errorf("MSRs with an unreadable MSR: %v; want an error naming it", err)
	}
	if err := a.v.SetMSRs([]MSR{{Index: 0x174, Data: 8}, {Index: bogus}}); err == nil || !strings.Contains(err.Error(), "0xdeadbeef") {
		t.Errorf("SetMSRs with an unknown MSR: %v; want an error naming it", err)
	}

	// Stopped at an OUT: let KVM finish it, then save.
	r, err := a.v.Regs()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("RIP at the I/O exit: %#x", r.RIP)
	if reason, err := a.v.CompletePendingIO(); err != nil || reason != ExitIntr {
		t.Fatalf("CompletePendingIO = %v, %v; want KVM_EXIT_INTR", reason, err)
	}
	vs, err := a.v.SaveState(msrIndices)
	if err != nil {
		t.Fatal(err)
	}
	if vs.Regs.RIP != snapAfterOutRIP || vs.Regs.RBX != steps {
		t.Fatalf("saved RIP %#x BX %d; want %#x (past the OUT) and %d", vs.Regs.RIP, vs.Regs.RBX, snapAfterOutRIP, steps)
	}
	if len(vs.SkippedMSRs) > 0 {
		t.Logf("%d of %d listed MSRs unreadable, not saved: %#x", len(vs.SkippedMSRs), len(msrIndices), vs.SkippedMSRs)
	}
	if vs.MPState != MPStateRunnable || len(vs.CPUID) != len(cpuid) || vs.TSCKHz == 0 {
		t.Errorf("saved MP state %d, %d CPUID entries (set %d), TSC %d kHz", vs.MPState, len(vs.CPUID), len(cpuid), vs.TSCKHz)
	}
	ms, err := a.vm.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	if ms.Mode != IRQChipFull || !ms.HasPIT || ms.PICMaster.PIC().IMR != 0xa5 || ms.IOAPIC.IOAPIC().RedirTbl[5] != route5 {
		t.Fatalf("saved VM state: mode %v, PIT %v, PIC IMR %#x, IOAPIC route 5 %#x",
			ms.Mode, ms.HasPIT, ms.PICMaster.PIC().IMR, ms.IOAPIC.IOAPIC().RedirTbl[5])
	}

	// The copy: a new VM with the saved memory and state, and no CPUID of
	// its own (the restore brings it).
	b := newSnapMachine(t, s, nil)
	copy(b.mem, a.mem)
	if err := b.v.RestoreState(vs); err != nil {
		t.Fatal(err)
	}
	if err := b.vm.RestoreState(ms); err != nil {
		t.Fatal(err)
	}

	// What the copy holds now is what was saved.
	got, err := b.v.SaveState(msrIndices)
	if err != nil {
		t.Fatal(err)
	}
	compareVCPUState(t, got, vs)
	if got.XCRs.NrXCRs > 0 && got.XCRs.XCRs[0].Value != wantXCR0 {
		t.Errorf("restored XCR0 %#x, want %#x", got.XCRs.XCRs[0].Value, wantXCR0)
	}
	if got.DebugRegs.DB[0] != 0x1234_5678 {
		t.Errorf("restored DR0 %#x", got.DebugRegs.DB[0])
	}
	for _, m := range got.MSRs {
		if m.Index == msrIA32TSC && (m.Data < tsc || m.Data > tsc+uint64(vs.TSCKHz)*1000*60) {
			t.Errorf("restored IA32_TSC %d, saved near %d", m.Data, uint64(tsc))
		}
	}
	gotVM, err := b.vm.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		got, want IRQChip
	}{{"PIC master", gotVM.PICMaster, ms.PICMaster}, {"PIC slave", gotVM.PICSlave, ms.PICSlave}, {"IOAPIC", gotVM.IOAPIC, ms.IOAPIC}} {
		if c.got != c.want {
			t.Errorf("restored %s differs:\n got %+v\nwant %+v", c.name, c.got, c.want)
		}
	}
	for i := range gotVM.PIT.Channels {
		g, w := gotVM.PIT.Channels[i], ms.PIT.Channels[i]
		g.CountLoadTime, w.CountLoadTime = 0, 0
		if g != w {
			t.Errorf("restored PIT channel %d: %+v, want %+v", i, g, w)
		}
	}
	if gotVM.PIT.Channels[2].Count != 0x1234 {
		t.Errorf("restored PIT channel 2 count %#x, want 0x1234", gotVM.PIT.Channels[2].Count)
	}
	if gotVM.Clock.Clock < ms.Clock.Clock || gotVM.Clock.Clock-ms.Clock.Clock > 60e9 {
		t.Errorf("restored kvmclock %d ns, saved %d ns", gotVM.Clock.Clock, ms.Clock.Clock)
	}

	// Both run on, in lockstep: same OUTs, registers, FPU and memory.
	for i := steps + 1; i <= steps+3; i++ {
		outA, outB := a.nextOut(t), b.nextOut(t)
		if outA != uint16(i) || outB != uint16(i) {
			t.Fatalf("OUT #%d: original wrote %d, copy %d; want %d", i, outA, outB, i)
		}
		ra, err := a.v.Regs()
		if err != nil {
			t.Fatal(err)
		}
		rb, err := b.v.Regs()
		if err != nil {
			t.Fatal(err)
		}
		if ra != rb {
			t.Fatalf("after OUT #%d the registers differ:\noriginal %+v\n    copy %+v", i, ra, rb)
		}
		if rb.RIP != snapOutRIP || rb.RBX != uint64(i) || rb.RSI != 0x100+3*uint64(i) || rb.RDI != 0xd1d1 || rb.R12 != 0x1212_3434_5656_7878 {
			t.Fatalf("copy's registers after OUT #%d: %+v", i, rb)
		}
		fa, err := a.v.FPU()
		if err != nil {
			t.Fatal(err)
		}
		fb, err := b.v.FPU()
		if err != nil {
			t.Fatal(err)
		}
		if fa.FPR != fb.FPR || fa.FCW != fb.FCW || fa.FSW != fb.FSW || fa.FTWX != fb.FTWX {
			t.Fatalf("after OUT #%d the x87 state differs:\noriginal %+v\n    copy %+v", i, fa, fb)
		}
		// ST0 = 2^i: exponent 16383+i, explicit integer bit.
		if exp := binary.LittleEndian.Uint16(fb.FPR[0][8:]); exp != 16383+uint16(i) || binary.LittleEndian.Uint64(fb.FPR[0][:8]) != 1<<63 {
			t.Fatalf("copy's ST0 after OUT #%d: % x, want 2^%d", i, fb.FPR[0][:10], i)
		}
		if !bytes.Equal(a.mem, b.mem) {
			t.Fatalf("after OUT #%d guest memory differs", i)
		}
		if c := binary.LittleEndian.Uint16(b.mem[snapCounterAddr:]); c != uint16(i) {
			t.Fatalf("copy's counter in memory %d, want %d", c, i)
		}
	}
	// The copy logs its own writes: the counter's page.
	log, err = b.vm.DirtyLog(0, snapPages)
	if err != nil {
		t.Fatal(err)
	}
	checkDirty(t, "copy", log)
}

// checkDirty checks a dirty log of the snapshot guest: the counter's page
// must be in it, and nothing but that and the code's page, which the guest
// only reads and fetches from, but which KVM may map writable on a read
// fault and then counts as dirty (as it does with shadow paging): the log may
// report more than was written, never less.
func checkDirty(t *testing.T, who string, bitmap []uint64) {
	t.Helper()
	p := dirtyPages(bitmap)
	counter := false
	for _, n := range p {
		switch n {
		case snapCounterAddr / PageSize:
			counter = true
		case snapEntry / PageSize:
		default:
			t.Errorf("%s: page %d dirty, which the guest never touched (dirty: %v)", who, n, p)
		}
	}
	if !counter {
		t.Errorf("%s: dirty pages %v, without the counter's page %d", who, p, snapCounterAddr/PageSize)
	}
	t.Logf("%s: dirty pages %v", who, p)
}

// compareVCPUState reports where a restored vCPU's state differs from the
// state it was restored from. Counters of time (the TSC, Hyper-V's VP
// runtime and reference time) run on, so they only have to have moved
// forward.
func compareVCPUState(t *testing.T, got, want *VCPUState) {
	t.Helper()
	if got.MPState != want.MPState {
		t.Errorf("MP state %d, want %d", got.MPState, want.MPState)
	}
	if got.Events != want.Events {
		t.Errorf("vCPU events %+v, want %+v", got.Events, want.Events)
	}
	if got.Regs != want.Regs {
		t.Errorf("regs %+v, want %+v", got.Regs, want.Regs)
	}
	if got.Sregs != want.Sregs {
		t.Errorf("sregs %+v, want %+v", got.Sregs, want.Sregs)
	}
	if got.XSAVE != want.XSAVE {
		for i := range got.XSAVE.Region {
			if got.XSAVE.Region[i] != want.XSAVE.Region[i] {
				t.Errorf("XSAVE differs first at byte %d: %#x, want %#x", 4*i, got.XSAVE.Region[i], want.XSAVE.Region[i])
				break
			}
		}
	}
	if got.XCRs != want.XCRs {
		t.Errorf("XCRs %+v, want %+v", got.XCRs, want.XCRs)
	}
	if got.DebugRegs != want.DebugRegs {
		t.Errorf("debug regs %+v, want %+v", got.DebugRegs, want.DebugRegs)
	}
	if got.LAPIC != want.LAPIC {
		for i := 0; i < len(got.LAPIC.Regs); i += 16 {
			g := binary.LittleEndian.Uint32(got.LAPIC.Regs[i:])
			w := binary.LittleEndian.Uint32(want.LAPIC.Regs[i:])
			if g != w {
				t.Errorf("LAPIC register %#x = %#x, want %#x", i, g, w)
			}
		}
	}
	if got.TSCKHz != want.TSCKHz {
		t.Errorf("TSC %d kHz, want %d", got.TSCKHz, want.TSCKHz)
	}
	if len(got.CPUID) != len(want.CPUID) {
		t.Errorf("%d CPUID entries, want %d", len(got.CPUID), len(want.CPUID))
	} else {
		for i := range got.CPUID {
			if got.CPUID[i] != want.CPUID[i] {
				t.Errorf("CPUID entry %d %+v, want %+v", i, got.CPUID[i], want.CPUID[i])
			}
		}
	}
	gotMSR := make(map[uint32]uint64, len(got.MSRs))
	for _, m := range got.MSRs {
		gotMSR[m.Index] = m.Data
	}
	for _, m := range want.MSRs {
		g, ok := gotMSR[m.Index]
		switch {
		case !ok:
			t.Errorf("MSR %#x not readable after the restore", m.Index)
		case timeMSRs[m.Index]:
			if g < m.Data {
				t.Errorf("MSR %#x went back from %d to %d", m.Index, m.Data, g)
			}
		case g != m.Data:
			t.Errorf("MSR %#x = %#x, want %#x", m.Index, g, m.Data)
		}
	}
}

const msrIA32TSC = 0x10

// timeMSRs count time: IA32_TSC, HV_X64_MSR_VP_RUNTIME and
// HV_X64_MSR_TIME_REF_COUNT (derived from the kvmclock).
var timeMSRs = map[uint32]bool{msrIA32TSC: true, 0x40000010: true, 0x40000020: true}

// TestSnapshotSplitIRQChip: with the split irqchip only the clock is KVM's
// to save, and a state restores only into a VM of the same irqchip model.
func TestSnapshotSplitIRQChip(t *testing.T) {
	s := openKVM(t)
	if err := s.Require(CapSplitIRQChip); err != nil {
		t.Skip(err)
	}
	newVM := func(split bool) *VM {
		vm, err := s.CreateVM()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { vm.Close() })
		if split {
			err = vm.EnableSplitIRQChip(24)
		} else {
			err = vm.CreateIRQChip()
		}
		if err != nil {
			t.Fatal(err)
		}
		return vm
	}
	a := newVM(true)
	st, err := a.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode != IRQChipSplit || st.HasPIT || st.PICMaster != (IRQChip{}) || st.IOAPIC != (IRQChip{}) {
		t.Fatalf("split-irqchip state: %+v", st)
	}
	if err := newVM(true).RestoreState(st); err != nil {
		t.Fatal(err)
	}
	if err := newVM(false).RestoreState(st); err == nil {
		t.Fatal("a split-irqchip state restored into a VM with the full irqchip")
	}
}
