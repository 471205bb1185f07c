package microvm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
)

// TestAdoptMACs: AdoptMACs sets each changed device's address in device
// order, stops at the first error and names the device and the address in
// it, and a later call applies only what is left: the failed change
// onward, then nothing.
func TestAdoptMACs(t *testing.T) {
	mac := func(b byte) net.HardwareAddr { return net.HardwareAddr{0x02, 0, 0, 0, 0, b} }
	m := &Machine{macChanges: []MACChange{
		{Net: 0, Old: mac(1), New: mac(0x11)},
		{Net: 2, Old: mac(3), New: mac(0x13)},
		{Net: 3, Old: mac(4), New: mac(0x14)},
	}}
	var got []string
	fail := errors.New("agent says no")
	failOn := "02:00:00:00:00:03"
	set := func(ctx context.Context, old, mac net.HardwareAddr) error {
		got = append(got, fmt.Sprintf("%v>%v", old, mac))
		if old.String() == failOn {
			return fail
		}
		return nil
	}

	err := m.AdoptMACs(context.Background(), set)
	if !errors.Is(err, fail) || !strings.Contains(err.Error(), "network device 2") || !strings.Contains(err.Error(), "02:00:00:00:00:13") {
		t.Errorf("AdoptMACs with device 2 refused: %v; want the setter's error naming device 2 and 02:00:00:00:00:13", err)
	}
	want := "[02:00:00:00:00:01>02:00:00:00:00:11 02:00:00:00:00:03>02:00:00:00:00:13]"
	if fmt.Sprint(got) != want {
		t.Errorf("first call set %v; want %v", got, want)
	}

	got, failOn = nil, ""
	if err := m.AdoptMACs(context.Background(), set); err != nil {
		t.Errorf("second call: %v", err)
	}
	want = "[02:00:00:00:00:03>02:00:00:00:00:13 02:00:00:00:00:04>02:00:00:00:00:14]"
	if fmt.Sprint(got) != want {
		t.Errorf("second call set %v; want the failed change onward, %v", got, want)
	}

	got = nil
	if err := m.AdoptMACs(context.Background(), set); err != nil || got != nil {
		t.Errorf("third call: set %v, %v; want nothing set and no error", got, err)
	}
	if n := len(m.MACChanges()); n != 3 {
		t.Errorf("MACChanges after adoption lists %d; want all 3", n)
	}

	if err := (&Machine{}).AdoptMACs(context.Background(), func(context.Context, net.HardwareAddr, net.HardwareAddr) error {
		t.Error("set called for a machine without changes")
		return nil
	}); err != nil {
		t.Errorf("a machine without changes: %v", err)
	}
}
