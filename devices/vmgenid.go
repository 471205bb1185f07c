package devices

import (
	"crypto/rand"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
)

// Where the VM generation ID lives (docs/machine.md, "VM generation ID"):
// 16 bytes at VMGenIDAddr, in the BIOS area the e820 map reserves (the
// guest uses it for nothing; the ACPI tables start at 0xe0000, far below),
// 8-byte aligned as Microsoft's specification asks, and below 0xf0000,
// where guests scan for the SMBIOS and MP table signatures. The Generic
// Event Device that tells the guest of a new ID interrupts on VMGenIDGSI,
// the IOAPIC's last pin: clear of the ISA IRQs and of the virtio-mmio
// slots' 5 to 12.
const (
	VMGenIDAddr = 0xe_f000
	VMGenIDSize = 16
	VMGenIDGSI  = 23
)

// GuestMemoryWriter is the part of guest memory VMGenID writes through
// (kvm/guestmem's Memory): a bounds-checked write at a guest-physical
// address.
type GuestMemoryWriter interface {
	Write(gpa uint64, p []byte) error
}

// VMGenID is the VM generation ID (Microsoft's "Virtual Machine
// Generation ID"; Linux's drivers/virt/vmgenid.c): a 128-bit random
// value in guest memory that changes whenever the guest's state is
// duplicated, here each time a snapshot is restored. The ACPI tables
// (package acpi) describe it: a VMGENCTR device whose ADDR names the
// address, and a Generic Event Device whose _EVT method, run by the guest
// when Notify's interrupt arrives, notifies the VMGENCTR device (0x80).
// Linux's driver copies the ID when it probes and again on each
// notification, and when it changed mixes it into the RNG's input pool and
// reseeds the RNG at once (add_vmfork_randomness), so clones restored from
// one snapshot stop sharing their random streams.
//
// The machine calls Generate at boot, and at a restore Generate then
// Notify once the vCPUs run; any goroutine may call any method.
type VMGenID struct {
	mem    GuestMemoryWriter
	notify func()
	rand   io.Reader // crypto/rand's Reader; tests replace it

	mu   sync.Mutex
	addr uint64            // guarded by mu
	gsi  uint32            // guarded by mu
	id   [VMGenIDSize]byte // guarded by mu: the ID last written
	gens atomic.Uint64     // Generate calls that wrote an ID
	sent atomic.Uint64     // Notify calls
}

// NewVMGenID returns the VM generation ID at VMGenIDAddr, its Generic
// Event Device on VMGenIDGSI (RestoreState moves them to a snapshot's
// place), writing to mem; notify raises the GED's interrupt (an edge on
// GSI, an irqfd) and must not block. Nothing is written before Generate.
func NewVMGenID(mem GuestMemoryWriter, notify func()) *VMGenID {
	return &VMGenID{mem: mem, notify: notify, rand: rand.Reader, addr: VMGenIDAddr, gsi: VMGenIDGSI}
}

// Addr is the ID's guest-physical address.
func (g *VMGenID) Addr() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.addr
}

// GSI is the Generic Event Device's interrupt, which Notify raises.
func (g *VMGenID) GSI() uint32 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.gsi
}

// ID is the ID last written by Generate (zero before).
func (g *VMGenID) ID() [VMGenIDSize]byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.id
}

// Generate draws a new random ID, different from the last one and not all
// zero, and writes it to guest memory. A running guest learns of it only
// through Notify.
func (g *VMGenID) Generate() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	var id [VMGenIDSize]byte
	for id == ([VMGenIDSize]byte{}) || id == g.id {
		if _, err := io.ReadFull(g.rand, id[:]); err != nil {
			return fmt.Errorf("vmgenid: drawing an ID: %w", err)
		}
	}
	if err := g.mem.Write(g.addr, id[:]); err != nil {
		return fmt.Errorf("vmgenid: writing the ID at %#x: %w", g.addr, err)
	}
	g.id = id
	g.gens.Add(1)
	return nil
}

// Notify raises the Generic Event Device's interrupt once, so that the
// guest reads the ID again.
func (g *VMGenID) Notify() {
	g.sent.Add(1)
	g.notify()
}

// Counts reports how many IDs Generate wrote and how many interrupts
// Notify raised, for tests and logs.
func (g *VMGenID) Counts() (generated, notified uint64) {
	return g.gens.Load(), g.sent.Load()
}

// VMGenIDState is the snapshot form of a VMGenID (see state.go): where the
// guest's driver found the ID and which interrupt its Generic Event Device
// listens on, as the saved guest's DSDT said. A restore writes the new ID
// at that address and raises that GSI, wherever a later microvm would put
// them for a machine it boots. The ID itself is in guest memory, and a
// restore replaces it anyway.
type VMGenIDState struct {
	Addr uint64
	GSI  uint32
}

var _ Stateful[VMGenIDState] = (*VMGenID)(nil)

// SaveState returns the ID's place and the GED's GSI.
func (g *VMGenID) SaveState() VMGenIDState {
	g.mu.Lock()
	defer g.mu.Unlock()
	return VMGenIDState{Addr: g.addr, GSI: g.gsi}
}

// RestoreState moves the ID and the GED's interrupt to st's, or returns an
// error wrapping ErrBadState, changing nothing, when the address is 0, not
// 8-byte aligned or wraps, or the GSI is beyond the IOAPIC's pins. Whether
// the address is guest RAM, Generate finds out.
func (g *VMGenID) RestoreState(st VMGenIDState) error {
	switch {
	case st.Addr == 0 || st.Addr%8 != 0 || st.Addr > ^uint64(0)-VMGenIDSize:
		return fmt.Errorf("vmgenid: restore: address %#x, want a non-zero, 8-byte aligned one: %w", st.Addr, ErrBadState)
	case st.GSI >= IOAPICPins:
		return fmt.Errorf("vmgenid: restore: GSI %d, want below %d: %w", st.GSI, IOAPICPins, ErrBadState)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.addr, g.gsi = st.Addr, st.GSI
	return nil
}
