package devices

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// i8042Rig drives an I8042 through its two ports. op[0] picks read or
// write, op[1] the port, op[2] the value written (mostly a command the
// controller knows).
type i8042Rig struct{ *kbc }

func newI8042Rig(testing.TB) stateRig[I8042State] { return &i8042Rig{newKBC()} }

func (r *i8042Rig) save() I8042State            { return r.k.SaveState() }
func (r *i8042Rig) restore(st I8042State) error { return r.k.RestoreState(st) }
func (r *i8042Rig) final() string               { return "" }

// i8042Commands are the command bytes the controller acts on, for random
// accesses to pick from.
var i8042Commands = []byte{
	i8042CmdReadCTR, i8042CmdWriteCTR, i8042CmdDisAux, i8042CmdEnAux, i8042CmdAuxTest, i8042CmdSelfTest,
	i8042CmdKbdTest, i8042CmdDisKbd, i8042CmdEnKbd, i8042CmdWriteOut, 0xfe, 0xff,
}

func (r *i8042Rig) step(op stateOp) string {
	port, name := r.data, "data"
	if op[1]%2 == 1 {
		port, name = r.cmd, "command"
	}
	if op[0]%2 == 0 {
		return fmt.Sprintf("in %s = %#02x", name, readByte(port))
	}
	v := op[2]
	if op[3]%4 != 0 {
		v = i8042Commands[int(v)%len(i8042Commands)]
	}
	before := r.resets
	port.Write(0, []byte{v})
	return fmt.Sprintf("out %s %#02x, %d resets", name, v, r.resets-before)
}

func i8042In(cmd bool) stateOp {
	if cmd {
		return stateOp{0, 1}
	}
	return stateOp{0, 0}
}

func i8042Out(cmd bool, v byte) stateOp {
	if cmd {
		return stateOp{1, 1, v}
	}
	return stateOp{1, 0, v}
}

// i8042Busy leaves the controller with a new CTR, two replies queued and
// "write output port" waiting for its data byte.
var i8042Busy = []stateOp{
	i8042Out(true, i8042CmdWriteCTR), i8042Out(false, 0x47), i8042Out(true, i8042CmdSelfTest),
	i8042Out(false, 0xf4), i8042Out(true, i8042CmdReadCTR), i8042In(false), i8042Out(true, i8042CmdWriteOut),
}

func TestI8042Restore(t *testing.T) {
	// The pending 0xd1 takes the next data byte: 0xfe resets the machine.
	post := []stateOp{
		i8042In(true), i8042In(false), i8042In(true), i8042In(false), i8042In(true), i8042In(false),
		i8042Out(false, 0xfe), i8042In(true), i8042Out(false, 0xfe), i8042In(false), i8042In(true),
		i8042Out(true, i8042CmdReadCTR), i8042In(false),
	}
	st := checkRestore(t, newI8042Rig, i8042Busy, post)
	want := I8042State{CTR: 0x47, Status: i8042StatusSys | i8042StatusCmd, Pending: i8042CmdWriteOut, Out: []byte{0xfa, 0x47}}
	if diff := cmp.Diff(want, st); diff != "" {
		t.Errorf("saved state (-want +got):\n%s", diff)
	}
	checkRandomRestores(t, newI8042Rig, 300)
}

func TestI8042RestoreRefused(t *testing.T) {
	good := NewI8042(nil).SaveState()
	bad := map[string]func(*I8042State){
		"OBF in status":            func(s *I8042State) { s.Status |= i8042StatusOBF },
		"status bit 7":             func(s *I8042State) { s.Status |= 0x80 },
		"system flag clear":        func(s *I8042State) { s.Status = 0 },
		"unknown pending command":  func(s *I8042State) { s.Pending, s.Status = i8042CmdSelfTest, i8042StatusSys|i8042StatusCmd },
		"pending after data write": func(s *I8042State) { s.Pending, s.Status = i8042CmdWriteCTR, i8042StatusSys },
		"17 replies":               func(s *I8042State) { s.Out = make([]byte, i8042QueueMax+1) },
	}
	checkRefused(t, newI8042Rig, i8042Busy, good, bad)

	k := NewI8042(nil)
	edge := I8042State{CTR: 0xff, Status: i8042StatusSys | i8042StatusCmd, Pending: i8042CmdWriteCTR, Out: make([]byte, i8042QueueMax)}
	if err := k.RestoreState(edge); err != nil {
		t.Errorf("RestoreState(%+v) = %v, want it accepted", edge, err)
	}
}
