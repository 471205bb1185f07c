package vsock_test

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/vsocktest"
)

// mmioDriver initialises a vsock device through the virtio-mmio transport
// as Linux does, over plain memory.
type mmioDriver struct {
	tb  testing.TB
	m   *virtio.MMIO
	mem *virtiotest.Memory
	rx  *virtiotest.Queue
	tx  *virtiotest.Queue
	rxb map[uint16]uint64
}

func (d *mmioDriver) r(off uint64) uint32 {
	var b [4]byte
	d.m.Read(off, b[:])
	return binary.LittleEndian.Uint32(b[:])
}

func (d *mmioDriver) w(off uint64, v uint32) {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	d.m.Write(off, b[:])
}

func (d *mmioDriver) addStatus(bits uint32) { d.w(virtio.RegStatus, d.r(virtio.RegStatus)|bits) }

// init resets the device and brings it up with fresh queues of size 64.
func (d *mmioDriver) init() {
	d.tb.Helper()
	d.w(virtio.RegStatus, 0)
	d.addStatus(virtio.StatusAcknowledge)
	d.addStatus(virtio.StatusDriver)
	f := uint64(virtio.FeatureVersion1 | virtio.FeatureEventIdx)
	d.w(virtio.RegDriverFeaturesSel, 1)
	d.w(virtio.RegDriverFeatures, uint32(f>>32))
	d.w(virtio.RegDriverFeaturesSel, 0)
	d.w(virtio.RegDriverFeatures, uint32(f))
	d.addStatus(virtio.StatusFeaturesOK)
	d.rx = virtiotest.NewQueue(d.mem, 64, false)
	d.tx = virtiotest.NewQueue(d.mem, 64, false)
	d.rxb = map[uint16]uint64{}
	for i, q := range []*virtiotest.Queue{d.rx, d.tx, virtiotest.NewQueue(d.mem, 64, false)} {
		d.w(virtio.RegQueueSel, uint32(i))
		d.w(virtio.RegQueueNum, uint32(q.Cfg.Size))
		d.w(virtio.RegQueueDescLow, uint32(q.Cfg.Desc))
		d.w(virtio.RegQueueDescHigh, uint32(q.Cfg.Desc>>32))
		d.w(virtio.RegQueueDriverLow, uint32(q.Cfg.Avail))
		d.w(virtio.RegQueueDriverHigh, uint32(q.Cfg.Avail>>32))
		d.w(virtio.RegQueueDeviceLow, uint32(q.Cfg.Used))
		d.w(virtio.RegQueueDeviceHigh, uint32(q.Cfg.Used>>32))
		d.w(virtio.RegQueueReady, 1)
	}
	d.addStatus(virtio.StatusDriverOK)
	if s := d.r(virtio.RegStatus); s != 15 {
		d.tb.Fatalf("status after DRIVER_OK: %s", virtio.StatusString(s))
	}
}

func (d *mmioDriver) postRX(size uint32) {
	a := d.mem.Alloc(uint64(max(size, 1)), 64)
	h, _ := d.rx.Add(virtiotest.Buf{Addr: a, Len: size, Writable: true})
	d.rxb[h] = a
	d.w(virtio.RegQueueNotify, vsock.QueueRX)
}

func (d *mmioDriver) send(h vsock.Header) {
	a := d.mem.Alloc(vsock.HeaderSize, 8)
	var b [vsock.HeaderSize]byte
	h.Encode(b[:])
	if err := d.mem.Write(a, b[:]); err != nil {
		d.tb.Fatal(err)
	}
	d.tx.Add(virtiotest.Buf{Addr: a, Len: vsock.HeaderSize})
	d.w(virtio.RegQueueNotify, vsock.QueueTX)
}

// recv waits for one RX packet.
func (d *mmioDriver) recv() vsock.Header {
	d.tb.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		if u := d.rx.Reap(); len(u) > 0 {
			var b [vsock.HeaderSize]byte
			if err := d.mem.Read(d.rxb[u[0].ID], b[:]); err != nil {
				d.tb.Fatal(err)
			}
			var h vsock.Header
			h.Decode(b[:])
			return h
		}
		if time.Now().After(deadline) {
			d.tb.Fatal("no RX packet")
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// The device under the virtio-mmio transport: identity and config space,
// a handshake, a device failure surfacing as DEVICE_NEEDS_RESET, and the
// driver's reset bringing it back.
func TestMMIO(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.g.Reset() // the transport activates the device from now on
	dev := e.dev
	d := &mmioDriver{tb: t, mem: virtiotest.NewMemory(t, 1<<20)}
	m, err := virtio.NewMMIO(dev, d.mem.Memory, func() {}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	d.m = m
	if id := d.r(virtio.RegDeviceID); id != virtio.DeviceVsock {
		t.Fatalf("device id %d; want %d", id, virtio.DeviceVsock)
	}
	if lo, hi := d.r(virtio.RegConfig), d.r(virtio.RegConfig+4); uint64(hi)<<32|uint64(lo) != vsocktest.DefaultCID {
		t.Fatalf("config guest_cid %#x; want %d", uint64(hi)<<32|uint64(lo), vsocktest.DefaultCID)
	}

	d.init()
	d.postRX(vsock.HeaderSize + 4096)
	req := vsock.Header{SrcCID: vsocktest.DefaultCID, DstCID: vsock.CIDHost, SrcPort: 1025, DstPort: 5000,
		Type: vsock.TypeStream, Op: vsock.OpRequest, BufAlloc: 4096}
	d.send(req)
	if h := d.recv(); h.Op != vsock.OpResponse || h.DstPort != 1025 || h.SrcPort != 5000 {
		t.Fatalf("got %v; want RESPONSE 5000->1025", &h)
	}
	e.dial.Accept(waitTimeout)

	// An RX buffer too small for a header: the device fails, the
	// transport says NEEDS_RESET.
	d.postRX(16)
	d.send(vsock.Header{SrcCID: vsocktest.DefaultCID, DstCID: vsock.CIDHost, SrcPort: 7, DstPort: 7,
		Type: vsock.TypeStream, Op: vsock.OpRW})
	deadline := time.Now().Add(waitTimeout)
	for d.r(virtio.RegStatus)&virtio.StatusNeedsReset == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("status %s: no NEEDS_RESET", virtio.StatusString(d.r(virtio.RegStatus)))
		}
		time.Sleep(100 * time.Microsecond)
	}
	if m.GuestErrors() == 0 {
		t.Error("the transport counted no guest error")
	}

	// The driver resets and starts again: the old connection is gone,
	// a new one works.
	d.init()
	d.postRX(vsock.HeaderSize + 4096)
	d.send(req)
	if h := d.recv(); h.Op != vsock.OpResponse {
		t.Fatalf("got %v after the reset; want RESPONSE", &h)
	}
	if s := dev.Stats(); s.ConnsOpen != 1 {
		t.Errorf("%d connections open; want the new one only", s.ConnsOpen)
	}
	e.allowFail, e.allowGuestErrs = true, true
}
