package devices

import "fmt"

// I8042State is the snapshot form of an I8042 (see state.go): the
// controller configuration byte, the status register, a command waiting
// for its data byte and the replies the guest has not read. Fields are
// matched by name when decoded; a field added later must default (zero)
// to the behaviour of a snapshot that lacks it.
//
// The controller raises no interrupt (it has no keyboard or mouse to
// report), so restoring asserts nothing; the Reset callback is the new
// device's.
type I8042State struct {
	CTR byte // controller configuration byte ("command byte")
	// Status is the status register without OBF, which follows from Out:
	// SYS (bit 2) always, and CMD (bit 3) when the guest's last write was
	// to the command port.
	Status byte
	// Pending is the command waiting for its data byte: 0 (none), 0x60
	// (write CTR) or 0xd1 (write output port). It is only ever set by a
	// command write, so with CMD set in Status.
	Pending byte
	// Out holds the replies for the guest to read from the data port,
	// oldest first; at most 16.
	Out []byte
}

// SaveState returns the controller's state. See state.go for when to call
// it.
func (k *I8042) SaveState() I8042State {
	k.mu.Lock()
	defer k.mu.Unlock()
	return I8042State{CTR: k.ctr, Status: k.status, Pending: k.pending, Out: cloneBytes(k.out)}
}

// RestoreState replaces the controller's state with st, or returns an
// error wrapping ErrBadState, changing nothing, when st holds something the
// controller cannot (status bits other than SYS and CMD, SYS clear, an
// unknown pending command, more than 16 queued replies).
func (k *I8042) RestoreState(st I8042State) error {
	if err := st.check(); err != nil {
		return fmt.Errorf("i8042: restore: %w", err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.ctr, k.status, k.pending = st.CTR, st.Status, st.Pending
	k.out = cloneBytes(st.Out)
	return nil
}

// check reports the first field of st that an I8042 cannot hold.
func (st *I8042State) check() error {
	const kept = i8042StatusSys | i8042StatusCmd
	if extra := st.Status &^ kept; extra != 0 {
		return fmt.Errorf("status %#02x has bits %#02x set that are not kept (OBF follows from Out): %w", st.Status, extra, ErrBadState)
	}
	if st.Status&i8042StatusSys == 0 {
		return fmt.Errorf("status %#02x without the system flag, which is never cleared: %w", st.Status, ErrBadState)
	}
	switch st.Pending {
	case 0:
	case i8042CmdWriteCTR, i8042CmdWriteOut:
		if st.Status&i8042StatusCmd == 0 {
			return fmt.Errorf("command %#02x pending but the last write was data: %w", st.Pending, ErrBadState)
		}
	default:
		return fmt.Errorf("pending command %#02x takes no data byte: %w", st.Pending, ErrBadState)
	}
	if len(st.Out) > i8042QueueMax {
		return fmt.Errorf("%d queued replies, more than the controller's %d: %w", len(st.Out), i8042QueueMax, ErrBadState)
	}
	return nil
}
