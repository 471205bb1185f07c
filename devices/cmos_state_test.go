package devices

import (
	"fmt"
	"testing"
	"time"
)

// cmosRig drives a CMOS whose clock stands still at cmosRigTime. op[0]
// picks the access, op[1] the index written (mostly one of the first 64),
// op[2] the data written.
type cmosRig struct{ c *CMOS }

var cmosRigTime = time.Date(2031, 12, 31, 23, 59, 58, 0, time.UTC)

func newCMOSRig(testing.TB) stateRig[CMOSState] {
	c := NewCMOS(3<<30, 1<<30)
	c.Now = func() time.Time { return cmosRigTime }
	return &cmosRig{c}
}

func (r *cmosRig) save() CMOSState            { return r.c.SaveState() }
func (r *cmosRig) restore(st CMOSState) error { return r.c.RestoreState(st) }
func (r *cmosRig) final() string              { return "" }

func (r *cmosRig) step(op stateOp) string {
	port := uint64(op[0] % CMOSPorts)
	if op[0]&2 == 0 {
		b := []byte{0xaa}
		r.c.Read(port, b)
		return fmt.Sprintf("in %d = %#02x", port, b[0])
	}
	v := op[2]
	if port == 0 {
		v = op[1]
		if op[3]%4 != 0 {
			v &= 0x3f
		}
	}
	r.c.Write(port, []byte{v})
	return fmt.Sprintf("out %d %#02x", port, v)
}

func cmosOut(port uint64, v byte) stateOp {
	if port == 0 {
		return stateOp{2, v, 0, 0}
	}
	return stateOp{3, 0, v}
}

func cmosIn(port uint64) stateOp { return stateOp{byte(port)} }

// cmosBusy writes NVRAM byte 0x40, status A and B, the memory size and a
// time register (which reads never show), and leaves the index at 0x8b
// (status B, NMI masked).
var cmosBusy = []stateOp{
	cmosOut(0, 0x40), cmosOut(1, 0x5a), cmosOut(0, rtcStatusA), cmosOut(1, 0xa5), cmosOut(0, rtcStatusB),
	cmosOut(1, 0x06), cmosOut(0, cmosBaseLo), cmosOut(1, 0x7f), cmosOut(0, rtcSeconds), cmosOut(1, 0x33),
	cmosOut(0, 0x80|rtcStatusB),
}

func TestCMOSRestore(t *testing.T) {
	var post []stateOp
	for i := range cmosEntries {
		post = append(post, cmosOut(0, byte(i)), cmosIn(0), cmosIn(1))
	}
	post = append(post, cmosIn(1), cmosOut(1, 0x02), cmosIn(1), cmosOut(0, 0xff), cmosOut(1, 0x11), cmosIn(1))
	st := checkRestore(t, newCMOSRig, cmosBusy, post)
	for _, c := range []struct {
		name string
		got  byte
		want byte
	}{
		{"index", st.Index, 0x80 | rtcStatusB},
		{"byte 0x40", st.NVRAM[0x40], 0x5a},
		{"status A", st.NVRAM[rtcStatusA], 0x25},
		{"status B", st.NVRAM[rtcStatusB], 0x06},
		{"base memory", st.NVRAM[cmosBaseLo], 0x7f},
		{"high memory", st.NVRAM[cmosHigh4G+1], 0x40},
		{"seconds as stored", st.NVRAM[rtcSeconds], 0x33},
	} {
		if c.got != c.want {
			t.Errorf("saved %s = %#x, want %#x", c.name, c.got, c.want)
		}
	}
	checkRandomRestores(t, newCMOSRig, 300)
}

// TestCMOSRestoreClock: the restored RTC tells the new host's time, not the
// time of the save.
func TestCMOSRestoreClock(t *testing.T) {
	saved := NewCMOS(64<<20, 0)
	saved.Now = func() time.Time { return time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC) }
	st := jsonRoundTrip(t, saved.SaveState())
	restored := NewCMOS(64<<20, 0)
	restored.Now = func() time.Time { return time.Date(2029, 8, 7, 6, 5, 4, 0, time.UTC) }
	if err := restored.RestoreState(st); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ index, want byte }{
		{rtcSeconds, 0x04}, {rtcMinutes, 0x05}, {rtcHours, 0x06}, {rtcDay, 0x07}, {rtcMonth, 0x08},
		{rtcYear, 0x29}, {rtcCentury, 0x20}, {rtcWeekday, 0x03}, // a Tuesday
	} {
		if got := cmosRead(restored, c.index); got != c.want {
			t.Errorf("restored RTC register %#x = %#x, want %#x (the new host's time)", c.index, got, c.want)
		}
	}
}

func TestCMOSRestoreRefused(t *testing.T) {
	good := NewCMOS(64<<20, 0).SaveState()
	bad := map[string]func(*CMOSState){
		"127 bytes":      func(s *CMOSState) { s.NVRAM = s.NVRAM[:cmosEntries-1] },
		"129 bytes":      func(s *CMOSState) { s.NVRAM = append(s.NVRAM, 0) },
		"no NVRAM":       func(s *CMOSState) { s.NVRAM = nil },
		"UIP set":        func(s *CMOSState) { s.NVRAM[rtcStatusA] |= statusAUIP },
		"status C flags": func(s *CMOSState) { s.NVRAM[rtcStatusC] = 0x80 },
		"status D clear": func(s *CMOSState) { s.NVRAM[rtcStatusD] = 0 },
	}
	checkRefused(t, newCMOSRig, cmosBusy, good, bad)
}
