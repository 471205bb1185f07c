package devices

import (
	"io"
	"sync"
	"time"
)

// COM1 is where the serial console lives.
const (
	COM1Port = 0x3f8
	COM1IRQ  = 4
	// SerialPorts is the size of the UART's port range.
	SerialPorts = 8
)

// 8250/16550 registers (offsets from the base port) and their bits, as in
// the National Semiconductor PC16550D data sheet.
const (
	uartRBR = 0 // receive buffer (read, DLAB=0)
	uartTHR = 0 // transmit holding (write, DLAB=0)
	uartDLL = 0 // divisor latch low (DLAB=1)
	uartIER = 1 // interrupt enable (DLAB=0)
	uartDLM = 1 // divisor latch high (DLAB=1)
	uartIIR = 2 // interrupt identification (read)
	uartFCR = 2 // FIFO control (write)
	uartLCR = 3 // line control
	uartMCR = 4 // modem control
	uartLSR = 5 // line status
	uartMSR = 6 // modem status
	uartSCR = 7 // scratch

	ierRDI  = 0x01 // received data available
	ierTHRI = 0x02 // transmitter holding register empty
	ierRLSI = 0x04 // receiver line status
	ierMSI  = 0x08 // modem status

	ierMask = ierRDI | ierTHRI | ierRLSI | ierMSI // IER bits 4-7 are reserved

	iirNone = 0x01
	iirTHRI = 0x02
	iirRDI  = 0x04
	iirFIFO = 0xc0 // FIFOs enabled

	fcrEnable = 0x01

	lcrDLAB = 0x80

	mcrDTR  = 0x01
	mcrRTS  = 0x02
	mcrOUT1 = 0x04
	mcrOUT2 = 0x08
	mcrLoop = 0x10

	mcrMask = mcrDTR | mcrRTS | mcrOUT1 | mcrOUT2 | mcrLoop // MCR bits 5-7 read 0

	lsrDR   = 0x01
	lsrTHRE = 0x20
	lsrTEMT = 0x40

	msrCTS = 0x10
	msrDSR = 0x20
	msrRI  = 0x40
	msrDCD = 0x80

	// serialFIFO is the receive FIFO depth: what the guest has not read yet.
	serialFIFO = 64
)

// Serial is an 8250-compatible UART (16550 FIFO behaviour): guest writes to
// THR go to Out, host input is queued by Input and read by the guest from RBR,
// with the THR-empty and received-data interrupts raised through IRQ.
type Serial struct {
	mu sync.Mutex // guards everything below; a leaf lock except for out.mu
	// IRQ raises the UART's interrupt (an edge). Called with mu held; it must
	// not block.
	irq func()

	ier, lcr, mcr, scr, fcr byte
	dll, dlm                byte
	thrPending              bool   // a THR-empty interrupt awaits the guest
	rx                      []byte // receive FIFO, at most serialFIFO bytes
	space                   *sync.Cond
	closed                  bool

	out *lineWriter
}

// NewSerial returns a UART writing guest output to out and raising its
// interrupt through irq (nil: no interrupt).
func NewSerial(out io.Writer, irq func()) *Serial {
	s := &Serial{irq: irq, mcr: mcrOUT2, dll: 12 /* 9600 baud */, out: newLineWriter(out)}
	s.space = sync.NewCond(&s.mu)
	return s
}

// Read implements Device.
func (s *Serial) Read(offset uint64, data []byte) {
	if len(data) == 0 {
		return
	}
	clear(data)
	s.mu.Lock()
	defer s.mu.Unlock()
	var v byte
	switch offset {
	case uartRBR:
		if s.lcr&lcrDLAB != 0 {
			v = s.dll
			break
		}
		if len(s.rx) > 0 {
			v = s.rx[0]
			s.rx = s.rx[1:]
			if len(s.rx) == 0 {
				s.rx = nil // let the backing array go
			}
			s.space.Broadcast()
		}
		s.update()
	case uartIER:
		if s.lcr&lcrDLAB != 0 {
			v = s.dlm
		} else {
			v = s.ier
		}
	case uartIIR:
		v = s.iir()
		if v&0x0f == iirTHRI {
			s.thrPending = false // reading IIR clears a THR-empty interrupt
		}
		if s.fcr&fcrEnable != 0 {
			v |= iirFIFO
		}
	case uartLCR:
		v = s.lcr
	case uartMCR:
		v = s.mcr
	case uartLSR:
		v = lsrTHRE | lsrTEMT // output is never held back
		if len(s.rx) > 0 {
			v |= lsrDR
		}
	case uartMSR:
		if s.mcr&mcrLoop != 0 {
			// Loopback: the modem inputs reflect the modem outputs.
			if s.mcr&mcrDTR != 0 {
				v |= msrDSR
			}
			if s.mcr&mcrRTS != 0 {
				v |= msrCTS
			}
			if s.mcr&mcrOUT1 != 0 {
				v |= msrRI
			}
			if s.mcr&mcrOUT2 != 0 {
				v |= msrDCD
			}
		} else {
			v = msrDCD | msrDSR | msrCTS
		}
	case uartSCR:
		v = s.scr
	}
	data[0] = v
}

// Write implements Device.
func (s *Serial) Write(offset uint64, data []byte) {
	if len(data) == 0 {
		return
	}
	v := data[0]
	s.mu.Lock()
	defer s.mu.Unlock()
	switch offset {
	case uartTHR:
		if s.lcr&lcrDLAB != 0 {
			s.dll = v
			return
		}
		if s.mcr&mcrLoop != 0 {
			if len(s.rx) < serialFIFO {
				s.rx = append(s.rx, v)
			}
		} else {
			s.out.put(v)
		}
		// The byte left at once: THR is empty again.
		s.thrPending = s.ier&ierTHRI != 0
		s.update()
	case uartIER:
		if s.lcr&lcrDLAB != 0 {
			s.dlm = v
			return
		}
		old := s.ier
		s.ier = v & ierMask
		if old&ierTHRI == 0 && s.ier&ierTHRI != 0 {
			s.thrPending = true // enabling THRI with THR empty interrupts at once
		}
		s.update()
	case uartFCR:
		s.fcr = v & fcrEnable
		if v&0x02 != 0 { // clear receive FIFO
			s.rx = nil
			s.space.Broadcast()
		}
		s.update()
	case uartLCR:
		s.lcr = v
	case uartMCR:
		s.mcr = v & mcrMask
		s.update()
	case uartSCR:
		s.scr = v
	}
}

// iir computes the highest-priority pending interrupt. Called with mu held.
func (s *Serial) iir() byte {
	switch {
	case s.ier&ierRDI != 0 && len(s.rx) > 0:
		return iirRDI
	case s.ier&ierTHRI != 0 && s.thrPending:
		return iirTHRI
	}
	return iirNone
}

// update raises the interrupt when one is pending and the guest has OUT2 set
// (on a PC, OUT2 gates the UART's interrupt line). Called with mu held.
func (s *Serial) update() {
	if s.irq != nil && s.iir() != iirNone && s.mcr&mcrOUT2 != 0 {
		s.irq()
	}
}

// Input queues host bytes for the guest, blocking while the receive FIFO is
// full (input is never dropped). It returns early, with the count queued, once
// Close is called.
func (s *Serial) Input(p []byte) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for n < len(p) && !s.closed {
		if len(s.rx) >= serialFIFO {
			s.space.Wait()
			continue
		}
		k := min(len(p)-n, serialFIFO-len(s.rx))
		s.rx = append(s.rx, p[n:n+k]...)
		n += k
		s.update()
	}
	return n
}

// Close wakes a blocked Input and flushes pending output.
func (s *Serial) Close() {
	s.mu.Lock()
	s.closed = true
	s.space.Broadcast()
	s.mu.Unlock()
	s.out.Flush()
}

// Flush writes out any buffered guest output.
func (s *Serial) Flush() { s.out.Flush() }

// lineWriter buffers guest output and writes it at each newline, when the
// buffer fills, or shortly after the last byte (a prompt without a newline).
type lineWriter struct {
	mu    sync.Mutex // guards buf, timer; taken under Serial.mu
	w     io.Writer
	buf   []byte
	timer *time.Timer
}

const (
	lineBufSize    = 4096
	lineFlushDelay = 20 * time.Millisecond
)

func newLineWriter(w io.Writer) *lineWriter { return &lineWriter{w: w} }

func (l *lineWriter) put(c byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, c)
	if c == '\n' || len(l.buf) >= lineBufSize {
		l.flushLocked()
		return
	}
	if l.timer == nil {
		l.timer = time.AfterFunc(lineFlushDelay, l.Flush)
	} else {
		l.timer.Reset(lineFlushDelay)
	}
}

func (l *lineWriter) Flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.flushLocked()
}

func (l *lineWriter) flushLocked() {
	if len(l.buf) > 0 && l.w != nil {
		_, _ = l.w.Write(l.buf) // console output is best effort: a closed stdout must not stop the guest
	}
	l.buf = l.buf[:0]
}
