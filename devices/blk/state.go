package blk

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/microvm/microvm/virtio"
)

// Saved state (virtio.StatefulDevice, snapshots). A disk over a plain
// image has none: its content is the image, which the snapshot names and
// checks (size, modification time) rather than copies, and everything
// else it has is Config. It saves no state (nil: the transport's JSON
// then has no Device field, as before blk was a StatefulDevice).
//
// A CopyOnWrite disk's content is the image plus its overlay, and the
// overlay goes away with the process; saving its blocks and bitmap would
// take a state part of its own (of up to the disk's size, so not the
// transport's JSON) and a restore that refills an overlay. Until that is
// built, a CopyOnWrite disk whose overlay holds any block refuses to save
// (ErrCopyOnWriteNotSaved), so that a snapshot never silently drops the
// guest's writes; one with an empty overlay saves like a plain disk, and
// its restore (a fresh overlay) is exact.

// ErrCopyOnWriteNotSaved is returned (wrapped) by SaveDeviceState for a
// CopyOnWrite disk the guest has written to.
var ErrCopyOnWriteNotSaved = errors.New("a copy-on-write disk's writes are not saved in snapshots yet")

// SaveDeviceState implements virtio.StatefulDevice: it returns no state,
// or, for a CopyOnWrite disk whose overlay holds blocks, an error wrapping
// ErrCopyOnWriteNotSaved. Called after Quiesce, under the transport's
// mutex: no request is in flight, so the overlay's count is final, and it
// takes no lock (an atomic load).
func (d *Device) SaveDeviceState() (json.RawMessage, error) {
	if d.cow != nil {
		if n := d.cow.written.Load(); n > 0 {
			return nil, fmt.Errorf("disk %s: %w (%d blocks of %d bytes written)", d.cfg.Path, ErrCopyOnWriteNotSaved, n, CopyOnWriteBlockSize)
		}
	}
	return nil, nil
}

// RestoreDeviceState implements virtio.StatefulDevice: the device has no
// state, so st must be absent (nil or JSON null); anything else is refused
// with an error wrapping virtio.ErrBadState.
func (d *Device) RestoreDeviceState(st json.RawMessage) error {
	if len(st) != 0 && string(st) != "null" {
		return fmt.Errorf("blk: %w: device state %.64q for a disk, which has none", virtio.ErrBadState, st)
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

var _ virtio.StatefulDevice = (*Device)(nil)
