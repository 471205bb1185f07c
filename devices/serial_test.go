package devices

import (
	"bytes"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// syncBuffer is a bytes.Buffer safe for the serial's flush timer goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// uart wraps a Serial with a guest's view: register reads and writes by
// offset, and a count of interrupts raised.
type uart struct {
	t    *testing.T
	s    *Serial
	out  *syncBuffer
	irqs atomic.Int32
}

func newUART(t *testing.T) *uart {
	t.Helper()
	u := &uart{t: t, out: &syncBuffer{}}
	u.s = NewSerial(u.out, func() { u.irqs.Add(1) })
	t.Cleanup(u.s.Close)
	return u
}

func (u *uart) in(off uint64) byte {
	d := []byte{0xaa}
	u.s.Read(off, d)
	return d[0]
}

func (u *uart) outb(off uint64, v byte) { u.s.Write(off, []byte{v}) }

// takeIRQs returns the interrupts raised since the last call.
func (u *uart) takeIRQs() int32 { return u.irqs.Swap(0) }

func TestSerialResetState(t *testing.T) {
	u := newUART(t)
	got := map[string]byte{
		"IER": u.in(uartIER), "IIR": u.in(uartIIR), "LCR": u.in(uartLCR),
		"MCR": u.in(uartMCR), "LSR": u.in(uartLSR), "MSR": u.in(uartMSR), "SCR": u.in(uartSCR),
	}
	want := map[string]byte{
		"IER": 0, "IIR": iirNone, "LCR": 0,
		"MCR": mcrOUT2, "LSR": lsrTHRE | lsrTEMT, "MSR": msrDCD | msrDSR | msrCTS, "SCR": 0,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("registers after reset (-want +got):\n%s", diff)
	}
	if n := u.takeIRQs(); n != 0 {
		t.Errorf("%d interrupts raised by reads of an idle UART", n)
	}
}

func TestSerialDLAB(t *testing.T) {
	u := newUART(t)
	u.outb(uartIER, ierRDI)
	u.outb(uartLCR, lcrDLAB|0x03) // DLAB, 8N1
	if got := u.in(uartDLL); got != 12 {
		t.Errorf("DLL at reset = %d, want 12 (9600 baud)", got)
	}
	u.outb(uartDLL, 0x01) // 115200 baud
	u.outb(uartDLM, 0x00)
	// With DLAB set, offsets 0 and 1 are the divisor, not THR/RBR and IER.
	if got, want := []byte{u.in(uartDLL), u.in(uartDLM)}, []byte{0x01, 0x00}; !bytes.Equal(got, want) {
		t.Errorf("divisor = %x, want %x", got, want)
	}
	u.s.Flush()
	if u.out.String() != "" {
		t.Errorf("a divisor write reached the console: %q", u.out.String())
	}
	u.outb(uartLCR, 0x03)
	if got := u.in(uartIER); got != ierRDI {
		t.Errorf("IER after DLAB cleared = %#x, want %#x (untouched by the DLM write)", got, ierRDI)
	}
	if got := u.in(uartLCR); got != 0x03 {
		t.Errorf("LCR = %#x, want 0x03", got)
	}
	u.outb(uartTHR, 'x')
	u.s.Flush()
	if got := u.out.String(); got != "x" {
		t.Errorf("console = %q after a THR write, want %q", got, "x")
	}
}

func TestSerialTHREmptyInterrupt(t *testing.T) {
	u := newUART(t)
	u.outb(uartIER, ierTHRI)
	if n := u.takeIRQs(); n == 0 {
		t.Fatal("enabling THRI with THR empty raised no interrupt")
	}
	if got := u.in(uartIIR); got != iirTHRI {
		t.Fatalf("IIR = %#x, want THR empty (%#x)", got, iirTHRI)
	}
	// Reading IIR acknowledged it.
	if got := u.in(uartIIR); got != iirNone {
		t.Fatalf("IIR after acknowledge = %#x, want none (%#x)", got, iirNone)
	}
	// Each byte written empties THR again: a new interrupt.
	u.outb(uartTHR, 'a')
	if n := u.takeIRQs(); n != 1 {
		t.Errorf("THR write raised %d interrupts, want 1", n)
	}
	if got := u.in(uartIIR); got != iirTHRI {
		t.Errorf("IIR after THR write = %#x, want %#x", got, iirTHRI)
	}
	// Re-enabling THRI while it is already on does not raise another one.
	u.outb(uartIER, ierTHRI)
	if u.in(uartIIR) != iirNone {
		t.Error("rewriting IER with THRI still set raised a new THR-empty condition")
	}
	// Disabling THRI hides the condition.
	u.outb(uartTHR, 'b')
	u.outb(uartIER, 0)
	if got := u.in(uartIIR); got != iirNone {
		t.Errorf("IIR with IER=0 = %#x, want none", got)
	}
}

func TestSerialOUT2GatesInterrupt(t *testing.T) {
	u := newUART(t)
	u.outb(uartMCR, mcrDTR|mcrRTS) // OUT2 off
	u.outb(uartIER, ierTHRI)
	if n := u.takeIRQs(); n != 0 {
		t.Errorf("%d interrupts raised with OUT2 clear", n)
	}
	if got := u.in(uartIIR); got != iirTHRI {
		t.Errorf("IIR = %#x, want THR empty pending even with the line gated", got)
	}
	u.outb(uartTHR, 'z')
	u.outb(uartMCR, mcrDTR|mcrRTS|mcrOUT2)
	if n := u.takeIRQs(); n == 0 {
		t.Error("setting OUT2 with an interrupt pending raised nothing")
	}
}

func TestSerialReceive(t *testing.T) {
	u := newUART(t)
	u.outb(uartIER, ierRDI)
	u.takeIRQs()
	if n := u.s.Input([]byte("hi")); n != 2 {
		t.Fatalf("Input queued %d bytes, want 2", n)
	}
	if n := u.takeIRQs(); n == 0 {
		t.Error("Input with RDI enabled raised no interrupt")
	}
	if got := u.in(uartLSR); got != lsrTHRE|lsrTEMT|lsrDR {
		t.Errorf("LSR = %#x, want data ready", got)
	}
	if got := u.in(uartIIR); got != iirRDI {
		t.Errorf("IIR = %#x, want received data (%#x)", got, iirRDI)
	}
	got := []byte{u.in(uartRBR), u.in(uartRBR)}
	if string(got) != "hi" {
		t.Errorf("RBR gave %q, want %q", got, "hi")
	}
	if got := u.in(uartLSR); got&lsrDR != 0 {
		t.Errorf("LSR = %#x after draining, want DR clear", got)
	}
	if got := u.in(uartIIR); got != iirNone {
		t.Errorf("IIR = %#x after draining, want none", got)
	}
	if got := u.in(uartRBR); got != 0 {
		t.Errorf("RBR on an empty FIFO = %#x, want 0", got)
	}
}

// TestSerialInterruptPriority: received data outranks THR empty (16550 data
// sheet, table 4).
func TestSerialInterruptPriority(t *testing.T) {
	u := newUART(t)
	u.outb(uartIER, ierRDI|ierTHRI)
	u.s.Input([]byte{'q'})
	if got := u.in(uartIIR); got != iirRDI {
		t.Fatalf("IIR = %#x, want received data first", got)
	}
	u.in(uartRBR)
	if got := u.in(uartIIR); got != iirTHRI {
		t.Errorf("IIR = %#x after RBR read, want the THR-empty interrupt next", got)
	}
}

func TestSerialLoopback(t *testing.T) {
	u := newUART(t)
	tests := []struct {
		mcr  byte
		want byte // MSR
	}{
		{mcrLoop, 0},
		{mcrLoop | mcrDTR, msrDSR},
		{mcrLoop | mcrRTS, msrCTS},
		{mcrLoop | mcrOUT1, msrRI},
		{mcrLoop | mcrOUT2, msrDCD},
		{mcrLoop | mcrDTR | mcrRTS | mcrOUT1 | mcrOUT2, msrDSR | msrCTS | msrRI | msrDCD},
		{mcrDTR, msrDCD | msrDSR | msrCTS}, // loopback off: carrier, DSR, CTS asserted
	}
	for _, tc := range tests {
		u.outb(uartMCR, tc.mcr)
		if got := u.in(uartMSR); got != tc.want {
			t.Errorf("MCR %#x: MSR = %#x, want %#x", tc.mcr, got, tc.want)
		}
	}
	// In loopback, transmitted bytes come back on RBR instead of leaving.
	u.outb(uartMCR, mcrLoop|mcrOUT2)
	for _, c := range []byte("loop") {
		u.outb(uartTHR, c)
	}
	var got []byte
	for u.in(uartLSR)&lsrDR != 0 {
		got = append(got, u.in(uartRBR))
	}
	if string(got) != "loop" {
		t.Errorf("looped back %q, want %q", got, "loop")
	}
	u.s.Flush()
	if u.out.String() != "" {
		t.Errorf("loopback bytes reached the console: %q", u.out.String())
	}
	if got := u.in(uartMCR); got != mcrLoop|mcrOUT2 {
		t.Errorf("MCR = %#x, want %#x", got, mcrLoop|mcrOUT2)
	}
}

func TestSerialFIFO(t *testing.T) {
	u := newUART(t)
	u.outb(uartFCR, fcrEnable)
	if got := u.in(uartIIR); got != iirFIFO|iirNone {
		t.Errorf("IIR with FIFOs on = %#x, want %#x", got, iirFIFO|iirNone)
	}
	u.s.Input([]byte("abc"))
	u.outb(uartFCR, fcrEnable|0x02) // clear the receive FIFO
	if got := u.in(uartLSR); got&lsrDR != 0 {
		t.Errorf("LSR = %#x after an RX FIFO clear, want DR clear", got)
	}
	u.outb(uartFCR, 0)
	if got := u.in(uartIIR); got&iirFIFO != 0 {
		t.Errorf("IIR = %#x with FIFOs off, want bits 6-7 clear", got)
	}
	u.outb(uartSCR, 0x5a)
	if got := u.in(uartSCR); got != 0x5a {
		t.Errorf("SCR = %#x, want 0x5a", got)
	}
}

// TestSerialInputBackpressure: Input never drops bytes; it blocks while the
// FIFO is full, resumes as the guest reads, and Close releases it.
func TestSerialInputBackpressure(t *testing.T) {
	u := newUART(t)
	msg := make([]byte, serialFIFO*3)
	for i := range msg {
		msg[i] = byte(i)
	}
	done := make(chan int, 1)
	go func() { done <- u.s.Input(msg) }()

	var got []byte
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < len(msg) && time.Now().Before(deadline) {
		if u.in(uartLSR)&lsrDR == 0 {
			time.Sleep(time.Millisecond)
			continue
		}
		got = append(got, u.in(uartRBR))
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("guest read %d bytes, want all %d in order", len(got), len(msg))
	}
	select {
	case n := <-done:
		if n != len(msg) {
			t.Errorf("Input returned %d, want %d", n, len(msg))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Input still blocked after the guest drained everything")
	}

	// A full FIFO with nobody reading: Input blocks until Close.
	go func() { done <- u.s.Input(msg) }()
	for u.in(uartLSR)&lsrDR == 0 { // until the FIFO has been filled
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	select {
	case n := <-done:
		t.Fatalf("Input returned %d with a full FIFO and no reader; want it blocked", n)
	default:
	}
	u.s.Close()
	select {
	case n := <-done:
		if n != serialFIFO {
			t.Errorf("Input after Close returned %d, want %d (what fit in the FIFO)", n, serialFIFO)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not release a blocked Input")
	}
	if n := u.s.Input([]byte("x")); n != 0 {
		t.Errorf("Input after Close queued %d bytes, want 0", n)
	}
}

// TestSerialOutputLines: output is written a line at a time, and a partial
// line (a prompt) shortly after the last byte.
func TestSerialOutputLines(t *testing.T) {
	w := &writeLog{}
	s := NewSerial(w, nil)
	defer s.Close()
	for _, c := range []byte("one\ntw") {
		s.Write(uartTHR, []byte{c})
	}
	deadline := time.Now().Add(5 * time.Second)
	for w.joined() != "one\ntw" && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := w.joined(); got != "one\ntw" {
		t.Fatalf("console = %q, want the partial line flushed by the timer", got)
	}
	// The complete line went out as one write, at its newline.
	if first := w.calls()[0]; first != "one\n" {
		t.Errorf("first write = %q, want the whole first line", first)
	}
}

// writeLog records each Write call.
type writeLog struct {
	mu     sync.Mutex
	writes []string
}

func (w *writeLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes = append(w.writes, string(p))
	return len(p), nil
}

func (w *writeLog) calls() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.writes...)
}

func (w *writeLog) joined() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var b bytes.Buffer
	for _, s := range w.writes {
		b.WriteString(s)
	}
	return b.String()
}

func TestSerialNilOutput(t *testing.T) {
	s := NewSerial(nil, nil)
	defer s.Close()
	for _, c := range []byte("discarded\n") {
		s.Write(uartTHR, []byte{c})
	}
	s.Write(uartIER, []byte{ierTHRI}) // no irq func: must not panic
	s.Read(uartIIR, make([]byte, 1))
	s.Read(uartRBR, nil) // zero-width accesses are ignored
	s.Write(uartTHR, nil)
}
