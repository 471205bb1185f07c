package devices

import "errors"

// Saved state (snapshots). Each device that holds guest-visible
// state has a state type, XState, that is its snapshot form: plain data
// with exported fields (no pointers, funcs or channels) that
// internal/snapshot encodes with encoding/json. Fields are matched by name,
// so the field names are the format's version: a field added later must
// mean "as before" when an older snapshot lacks it (its zero value), and a
// field is never reused with another meaning.
//
// SaveState reads the state under the device's lock (PVWait's is an atomic
// flag). The caller stops the vCPUs (and any host goroutine feeding the
// device, such as the console pump calling Serial.Input) first, so that the
// devices and KVM's state describe the same instant; the lock keeps a stray
// access race-free anyway.
//
// RestoreState checks every field against what the device can hold before
// changing anything: a snapshot file may be corrupt or hostile, so an
// out-of-range value is refused with an error wrapping ErrBadState and the
// device is left as it was. On success the device behaves as the saved one
// would from then on. What a device derives from its registers (a UART's
// line status, an IOAPIC's routes) is not saved but recomputed, and
// whatever it derives from the host (the RTC's time of day, the console
// writer, callbacks) stays the new device's.
//
// Restore order: restore the devices after KVM's state (kvm's
// VCPU.RestoreState and VM.RestoreState, which overwrite the interrupt
// controllers) and before the vCPUs run, and the IOAPIC before the
// devices that interrupt through it, since Serial.RestoreState raises its
// interrupt again when the saved state had one pending.

// Stateful is a device with a saved state of type S. Serial, I8042, CMOS,
// PortB, IOAPIC and PVWait are; DebugExit and PowerControl hold nothing
// the guest can observe (their registers read 0 and their writes only call
// the host), so they have no state.
type Stateful[S any] interface {
	// SaveState returns the device's state.
	SaveState() S
	// RestoreState makes the device's state st, or returns an error
	// wrapping ErrBadState and changes nothing.
	RestoreState(st S) error
}

var (
	_ Stateful[SerialState] = (*Serial)(nil)
	_ Stateful[I8042State]  = (*I8042)(nil)
	_ Stateful[CMOSState]   = (*CMOS)(nil)
	_ Stateful[PortBState]  = (*PortB)(nil)
	_ Stateful[IOAPICState] = (*IOAPIC)(nil)
	_ Stateful[PVWaitState] = (*PVWait)(nil)
)

// ErrBadState is wrapped by every error of a RestoreState that refuses a
// state the device cannot be in.
var ErrBadState = errors.New("invalid saved device state")

// cloneBytes copies b for a saved state, nil when empty, so that a saved
// or restored state never aliases a device's buffer and an empty queue
// always encodes the same way (null).
func cloneBytes(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}
