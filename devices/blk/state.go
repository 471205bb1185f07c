package blk

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"github.com/microvm/microvm/virtio"
)

// Saved state (virtio.StatefulDevice, virtio.DataDevice; snapshots). A
// disk over a plain image has none: its content is the image, which the
// snapshot names and checks (size, modification time) rather than copies,
// and everything else it has is Config. It saves no state (nil: the
// transport's JSON then has no Device field, as before blk was a
// StatefulDevice).
//
// A CopyOnWrite disk's content is the image plus its overlay, which goes
// away with the process. One whose overlay holds blocks saves, as its
// state, how many (savedState), and, as its data, the overlay's bitmap
// and blocks (overlay_save.go): a part of the snapshot of its own, of up
// to the disk's size, so never in the transport's JSON. A restore is
// handed the data first, into the fresh overlay of a device not yet
// activated, then the state, which checks that the two agree: a snapshot
// whose data part went missing is refused, never restored as the bare
// base. One with an empty overlay saves like a plain disk.

// savedState is a CopyOnWrite disk's saved state.
type savedState struct {
	// OverlayBlocks is how many blocks the overlay held: the data part
	// restored must hold as many.
	OverlayBlocks uint64
}

// SaveDeviceState implements virtio.StatefulDevice: no state, or, for a
// CopyOnWrite disk whose overlay holds blocks, how many. Called after
// Quiesce, under the transport's mutex: no request is in flight, so the
// overlay's count is final, and it takes no lock (an atomic load).
func (d *Device) SaveDeviceState() (json.RawMessage, error) {
	if d.cow == nil {
		return nil, nil
	}
	n := d.cow.written.Load()
	if n == 0 {
		return nil, nil
	}
	return json.Marshal(savedState{OverlayBlocks: n})
}

// RestoreDeviceState implements virtio.StatefulDevice. A plain disk has no
// state, so st must be absent (nil or JSON null). A CopyOnWrite disk's
// state must count the blocks RestoreDeviceData put in its overlay (none
// when st is absent). Anything else is refused with an error wrapping
// virtio.ErrBadState.
func (d *Device) RestoreDeviceState(st json.RawMessage) error {
	absent := len(st) == 0 || string(st) == "null"
	if d.cow == nil {
		if !absent {
			return fmt.Errorf("blk: %w: device state %.64q for a disk, which has none", virtio.ErrBadState, st)
		}
		return nil
	}
	var s savedState
	if !absent {
		dec := json.NewDecoder(bytes.NewReader(st))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&s); err != nil {
			return fmt.Errorf("blk: %w: device state %.64q: %w", virtio.ErrBadState, st, err)
		}
	}
	if got := d.cow.written.Load(); got != s.OverlayBlocks {
		return fmt.Errorf("blk: %w: disk %s: the snapshot's overlay had %d blocks, its data part gave %d", virtio.ErrBadState, d.cfg.Path, s.OverlayBlocks, got)
	}
	return nil
}

// SaveDeviceData implements virtio.DataDevice: a CopyOnWrite disk whose
// overlay holds blocks returns a reader of its saved overlay; any other
// disk nil. The caller reads it to its end before the device resumes.
func (d *Device) SaveDeviceData() (io.Reader, error) {
	if d.cow == nil || d.cow.written.Load() == 0 {
		return nil, nil
	}
	return d.cow.saved(), nil
}

// RestoreDeviceData implements virtio.DataDevice: it fills the overlay of
// a CopyOnWrite disk, never activated, from r, read to its end. A plain
// disk has no data: it is refused with an error wrapping
// virtio.ErrBadState, as is a saved overlay that does not fit this disk or
// is cut short or long.
func (d *Device) RestoreDeviceData(r io.Reader) error {
	if d.cow == nil {
		return fmt.Errorf("blk: %w: disk %s: the snapshot has a copy-on-write overlay for it, but it is not opened with cow", virtio.ErrBadState, d.cfg.Path)
	}
	if err := d.cow.restore(r); err != nil {
		return fmt.Errorf("disk %s: %w", d.cfg.Path, err)
	}
	return nil
}

// OverlayInfo describes a CopyOnWrite disk's overlay (Device.Overlay).
type OverlayInfo struct {
	// BlockSize is CopyOnWriteBlockSize.
	BlockSize int
	// Blocks is the number of blocks of the disk, Written how many of
	// them the overlay holds (the guest wrote, write-zeroed or discarded
	// them).
	Blocks, Written uint64
	// BitmapBytes is the size of the bitmap of written blocks, fixed at
	// Open: 1 bit per block, in 64-bit words.
	BitmapBytes int
}

// Overlay describes the overlay of a CopyOnWrite disk; ok is false for
// any other.
func (d *Device) Overlay() (info OverlayInfo, ok bool) {
	o := d.cow
	if o == nil {
		return OverlayInfo{}, false
	}
	return OverlayInfo{BlockSize: CopyOnWriteBlockSize, Blocks: o.blocks(), Written: o.written.Load(),
		BitmapBytes: len(o.present) * 8}, true
}

var _ virtio.DataDevice = (*Device)(nil)
