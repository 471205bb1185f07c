package devices

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// ioapicRig drives an IOAPIC through IOREGSEL and IOWIN and records the
// routes it hands to Update. op[0] picks the access, op[1] the register
// selected (mostly an existing one), op[2:6] the value written to IOWIN.
type ioapicRig struct {
	a              *IOAPIC
	updates        [][IOAPICPins]IOAPICRoute // since the last step
	restoreUpdates [][IOAPICPins]IOAPICRoute // by the last restore
}

func newIOAPICRig(testing.TB) stateRig[IOAPICState] {
	r := &ioapicRig{}
	r.a = NewIOAPIC(4, func(routes [IOAPICPins]IOAPICRoute) { r.updates = append(r.updates, routes) })
	return r
}

func (r *ioapicRig) save() IOAPICState { return r.a.SaveState() }
func (r *ioapicRig) final() string     { return "" }

func (r *ioapicRig) restore(st IOAPICState) error {
	err := r.a.RestoreState(st)
	r.restoreUpdates = r.takeUpdates()
	return err
}

func (r *ioapicRig) takeUpdates() [][IOAPICPins]IOAPICRoute {
	u := r.updates
	r.updates = nil
	return u
}

func (r *ioapicRig) step(op stateOp) string {
	var b [4]byte
	switch op[0] % 4 {
	case 0:
		r.a.Read(ioapicRegSel, b[:])
		return fmt.Sprintf("IOREGSEL = %#x", binary.LittleEndian.Uint32(b[:]))
	case 1:
		r.a.Read(ioapicWin, b[:])
		return fmt.Sprintf("IOWIN = %#x", binary.LittleEndian.Uint32(b[:]))
	case 2:
		sel := uint32(op[1])
		if op[2]%8 != 0 {
			sel %= ioapicRedTbl + 2*IOAPICPins
		}
		binary.LittleEndian.PutUint32(b[:], sel)
		r.a.Write(ioapicRegSel, b[:])
		return fmt.Sprintf("IOREGSEL <- %#x", sel)
	default:
		v := binary.LittleEndian.Uint32(op[2:6])
		r.a.Write(ioapicWin, binary.LittleEndian.AppendUint32(nil, v))
		return fmt.Sprintf("IOWIN <- %#x, updates %v", v, r.takeUpdates())
	}
}

func ioapicSel(reg uint32) stateOp { return stateOp{2, byte(reg), 1} }

func ioapicWinOut(v uint32) stateOp {
	op := stateOp{3}
	binary.LittleEndian.PutUint32(op[2:6], v)
	return op
}

var ioapicWinIn = stateOp{1}

// ioapicBusy sets the ID to 9, routes pin 4 (vector 0xb0 to APIC 1) and
// pin 9 (vector 0x41, logical destination 0x0f, lowest priority), writes
// pin 23's high word but leaves it masked, and selects pin 9's low word.
var ioapicBusy = []stateOp{
	ioapicSel(ioapicID), ioapicWinOut(9 << 24),
	ioapicSel(ioapicRedTbl + 2*4 + 1), ioapicWinOut(1 << 24), ioapicSel(ioapicRedTbl + 2*4), ioapicWinOut(0xb0),
	ioapicSel(ioapicRedTbl + 2*9 + 1), ioapicWinOut(0x0f << 24), ioapicSel(ioapicRedTbl + 2*9), ioapicWinOut(0x41 | 1<<8 | rteDestLogical),
	ioapicSel(ioapicRedTbl + 2*23 + 1), ioapicWinOut(0xff << 24), ioapicSel(ioapicRedTbl + 2*9),
}

func TestIOAPICRestore(t *testing.T) {
	post := []stateOp{ioapicWinIn, {0}, ioapicWinOut(0x41 | rteMasked), ioapicWinIn}
	for reg := range uint32(0x40) {
		post = append(post, ioapicSel(reg), ioapicWinIn)
	}
	post = append(post, ioapicSel(ioapicRedTbl+2*23), ioapicWinOut(0x23), ioapicSel(ioapicID), ioapicWinOut(0xffffffff), ioapicWinIn)
	st := checkRestore(t, newIOAPICRig, ioapicBusy, post)
	wantRTE := make([]uint64, IOAPICPins)
	for i := range wantRTE {
		wantRTE[i] = rteMasked
	}
	wantRTE[4] = 1<<56 | 0xb0
	wantRTE[9] = 0x0f<<56 | 0x41 | 1<<8 | rteDestLogical
	wantRTE[23] = 0xff<<56 | rteMasked
	want := IOAPICState{RegSel: ioapicRedTbl + 2*9, ID: 9, Redirection: wantRTE}
	if diff := cmp.Diff(want, st); diff != "" {
		t.Errorf("saved state (-want +got):\n%s", diff)
	}
	checkRandomRestores(t, newIOAPICRig, 300)
}

// TestIOAPICRestoreRoutes: restoring installs every pin's route through
// Update once, the routes the saved IOAPIC had, even when no entry
// differs from the fresh device's (the new VM's routing table is empty).
func TestIOAPICRestoreRoutes(t *testing.T) {
	saved := newIOAPICRig(t).(*ioapicRig)
	for _, op := range ioapicBusy {
		saved.step(op)
	}
	restored := newIOAPICRig(t).(*ioapicRig)
	if err := restored.restore(jsonRoundTrip(t, saved.save())); err != nil {
		t.Fatal(err)
	}
	want := [][IOAPICPins]IOAPICRoute{saved.a.Routes()}
	if diff := cmp.Diff(want, restored.restoreUpdates); diff != "" {
		t.Errorf("routes installed by the restore (-want +got):\n%s", diff)
	}
	if !want[0][23].Masked || want[0][4].Masked || want[0][4].MSI != (MSI{AddrLo: 0xfee01000, Data: 0xb0}) {
		t.Errorf("saved routes %+v do not reflect the test's entries", want[0])
	}

	fresh := newIOAPICRig(t).(*ioapicRig)
	if err := fresh.restore(NewIOAPIC(0, nil).SaveState()); err != nil {
		t.Fatal(err)
	}
	if got := fresh.restoreUpdates; len(got) != 1 || got[0] != NewIOAPIC(0, nil).Routes() {
		t.Errorf("restoring the reset state installed %v, want every pin masked, once", got)
	}

	// Without an Update callback, a restore still works.
	if err := NewIOAPIC(0, nil).RestoreState(saved.save()); err != nil {
		t.Fatal(err)
	}
}

func TestIOAPICRestoreRefused(t *testing.T) {
	good := NewIOAPIC(1, nil).SaveState()
	bad := map[string]func(*IOAPICState){
		"23 entries":               func(s *IOAPICState) { s.Redirection = s.Redirection[:IOAPICPins-1] },
		"25 entries":               func(s *IOAPICState) { s.Redirection = append(s.Redirection, rteMasked) },
		"no entries":               func(s *IOAPICState) { s.Redirection = nil },
		"delivery status set":      func(s *IOAPICState) { s.Redirection[3] |= 1 << 12 },
		"remote IRR set":           func(s *IOAPICState) { s.Redirection[23] = 0x30 | 1<<14 | 1<<15 },
		"remote IRR on a masked 0": func(s *IOAPICState) { s.Redirection[0] |= 1 << 14 },
	}
	checkRefused(t, newIOAPICRig, ioapicBusy, good, bad)

	// A refused restore installs nothing.
	r := newIOAPICRig(t).(*ioapicRig)
	if err := r.restore(IOAPICState{}); err == nil {
		t.Fatal("a state without entries was accepted")
	}
	if u := r.restoreUpdates; len(u) != 0 {
		t.Errorf("a refused restore called Update %d times", len(u))
	}
}
