package devices

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// serialRig drives a Serial as the guest (register accesses) and the host
// (console input) do. op[0] picks the kind of access, op[1] the register,
// op[2] the value written, op[3] how many bytes of op[4:] the host types.
type serialRig struct {
	*uart
	mark        int   // console output before this offset predates the save
	restoreIRQs int32 // interrupts raised by the last restore
}

func newSerialRig(tb testing.TB) stateRig[SerialState] {
	u := &uart{out: &syncBuffer{}}
	u.s = NewSerial(u.out, func() { u.irqs.Add(1) })
	tb.Cleanup(u.s.Close)
	return &serialRig{uart: u}
}

func (r *serialRig) save() SerialState {
	r.s.Flush() // as the caller does before saving: the old console gets it all
	r.mark = len(r.out.String())
	return r.s.SaveState()
}

func (r *serialRig) restore(st SerialState) error {
	err := r.s.RestoreState(st)
	r.restoreIRQs = r.takeIRQs()
	return err
}

func (r *serialRig) final() string {
	r.s.Flush()
	return r.out.String()[r.mark:]
}

func (r *serialRig) step(op stateOp) string {
	off := uint64(op[1] % SerialPorts)
	switch k := op[0] % 16; {
	case k < 7:
		v := r.in(off)
		return fmt.Sprintf("in %d = %#02x, %d irqs", off, v, r.takeIRQs())
	case k < 14:
		r.outb(off, op[2])
		return fmt.Sprintf("out %d %#02x, %d irqs", off, op[2], r.takeIRQs())
	default:
		r.s.mu.Lock()
		room := serialFIFO - len(r.s.rx)
		r.s.mu.Unlock()
		n := r.s.Input(op[4 : 4+min(int(op[3]%5), room)]) // never blocks
		return fmt.Sprintf("input %d bytes, %d irqs", n, r.takeIRQs())
	}
}

// Scripted serial accesses, in the rig's encoding.
func serialIn(off uint64) stateOp          { return stateOp{0, byte(off)} }
func serialOut(off uint64, v byte) stateOp { return stateOp{7, byte(off), v} }
func serialInput(s string) stateOp {
	op := stateOp{15, 0, 0, byte(len(s))}
	copy(op[4:], s)
	return op
}

// serialBusy puts a UART in a state where every saved field differs from
// its reset value: divisor 0x0201, 8N1, FIFOs on, OUT2, both interrupts
// enabled with THR empty pending, "llo" unread of the host's "hello" and
// "x" sent to the console.
var serialBusy = []stateOp{
	serialOut(uartLCR, lcrDLAB|0x03), serialOut(uartDLL, 0x01), serialOut(uartDLM, 0x02), serialOut(uartLCR, 0x03),
	serialOut(uartSCR, 0x5a), serialOut(uartFCR, fcrEnable), serialOut(uartMCR, mcrDTR|mcrRTS|mcrOUT2),
	serialOut(uartIER, ierRDI|ierTHRI), serialInput("hell"), serialInput("o"),
	serialIn(uartRBR), serialIn(uartRBR), serialOut(uartTHR, 'x'),
}

// serialEveryRegister reads and writes every register, in both DLAB
// settings, with received data and THR empty pending.
var serialEveryRegister = []stateOp{
	serialIn(uartIIR), serialIn(uartLSR), serialIn(uartRBR), serialIn(uartIIR), serialIn(uartRBR), serialIn(uartRBR),
	serialIn(uartLSR), serialIn(uartIIR), serialIn(uartIIR), serialIn(uartMSR), serialIn(uartSCR), serialIn(uartMCR),
	serialIn(uartLCR), serialIn(uartIER), serialOut(uartLCR, lcrDLAB|0x03), serialIn(uartDLL), serialIn(uartDLM),
	serialOut(uartDLL, 0x03), serialIn(uartDLL), serialOut(uartLCR, 0x03), serialOut(uartTHR, 'y'), serialIn(uartIIR),
	serialInput("ab"), serialIn(uartIIR), serialOut(uartMCR, mcrLoop|mcrOUT2), serialIn(uartMSR), serialOut(uartTHR, 'z'),
	serialIn(uartRBR), serialIn(uartRBR), serialIn(uartRBR), serialOut(uartFCR, fcrEnable|0x02), serialIn(uartLSR),
	serialOut(uartTHR, '\n'),
}

func TestSerialRestore(t *testing.T) {
	st := checkRestore(t, newSerialRig, serialBusy, serialEveryRegister)
	want := SerialState{
		IER: ierRDI | ierTHRI, LCR: 0x03, MCR: mcrDTR | mcrRTS | mcrOUT2, SCR: 0x5a, FCR: fcrEnable,
		DLL: 0x01, DLM: 0x02, THRPending: true, RX: []byte("llo"),
	}
	if diff := cmp.Diff(want, st); diff != "" {
		t.Errorf("saved state (-want +got):\n%s", diff)
	}
	checkRandomRestores(t, newSerialRig, 300)
}

// TestSerialRestoreInterrupt: restoring raises the interrupt once exactly
// when the saved UART had one pending and OUT2 let it out.
func TestSerialRestoreInterrupt(t *testing.T) {
	busy := SerialState{IER: ierRDI | ierTHRI, MCR: mcrOUT2, THRPending: true, RX: []byte("q")}
	tests := []struct {
		name     string
		spoil    func(*SerialState)
		wantIRQs int32
		wantIIR  byte
	}{
		{"received data and THR empty", func(*SerialState) {}, 1, iirRDI},
		{"THR empty", func(s *SerialState) { s.RX = nil }, 1, iirTHRI},
		{"received data, RDI off", func(s *SerialState) { s.IER = ierTHRI; s.THRPending = false }, 0, iirNone},
		{"THR empty seen by the guest", func(s *SerialState) { s.RX, s.THRPending = nil, false }, 0, iirNone},
		{"THR empty pending, THRI off", func(s *SerialState) { s.RX, s.IER = nil, ierRDI }, 0, iirNone},
		{"OUT2 clear", func(s *SerialState) { s.MCR = mcrDTR }, 0, iirRDI},
		{"reset state", func(s *SerialState) { *s = NewSerial(nil, nil).SaveState() }, 0, iirNone},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := jsonRoundTrip(t, busy)
			tc.spoil(&st)
			r := newSerialRig(t).(*serialRig)
			if err := r.restore(st); err != nil {
				t.Fatal(err)
			}
			if r.restoreIRQs != tc.wantIRQs {
				t.Errorf("restore raised %d interrupts, want %d", r.restoreIRQs, tc.wantIRQs)
			}
			if got := r.in(uartIIR); got != tc.wantIIR {
				t.Errorf("IIR after restore = %#x, want %#x", got, tc.wantIIR)
			}
		})
	}
}

func TestSerialRestoreRefused(t *testing.T) {
	good := NewSerial(nil, nil).SaveState()
	bad := map[string]func(*SerialState){
		"IER reserved bit":  func(s *SerialState) { s.IER = 0x10 },
		"MCR bit 5":         func(s *SerialState) { s.MCR = 0x20 | mcrOUT2 },
		"FCR clear action":  func(s *SerialState) { s.FCR = fcrEnable | 0x02 },
		"FCR trigger level": func(s *SerialState) { s.FCR = 0xc0 },
		"FIFO over 64":      func(s *SerialState) { s.RX = make([]byte, serialFIFO+1) },
		"FIFO far over":     func(s *SerialState) { s.RX = make([]byte, 1<<20) },
	}
	checkRefused(t, newSerialRig, serialBusy, good, bad)

	// A refused restore raises nothing either.
	r := newSerialRig(t).(*serialRig)
	if err := r.restore(SerialState{IER: 0xff, MCR: mcrOUT2, THRPending: true}); err == nil {
		t.Fatal("IER 0xff accepted")
	}
	if r.restoreIRQs != 0 {
		t.Errorf("a refused restore raised %d interrupts", r.restoreIRQs)
	}
	// The limits themselves are accepted.
	edge := SerialState{IER: ierMask, MCR: mcrMask, FCR: fcrEnable, LCR: 0xff, RX: bytes.Repeat([]byte{'e'}, serialFIFO)}
	if err := r.restore(edge); err != nil {
		t.Errorf("RestoreState(%+v) = %v, want it accepted", edge, err)
	}
}

// TestSerialRestoreWakesInput: a restore that leaves room in the FIFO lets
// a blocked Input go on, and one that fills it holds Input back.
func TestSerialRestoreWakesInput(t *testing.T) {
	u := newUART(t)
	if err := u.s.RestoreState(SerialState{MCR: mcrOUT2, RX: bytes.Repeat([]byte{'f'}, serialFIFO)}); err != nil {
		t.Fatal(err)
	}
	done := make(chan int, 1)
	go func() { done <- u.s.Input([]byte("go")) }()
	time.Sleep(20 * time.Millisecond) // Input blocks on the full FIFO (mostly: it passes either way)
	select {
	case n := <-done:
		t.Fatalf("Input returned %d into a full FIFO", n)
	default:
	}
	if err := u.s.RestoreState(SerialState{MCR: mcrOUT2}); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-done:
		if n != 2 {
			t.Fatalf("Input returned %d, want 2", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Input still blocked after a restore emptied the FIFO")
	}
	var got strings.Builder
	for u.in(uartLSR)&lsrDR != 0 {
		got.WriteByte(u.in(uartRBR))
	}
	if got.String() != "go" {
		t.Errorf("guest read %q, want %q", got.String(), "go")
	}
}
