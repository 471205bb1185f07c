package devices

import "fmt"

// SerialState is the snapshot form of a Serial (see state.go): the
// registers the guest can set and the receive FIFO. Fields are matched by
// name when decoded; a field added later must default (zero) to the
// behaviour of a snapshot that lacks it.
//
// Not saved, because they are derived: LSR (THRE and TEMT always set, as
// output is never held back; DR set exactly when RX is not empty; no error
// bits are ever raised), MSR (fixed, or the MCR outputs in loopback), IIR
// and whether the interrupt line is asserted (both follow from IER, RX,
// THRPending and MCR's OUT2). Not saved, because they are the host's:
// guest output the line buffer still holds (it has left the guest; flush
// it to the old console with Flush), host input an Input call is still
// waiting to queue (it never reached the device: stop the console pump
// before saving), the output writer, the irq callback and Close.
type SerialState struct {
	IER byte // interrupt enable: bits 0-3 (RDI, THRI, RLSI, MSI) only
	LCR byte // line control, DLAB (bit 7) included
	MCR byte // modem control: bits 0-4 (DTR, RTS, OUT1, OUT2, loop) only
	SCR byte // scratch
	// FCR is the FIFO control as kept: only bit 0 (FIFOs enabled); the
	// other bits are actions, not state.
	FCR      byte
	DLL, DLM byte // divisor latch, low and high
	// THRPending: a THR-empty interrupt is pending until the guest reads
	// IIR (it is seen only while IER enables THRI).
	THRPending bool
	// RX is the receive FIFO, oldest byte first: what the guest has not
	// read yet. At most 64 bytes.
	RX []byte
}

// SaveState returns the UART's state. See state.go for when to call it.
func (s *Serial) SaveState() SerialState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return SerialState{
		IER: s.ier, LCR: s.lcr, MCR: s.mcr, SCR: s.scr, FCR: s.fcr,
		DLL: s.dll, DLM: s.dlm,
		THRPending: s.thrPending,
		RX:         cloneBytes(s.rx),
	}
}

// RestoreState replaces the UART's registers and receive FIFO with st, or
// returns an error wrapping ErrBadState, changing nothing, when st holds
// a value the UART cannot (a reserved bit, a FIFO over 64 bytes).
//
// The interrupt is an edge (an irqfd), so the saved state cannot say
// whether the guest's interrupt controller already saw it: when st has an
// interrupt pending and OUT2 set, RestoreState raises it once, as the
// register write that made it pending did. A duplicate costs the guest's
// handler one IIR read that finds nothing; a lost edge would leave the
// UART's interrupt unserviced for good (nothing pending would ever raise
// it again). Restore the UART after the interrupt controllers, then: see
// state.go.
func (s *Serial) RestoreState(st SerialState) error {
	if err := st.check(); err != nil {
		return fmt.Errorf("serial: restore: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ier, s.lcr, s.mcr, s.scr, s.fcr = st.IER, st.LCR, st.MCR, st.SCR, st.FCR
	s.dll, s.dlm = st.DLL, st.DLM
	s.thrPending = st.THRPending
	s.rx = cloneBytes(st.RX)
	s.space.Broadcast() // the FIFO may have room now
	s.update()
	return nil
}

// check reports the first field of st that a Serial cannot hold.
func (st *SerialState) check() error {
	for _, r := range []struct {
		name    string
		v, mask byte
	}{
		{"IER", st.IER, ierMask},
		{"MCR", st.MCR, mcrMask},
		{"FCR", st.FCR, fcrEnable}, // the other bits are actions or reserved
	} {
		if extra := r.v &^ r.mask; extra != 0 {
			return fmt.Errorf("%s %#02x has bits %#02x set that it cannot hold: %w", r.name, r.v, extra, ErrBadState)
		}
	}
	if len(st.RX) > serialFIFO {
		return fmt.Errorf("receive FIFO of %d bytes, more than the UART's %d: %w", len(st.RX), serialFIFO, ErrBadState)
	}
	return nil
}
