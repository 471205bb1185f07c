package virtio_test

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
)

// dataDev is a statefulDev with bulk data.
type dataDev struct {
	statefulDev
	data    []byte // what SaveDeviceData hands out; nil: none
	gotData []byte // what RestoreDeviceData read
}

func (d *dataDev) SaveDeviceData() (io.Reader, error) {
	if d.data == nil {
		return nil, nil
	}
	return bytes.NewReader(d.data), nil
}

func (d *dataDev) RestoreDeviceData(r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	if string(b) == "bad" {
		return virtio.ErrBadState
	}
	d.gotData = b
	return nil
}

// TestMMIODeviceData: SaveData hands out a DataDevice's data only while it
// is quiesced, and none for other devices; RestoreData hands data to a
// fresh transport's DataDevice and refuses it for a transport in use or a
// device without data.
func TestMMIODeviceData(t *testing.T) {
	dev := &dataDev{statefulDev: statefulDev{fakeDevice: newFakeDevice()}, data: []byte("overlay")}
	e := &menv{mem: virtiotest.NewMemory(t, 1<<20), dev: dev.fakeDevice}
	e.m = newMMIO(t, dev, e.mem.Memory, func() {})
	e.start(t, allQueueFeatures, e.driverQueues(true, 8))
	if _, err := e.m.SaveData(); !errors.Is(err, virtio.ErrNotQuiesced) {
		t.Errorf("SaveData while running: %v; want ErrNotQuiesced", err)
	}
	if err := e.m.RestoreData(bytes.NewReader(nil)); !errors.Is(err, virtio.ErrInUse) {
		t.Errorf("RestoreData on a transport in use: %v; want ErrInUse", err)
	}
	if err := e.m.Quiesce(); err != nil {
		t.Fatal(err)
	}
	r, err := e.m.SaveData()
	if err != nil || r == nil {
		t.Fatalf("SaveData: %v, %v", r, err)
	}
	if b, _ := io.ReadAll(r); string(b) != "overlay" {
		t.Errorf("SaveData read %q", b)
	}
	dev.data = nil
	if r, err := e.m.SaveData(); r != nil || err != nil {
		t.Errorf("SaveData of a device without data now: %v, %v", r, err)
	}

	fresh := &dataDev{statefulDev: statefulDev{fakeDevice: newFakeDevice()}}
	m := newMMIO(t, fresh, e.mem.Memory, func() {})
	if err := m.RestoreData(bytes.NewReader([]byte("overlay"))); err != nil || string(fresh.gotData) != "overlay" {
		t.Errorf("RestoreData: %v, device read %q", err, fresh.gotData)
	}
	if err := newMMIO(t, &dataDev{statefulDev: statefulDev{fakeDevice: newFakeDevice()}}, e.mem.Memory, func() {}).
		RestoreData(bytes.NewReader([]byte("bad"))); !errors.Is(err, virtio.ErrBadState) {
		t.Errorf("RestoreData of data the device refuses: %v; want ErrBadState", err)
	}

	plain := newMMIO(t, newFakeDevice(), e.mem.Memory, func() {})
	if r, err := plain.SaveData(); r != nil || err != nil {
		t.Errorf("SaveData of a device without data: %v, %v", r, err)
	}
	if err := plain.RestoreData(bytes.NewReader(nil)); !errors.Is(err, virtio.ErrBadState) {
		t.Errorf("RestoreData to a device without data: %v; want ErrBadState", err)
	}
}
