package virtio

import (
	"fmt"
	"io"
)

// Bulk data of a device in a snapshot: what is too large for the
// transport's JSON (a copy-on-write disk's overlay, up to the disk's
// size). The machine writes it as a part of the snapshot of its own, next
// to the state, and hands it back before the transport's RestoreState, so
// that a device's state can check it and its first request after the
// restore finds it in place.

// DataDevice is a StatefulDevice with bulk data a snapshot carries.
type DataDevice interface {
	StatefulDevice
	// SaveDeviceData returns a reader of the device's data, or nil when
	// it has none now. It is called with the device quiesced, after
	// SaveDeviceState; the caller reads the reader to its end before the
	// device resumes.
	SaveDeviceData() (io.Reader, error)
	// RestoreDeviceData reads the device's data from r to its end, or
	// returns an error wrapping ErrBadState for data the device cannot
	// take. r may report a corruption only at its end. It is called on a
	// device never activated, before RestoreDeviceState; after an error
	// the device is discarded.
	RestoreDeviceData(r io.Reader) error
}

// SaveData returns a reader of the device's bulk data (DataDevice), nil
// when it has none or is no DataDevice. As for SaveState the device must
// be quiesced, and it must stay so until the reader is read to its end.
func (t *MMIO) SaveData() (io.Reader, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	dd, ok := t.dev.(DataDevice)
	if !ok {
		return nil, nil
	}
	if t.active {
		return nil, fmt.Errorf("virtio-mmio: save %s device data: %w", deviceName(t.dev.Type()), ErrNotQuiesced)
	}
	r, err := dd.SaveDeviceData()
	if err != nil {
		return nil, fmt.Errorf("virtio-mmio: save %s device data: %w", deviceName(t.dev.Type()), err)
	}
	return r, nil
}

// RestoreData hands r, the bulk data a snapshot saved for this slot, to
// the device, on a fresh transport before RestoreState. A device that is
// no DataDevice is refused with an error wrapping ErrBadState.
func (t *MMIO) RestoreData(r io.Reader) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	name := deviceName(t.dev.Type())
	if t.status != 0 || t.active || t.quiesced || t.needsReset.Load() {
		return fmt.Errorf("virtio-mmio: restore %s device data: %w", name, ErrInUse)
	}
	dd, ok := t.dev.(DataDevice)
	if !ok {
		return fmt.Errorf("virtio-mmio: restore %s device data: %w: the device has none", name, ErrBadState)
	}
	if err := dd.RestoreDeviceData(r); err != nil {
		return fmt.Errorf("virtio-mmio: restore %s device data: %w", name, err)
	}
	return nil
}
