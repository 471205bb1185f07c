package devices

import (
	"encoding/binary"
	"sync"
)

// IOAPIC location and size (Intel 82093AA datasheet; docs/machine.md).
const (
	IOAPICAddr = 0xfec0_0000
	IOAPICSize = 0x1000
	// IOAPICPins is the number of redirection entries (GSIs 0..23).
	IOAPICPins = 24

	ioapicRegSel = 0x00 // IOREGSEL
	ioapicWin    = 0x10 // IOWIN

	ioapicID      = 0x00
	ioapicVersion = 0x01
	ioapicArb     = 0x02
	ioapicRedTbl  = 0x10 // entry n: low word 0x10+2n, high word 0x11+2n

	ioapicVersionValue = 0x11 // 82093AA, as the MP table announces

	rteVector       = 0xff
	rteDeliveryMode = 0x700
	rteDestLogical  = 1 << 11
	rteMasked       = 1 << 16
	rteReadOnly     = 1<<12 | 1<<14 // delivery status, remote IRR
	rteDestShift    = 56

	msiAddrBase = 0xfee0_0000
)

// MSI is a message-signalled interrupt: what an IOAPIC pin turns into when
// the LAPICs are in the kernel and the IOAPIC is not (split irqchip).
type MSI struct {
	AddrLo, AddrHi uint32 // message address (0xfee..., destination in bits 12-19)
	Data           uint32 // message data: vector and delivery mode
}

// IOAPICRoute is where one pin's interrupts go; Masked pins go nowhere.
type IOAPICRoute struct {
	Masked bool // the entry's mask bit: no route
	MSI    MSI  // what the pin's interrupts become when not masked
}

// IOAPIC is a userspace I/O APIC for KVM's split irqchip: the guest programs
// redirection entries through MMIO, and every change is turned into a GSI
// routing table (Update) in which pin N's GSI N maps to the MSI its entry
// describes. Interrupt sources (irqfds on GSI N) are then delivered by KVM
// without a trip through the VMM. All sources of this machine are
// edge-triggered; a level-triggered entry is delivered as edge.
type IOAPIC struct {
	// Update receives the routes of all pins after every change of an entry
	// (called with the IOAPIC's lock held, from the vCPU that wrote it).
	Update func(routes [IOAPICPins]IOAPICRoute)

	mu     sync.Mutex // guards the registers
	regSel uint32
	id     uint32
	rte    [IOAPICPins]uint64
}

// NewIOAPIC returns an IOAPIC with APIC id id and every pin masked.
func NewIOAPIC(id uint8, update func([IOAPICPins]IOAPICRoute)) *IOAPIC {
	a := &IOAPIC{Update: update, id: uint32(id) << 24}
	for i := range a.rte {
		a.rte[i] = rteMasked
	}
	return a
}

// Routes returns the current route of every pin.
func (a *IOAPIC) Routes() [IOAPICPins]IOAPICRoute {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.routesLocked()
}

func (a *IOAPIC) routesLocked() [IOAPICPins]IOAPICRoute {
	var out [IOAPICPins]IOAPICRoute
	for i, e := range a.rte {
		out[i] = IOAPICRoute{Masked: e&rteMasked != 0, MSI: rteToMSI(e)}
	}
	return out
}

// rteToMSI composes the MSI a redirection entry describes (Intel SDM vol. 3,
// 11.11.1 and 11.11.2): destination and destination mode in the address;
// vector and delivery mode in the data. Trigger mode is left edge.
func rteToMSI(e uint64) MSI {
	dest := uint32(e>>rteDestShift) & 0xff
	addr := uint32(msiAddrBase) | dest<<12
	if e&rteDestLogical != 0 {
		addr |= 1 << 2
	}
	return MSI{AddrLo: addr, Data: uint32(e&rteVector) | uint32(e&rteDeliveryMode)}
}

// Read implements Device.
func (a *IOAPIC) Read(offset uint64, data []byte) {
	clear(data)
	if len(data) != 4 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var v uint32
	switch offset {
	case ioapicRegSel:
		v = a.regSel
	case ioapicWin:
		v = a.readReg(a.regSel)
	}
	binary.LittleEndian.PutUint32(data, v)
}

func (a *IOAPIC) readReg(r uint32) uint32 {
	switch {
	case r == ioapicID:
		return a.id
	case r == ioapicVersion:
		return (IOAPICPins-1)<<16 | ioapicVersionValue
	case r == ioapicArb:
		return a.id
	case r >= ioapicRedTbl && r < ioapicRedTbl+2*IOAPICPins:
		e := a.rte[(r-ioapicRedTbl)/2]
		if r%2 == 0 {
			return uint32(e)
		}
		return uint32(e >> 32)
	}
	return 0
}

// Write implements Device.
func (a *IOAPIC) Write(offset uint64, data []byte) {
	if len(data) != 4 {
		return
	}
	v := binary.LittleEndian.Uint32(data)
	a.mu.Lock()
	defer a.mu.Unlock()
	switch offset {
	case ioapicRegSel:
		a.regSel = v & 0xff
	case ioapicWin:
		a.writeReg(a.regSel, v)
	}
}

func (a *IOAPIC) writeReg(r, v uint32) {
	switch {
	case r == ioapicID:
		a.id = v & 0x0f000000
	case r >= ioapicRedTbl && r < ioapicRedTbl+2*IOAPICPins:
		i := (r - ioapicRedTbl) / 2
		old := a.rte[i]
		if r%2 == 0 {
			// Delivery status (12) and remote IRR (14) are read-only.
			a.rte[i] = old&^0xffffffff | old&rteReadOnly | uint64(v)&^rteReadOnly
		} else {
			a.rte[i] = old&0xffffffff | uint64(v)<<32
		}
		if a.rte[i] != old && a.Update != nil {
			a.Update(a.routesLocked())
		}
	}
}
