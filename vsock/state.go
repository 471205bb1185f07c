package vsock

import (
	"encoding/json"
	"fmt"

	"github.com/microvm/microvm/virtio"
)

// Saved state (virtio.StatefulDevice, snapshots). Connections are not
// saved: no host socket outlives the process, and a quiesce closes them
// all (quiesce.go). The guest CID is not saved either: it is Config, and a
// restored clone may be given another one. What is left is the one thing
// the restored device must do that a fresh one would not: tell the guest
// driver, before anything else, that every connection it holds through the
// device is gone, with a TRANSPORT_RESET on the event queue; the driver
// also re-reads the CID on it.
//
// A restored device always does, whatever the state says: it holds none of
// the saved device's connections, and its driver may have read a CID the
// new Config changes. An event the driver did not need costs it nothing
// (it has no connected socket through the device to reset). The saved
// field records whether the saved device owed the event (always, once a
// running session was quiesced), for whoever reads the snapshot, and is
// checked for form like any field.

// State is the device's saved state, as JSON; the field names are the
// format's version (devices/state.go).
type State struct {
	// TransportReset: the saved device owed its driver a TRANSPORT_RESET
	// (a session was quiesced since the driver last reset the device).
	TransportReset bool
}

// stateFields are State's JSON fields; a restored state must have exactly
// these.
var stateFields = []string{"TransportReset"}

// SaveDeviceState implements virtio.StatefulDevice. Called after Quiesce.
func (d *Device) SaveDeviceState() (json.RawMessage, error) {
	b, err := json.Marshal(State{TransportReset: d.resetOwed.Load()})
	if err != nil {
		return nil, fmt.Errorf("vsock: save state: %w", err)
	}
	return b, nil
}

// RestoreDeviceState implements virtio.StatefulDevice: the first session
// of the restored device starts with a TRANSPORT_RESET (see above). st may
// be nil or JSON null (a snapshot without vsock state); otherwise it must
// be a JSON object with exactly State's fields, each of its type, or it is
// refused with an error wrapping virtio.ErrBadState and nothing changes.
// It refuses (virtio.ErrInUse) while a driver uses the device.
func (d *Device) RestoreDeviceState(st json.RawMessage) error {
	if len(st) != 0 && string(st) != "null" {
		if _, err := decodeState(st); err != nil {
			return fmt.Errorf("vsock: %w: %w", virtio.ErrBadState, err)
		}
	}
	if _, active := d.life.Current(); active {
		return fmt.Errorf("vsock: restore device state: %w", virtio.ErrInUse)
	}
	d.resetOwed.Store(true)
	return nil
}

// decodeState decodes a saved State strictly: one JSON object, no field
// missing, unknown or spelt in another case, booleans as true or false.
func decodeState(st json.RawMessage) (State, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(st, &fields); err != nil {
		return State{}, fmt.Errorf("state %.64q: %w", st, err)
	}
	if fields == nil {
		return State{}, fmt.Errorf("state %.64q is not an object", st)
	}
	for k := range fields {
		known := false
		for _, f := range stateFields {
			known = known || k == f
		}
		if !known {
			return State{}, fmt.Errorf("unknown field %.64q", k)
		}
	}
	var s State
	v, ok := fields["TransportReset"]
	switch {
	case !ok:
		return State{}, fmt.Errorf("field TransportReset missing")
	case string(v) == "true":
		s.TransportReset = true
	case string(v) != "false":
		return State{}, fmt.Errorf("TransportReset is %.64q; want true or false", v)
	}
	return s, nil
}

var _ virtio.StatefulDevice = (*Device)(nil)
