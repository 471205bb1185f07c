package virtio_test

import (
	"errors"
	"testing"

	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
)

// qenv is one split virtqueue seen from both sides: the virtiotest driver
// and the device's virtio.Queue over the same guest memory. Tests and
// benchmarks share it.
type qenv struct {
	mem *virtiotest.Memory
	drv *virtiotest.Queue
	dev *virtio.Queue
	c   virtio.Chain
}

type qopts struct {
	size     uint16
	memSize  uint64 // default 1 MiB
	eventIdx bool
	indirect bool
}

func newQEnv(tb testing.TB, o qopts) *qenv {
	tb.Helper()
	if o.memSize == 0 {
		o.memSize = 1 << 20
	}
	mem := virtiotest.NewMemory(tb, o.memSize)
	drv := virtiotest.NewQueue(mem, o.size, o.eventIdx)
	if err := drv.Cfg.Validate(mem.Memory, virtio.MaxQueueSize); err != nil {
		tb.Fatalf("driver queue config: %v", err)
	}
	return &qenv{
		mem: mem,
		drv: drv,
		dev: virtio.NewQueue(mem.Memory, drv.Cfg, o.eventIdx, o.indirect),
	}
}

// buf allocates n bytes of guest memory filled with a pattern derived from
// seed and returns it as a driver buffer.
func (e *qenv) buf(n uint32, writable bool, seed byte) virtiotest.Buf {
	addr := e.mem.Alloc(uint64(n), 8)
	p := make([]byte, n)
	for i := range p {
		p[i] = seed + byte(i)
	}
	if err := e.mem.Write(addr, p); err != nil {
		panic(err)
	}
	return virtiotest.Buf{Addr: addr, Len: n, Writable: writable}
}

// pop pops one chain and fails the test unless there was one.
func (e *qenv) pop(tb testing.TB) *virtio.Chain {
	tb.Helper()
	ok, err := e.dev.Pop(&e.c)
	if err != nil || !ok {
		tb.Fatalf("Pop = %v, %v; want a chain", ok, err)
	}
	return &e.c
}

// wantGuestErr fails unless err wraps virtio.ErrGuest.
func wantGuestErr(tb testing.TB, what string, err error) {
	tb.Helper()
	if !errors.Is(err, virtio.ErrGuest) {
		tb.Errorf("%s: error %v; want one wrapping ErrGuest", what, err)
	}
}

// lens returns the lengths of bufs.
func lens(bufs [][]byte) []int {
	var out []int
	for _, b := range bufs {
		out = append(out, len(b))
	}
	return out
}

// ring is a queue whose available ring is filled once with valid chains, so
// that each step only bumps the available index and runs the device side:
// Pop, Push, NeedsNotification. Benchmarks and the allocation test use it.
type ring struct {
	e     *qenv
	avail uint16
	wlen  uint32
}

// newRing builds size/ndesc direct chains of ndesc descriptors (the last one
// writable), or with indirect size chains of one indirect descriptor each.
func newRing(tb testing.TB, size uint16, ndesc int, eventIdx, indirect bool) *ring {
	tb.Helper()
	e := newQEnv(tb, qopts{size: size, eventIdx: eventIdx, indirect: indirect, memSize: 4 << 20})
	bufs := make([]virtiotest.Buf, ndesc)
	for i := range bufs {
		bufs[i] = e.buf(256, i == ndesc-1, byte(i))
	}
	var heads []uint16
	for {
		var h uint16
		var ok bool
		if indirect {
			h, ok = e.drv.AddIndirect(bufs...)
		} else {
			h, ok = e.drv.Add(bufs...)
		}
		if !ok {
			break
		}
		heads = append(heads, h)
	}
	if len(heads) == 0 || int(size)%len(heads) != 0 {
		tb.Fatalf("ring: %d chains do not tile a queue of %d", len(heads), size)
	}
	for i := len(heads); i < int(size); i++ {
		e.drv.PublishHead(heads[i%len(heads)])
	}
	e.drv.SetAvailIdx(0)
	return &ring{e: e, wlen: 256}
}

// step makes one more chain available and runs it through the device.
func (r *ring) step(tb testing.TB) {
	r.avail++
	r.e.drv.SetAvailIdx(r.avail)
	ok, err := r.e.dev.Pop(&r.e.c)
	if !ok || err != nil {
		tb.Fatalf("Pop = %v, %v", ok, err)
	}
	if err := r.e.dev.Push(r.e.c.Head, r.wlen); err != nil {
		tb.Fatal(err)
	}
	if _, err := r.e.dev.NeedsNotification(); err != nil {
		tb.Fatal(err)
	}
}
