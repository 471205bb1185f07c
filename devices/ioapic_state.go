package devices

import "fmt"

// IOAPICState is the snapshot form of an IOAPIC (see state.go): IOREGSEL,
// the APIC id and the redirection table. Fields are matched by name when
// decoded; a field added later must default (zero) to the behaviour of a
// snapshot that lacks it.
//
// The routes are not saved: they follow from the entries, and
// RestoreState installs them. Each entry's delivery status (bit 12) and
// remote IRR (bit 14) are saved with it, but this IOAPIC delivers every pin
// as an edge-triggered MSI, which KVM sends without waiting for an EOI, so
// it never sets them: an entry with either set is refused (accepting it
// would show the guest a pin stuck in delivery that no EOI can clear).
type IOAPICState struct {
	RegSel uint8 // IOREGSEL: the register IOWIN reaches
	ID     uint8 // the APIC id, bits 24-31 of the ID register
	// Redirection holds the redirection entries of pins 0-23 in order, as
	// the guest reads them through IOWIN: the low word in bits 0-31, the
	// high word in bits 32-63. Exactly IOAPICPins of them.
	Redirection []uint64
}

// SaveState returns the IOAPIC's state. See state.go for when to call it.
func (a *IOAPIC) SaveState() IOAPICState {
	a.mu.Lock()
	defer a.mu.Unlock()
	return IOAPICState{
		RegSel:      uint8(a.regSel),
		ID:          uint8(a.id >> 24),
		Redirection: append([]uint64(nil), a.rte[:]...),
	}
}

// RestoreState replaces the IOAPIC's registers with st and installs the
// routes they describe, or returns an error wrapping ErrBadState, changing
// nothing and calling nothing, when st holds something the IOAPIC cannot
// (not exactly IOAPICPins entries, or one with delivery status or remote
// IRR set).
//
// On success it calls Update with every pin's route, as a guest write that
// changes an entry does (with the lock held, on the caller's goroutine),
// and does so even when no entry differs from the device's: a restored
// machine's KVM routing table starts empty, whatever the entries say.
// Update has no way to report an error, so a routing table KVM refuses is
// the callback's to report, as for a guest write.
func (a *IOAPIC) RestoreState(st IOAPICState) error {
	if err := st.check(); err != nil {
		return fmt.Errorf("ioapic: restore: %w", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.regSel = uint32(st.RegSel)
	a.id = uint32(st.ID) << 24
	copy(a.rte[:], st.Redirection)
	if a.Update != nil {
		a.Update(a.routesLocked())
	}
	return nil
}

// check reports the first field of st that an IOAPIC cannot hold.
func (st *IOAPICState) check() error {
	if len(st.Redirection) != IOAPICPins {
		return fmt.Errorf("%d redirection entries, want %d: %w", len(st.Redirection), IOAPICPins, ErrBadState)
	}
	for pin, e := range st.Redirection {
		if e&rteReadOnly != 0 {
			return fmt.Errorf("pin %d entry %#x has delivery status or remote IRR set, which an edge-only IOAPIC never sets: %w", pin, e, ErrBadState)
		}
	}
	return nil
}
