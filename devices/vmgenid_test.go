package devices

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"testing"
)

// sliceMemory is guest memory backed by a plain slice from GPA 0.
type sliceMemory []byte

func (m sliceMemory) Write(gpa uint64, p []byte) error {
	if gpa > uint64(len(m)) || uint64(len(p)) > uint64(len(m))-gpa {
		return fmt.Errorf("write of %d bytes at %#x outside %d bytes of memory", len(p), gpa, len(m))
	}
	copy(m[gpa:], p)
	return nil
}

// TestVMGenIDGenerate: each Generate writes a fresh, non-zero ID at the
// address, and only there; nothing raises the interrupt but Notify.
func TestVMGenIDGenerate(t *testing.T) {
	mem := make(sliceMemory, 1<<20)
	irqs := 0
	g := NewVMGenID(mem, func() { irqs++ })
	if g.Addr() != VMGenIDAddr || g.GSI() != VMGenIDGSI {
		t.Fatalf("new VMGenID at %#x, GSI %d; want %#x, %d", g.Addr(), g.GSI(), VMGenIDAddr, VMGenIDGSI)
	}
	seen := map[[VMGenIDSize]byte]bool{}
	for i := range 3 {
		if err := g.Generate(); err != nil {
			t.Fatal(err)
		}
		id := g.ID()
		if id == ([VMGenIDSize]byte{}) || seen[id] {
			t.Fatalf("Generate %d: ID % x is zero or repeats one before", i, id)
		}
		seen[id] = true
		if got := mem[VMGenIDAddr : VMGenIDAddr+VMGenIDSize]; !bytes.Equal(got, id[:]) {
			t.Fatalf("Generate %d: memory holds % x, ID is % x", i, got, id)
		}
	}
	rest := append(append([]byte(nil), mem[:VMGenIDAddr]...), mem[VMGenIDAddr+VMGenIDSize:]...)
	if !bytes.Equal(rest, make([]byte, len(rest))) {
		t.Error("Generate wrote outside the ID's 16 bytes")
	}
	if irqs != 0 {
		t.Errorf("Generate raised %d interrupts; only Notify may", irqs)
	}
	g.Notify()
	if gens, sent := g.Counts(); irqs != 1 || gens != 3 || sent != 1 {
		t.Errorf("after 3 Generate and 1 Notify: %d interrupts raised, Counts %d, %d", irqs, gens, sent)
	}
}

// cycleReader repeats its blocks in turn: a random source a test scripts.
type cycleReader struct {
	blocks [][]byte
	n      int
}

func (r *cycleReader) Read(p []byte) (int, error) {
	b := r.blocks[r.n%len(r.blocks)]
	r.n++
	return copy(p, b), nil
}

// TestVMGenIDNeverZeroOrRepeated: a draw of all zeros (the "no ID" a
// fresh guest page holds) or of the ID already there is drawn again.
func TestVMGenIDNeverZeroOrRepeated(t *testing.T) {
	mem := make(sliceMemory, 1<<20)
	g := NewVMGenID(mem, func() {})
	a, b := bytes.Repeat([]byte{0xaa}, VMGenIDSize), bytes.Repeat([]byte{0xbb}, VMGenIDSize)
	g.rand = &cycleReader{blocks: [][]byte{make([]byte, VMGenIDSize), a, a, b}}
	for i, want := range [][]byte{a, b} {
		if err := g.Generate(); err != nil {
			t.Fatal(err)
		}
		if id := g.ID(); !bytes.Equal(id[:], want) {
			t.Errorf("Generate %d: ID % x, want % x", i, id, want)
		}
	}
}

// TestVMGenIDErrors: a failing random source or an address outside guest
// memory is an error, and the ID stays what it was.
func TestVMGenIDErrors(t *testing.T) {
	g := NewVMGenID(make(sliceMemory, 1<<20), func() {})
	g.rand = io.LimitReader(bytes.NewReader(nil), 0)
	if err := g.Generate(); err == nil {
		t.Error("Generate with an empty random source succeeded")
	}
	small := NewVMGenID(make(sliceMemory, VMGenIDAddr), func() {})
	if err := small.Generate(); err == nil || small.ID() != ([VMGenIDSize]byte{}) {
		t.Errorf("Generate outside memory: err %v, ID % x", err, small.ID())
	}
}

// TestVMGenIDState: the state round-trips, moves the ID and the GSI, and
// a state the machine cannot have is refused with ErrBadState, changing
// nothing.
func TestVMGenIDState(t *testing.T) {
	mem := make(sliceMemory, 2<<20)
	g := NewVMGenID(mem, func() {})
	if st := g.SaveState(); st != (VMGenIDState{Addr: VMGenIDAddr, GSI: VMGenIDGSI}) {
		t.Fatalf("SaveState = %+v", st)
	}
	moved := VMGenIDState{Addr: 0x10_0000, GSI: 16}
	if err := g.RestoreState(moved); err != nil {
		t.Fatal(err)
	}
	if st := g.SaveState(); st != moved || g.Addr() != moved.Addr || g.GSI() != moved.GSI {
		t.Fatalf("after RestoreState(%+v): SaveState %+v", moved, st)
	}
	if err := g.Generate(); err != nil {
		t.Fatal(err)
	}
	if id := g.ID(); !bytes.Equal(mem[moved.Addr:moved.Addr+VMGenIDSize], id[:]) {
		t.Error("Generate did not write at the restored address")
	}
	for _, bad := range []VMGenIDState{
		{Addr: 0, GSI: 23},
		{Addr: VMGenIDAddr + 4, GSI: 23},
		{Addr: 1<<64 - 8, GSI: 23},
		{Addr: VMGenIDAddr, GSI: IOAPICPins},
	} {
		err := g.RestoreState(bad)
		if !errors.Is(err, ErrBadState) {
			t.Errorf("RestoreState(%+v) = %v, want ErrBadState", bad, err)
		}
		if st := g.SaveState(); st != moved {
			t.Errorf("refused RestoreState(%+v) changed the state to %+v", bad, st)
		}
	}
}
