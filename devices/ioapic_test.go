package devices

import (
	"encoding/binary"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func ioapicW(a *IOAPIC, reg, v uint32) {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], reg)
	a.Write(ioapicRegSel, b[:])
	binary.LittleEndian.PutUint32(b[:], v)
	a.Write(ioapicWin, b[:])
}

func ioapicR(a *IOAPIC, reg uint32) uint32 {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], reg)
	a.Write(ioapicRegSel, b[:])
	a.Read(ioapicWin, b[:])
	return binary.LittleEndian.Uint32(b[:])
}

func TestIOAPICRegisters(t *testing.T) {
	a := NewIOAPIC(2, nil)
	if got := ioapicR(a, ioapicID); got != 2<<24 {
		t.Errorf("ID = %#x, want %#x", got, 2<<24)
	}
	if got := ioapicR(a, ioapicVersion); got != 0x170011 {
		t.Errorf("version = %#x, want 0x170011 (24 entries, version 0x11)", got)
	}
	for pin := uint32(0); pin < IOAPICPins; pin++ {
		if got := ioapicR(a, ioapicRedTbl+2*pin); got != rteMasked {
			t.Fatalf("pin %d entry after reset = %#x, want masked", pin, got)
		}
	}
	// Delivery status and remote IRR are read-only.
	ioapicW(a, ioapicRedTbl, 0x31|1<<12|1<<14|rteMasked)
	if got := ioapicR(a, ioapicRedTbl); got != 0x31|rteMasked {
		t.Errorf("entry 0 = %#x; read-only bits were written", got)
	}
	// Out-of-range registers read 0 and ignore writes.
	ioapicW(a, 0x40, 0xffffffff)
	if got := ioapicR(a, 0x40); got != 0 {
		t.Errorf("register 0x40 = %#x", got)
	}
	// Only 4-byte accesses count.
	a.Write(ioapicWin, []byte{1})
	var b [2]byte
	a.Read(ioapicWin, b[:])
	if b != [2]byte{} {
		t.Errorf("2-byte read returned %x", b)
	}
}

func TestIOAPICRoutes(t *testing.T) {
	var got [IOAPICPins]IOAPICRoute
	calls := 0
	a := NewIOAPIC(1, func(r [IOAPICPins]IOAPICRoute) { got = r; calls++ })
	// Pin 5: vector 0x31, fixed delivery, physical destination APIC 3, edge.
	ioapicW(a, ioapicRedTbl+2*5+1, 3<<24)
	ioapicW(a, ioapicRedTbl+2*5, 0x31)
	if calls != 2 {
		t.Errorf("Update called %d times, want 2 (one per changed word)", calls)
	}
	want := IOAPICRoute{MSI: MSI{AddrLo: 0xfee03000, Data: 0x31}}
	if diff := cmp.Diff(want, got[5]); diff != "" {
		t.Errorf("pin 5 route (-want +got):\n%s", diff)
	}
	if !got[4].Masked {
		t.Error("pin 4 is routed though masked")
	}
	// Logical destination, lowest-priority delivery.
	ioapicW(a, ioapicRedTbl+2*6+1, 0x0f<<24)
	ioapicW(a, ioapicRedTbl+2*6, 0x41|1<<8|rteDestLogical)
	want = IOAPICRoute{MSI: MSI{AddrLo: 0xfee0f004, Data: 0x141}}
	if diff := cmp.Diff(want, got[6]); diff != "" {
		t.Errorf("pin 6 route (-want +got):\n%s", diff)
	}
	// Rewriting the same value does not call Update again.
	before := calls
	ioapicW(a, ioapicRedTbl+2*6, 0x41|1<<8|rteDestLogical)
	if calls != before {
		t.Error("Update called for an unchanged entry")
	}
	// Masking removes the route.
	ioapicW(a, ioapicRedTbl+2*5, 0x31|rteMasked)
	if !got[5].Masked {
		t.Error("masked pin 5 still routed")
	}
	if r := a.Routes(); r != got {
		t.Error("Routes() differs from the last Update")
	}
}

func TestPortBRefreshToggles(t *testing.T) {
	var p PortB
	var b [1]byte
	p.Read(0, b[:])
	first := b[0]
	p.Read(0, b[:])
	if b[0] == first || (b[0]|first) != 1<<4 {
		t.Errorf("refresh bit did not toggle: %#x then %#x", first, b[0])
	}
}
