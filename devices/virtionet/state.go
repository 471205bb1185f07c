package virtionet

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/microvm/microvm/virtio"
)

// Saved state (virtio.StatefulDevice). The configuration space is mac,
// status and max_virtqueue_pairs; the last two are constants (the link is
// always up, one pair), but the MAC is the driver's, read once at probe,
// and need not be in the Config: a device made without Config.MAC picks a
// random one, which a restore in a new process would not pick again. So
// the MAC is saved, and restored:
//
//   - into a device made without Config.MAC: it becomes the saved one;
//   - into a device made with Config.MAC: it must be the saved one, or the
//     restore is refused. Whatever was set up for the configured address
//     (the user-mode network's --guest-mac, host-side filters) would not
//     match the address the guest's driver keeps using;
//   - into a device made with Config.MAC and Config.NewMAC: the device
//     keeps Config.MAC, a clone's own address, and whoever restores it
//     tells the guest (the agent's SetMAC), whose driver keeps the saved
//     one until then.
//
// Nothing else is saved: the rings' positions are the transport's, the
// negotiated features and offloads follow from the transport's saved
// features at activation, and the counters are the process's.

// State is the device's saved state, as JSON; the field names are the
// format's version (devices/state.go).
type State struct {
	// MAC is the guest's address, aa:bb:cc:dd:ee:ff.
	MAC string
}

// SaveDeviceState implements virtio.StatefulDevice.
func (d *Device) SaveDeviceState() (json.RawMessage, error) {
	b, err := json.Marshal(State{MAC: d.MAC().String()})
	if err != nil {
		return nil, fmt.Errorf("virtio-net: save state: %w", err)
	}
	return b, nil
}

// RestoreDeviceState implements virtio.StatefulDevice: it makes the MAC the
// saved one, or refuses (ErrBadState) a state that is not JSON of a State,
// a MAC that is not a unicast address, or one other than Config.MAC. A
// snapshot without device state keeps the device's MAC.
func (d *Device) RestoreDeviceState(st json.RawMessage) error {
	if len(st) == 0 || string(st) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(st))
	dec.DisallowUnknownFields()
	var s State
	if err := dec.Decode(&s); err != nil {
		return fmt.Errorf("virtio-net: %w: %w", virtio.ErrBadState, err)
	}
	m, err := ParseMAC(s.MAC)
	if err != nil {
		return fmt.Errorf("virtio-net: %w: %w", virtio.ErrBadState, err)
	}
	if d.cfg.MAC != nil && d.cfg.NewMAC {
		return nil // the configured address stays: a clone's own
	}
	if d.cfg.MAC != nil && !bytes.Equal(d.cfg.MAC, m) {
		return fmt.Errorf("virtio-net: %w: the guest uses MAC %v; the device is configured with %v", virtio.ErrBadState, m, d.cfg.MAC)
	}
	d.mu.Lock()
	copy(d.mac[:], m)
	d.mu.Unlock()
	return nil
}

var _ virtio.StatefulDevice = (*Device)(nil)
