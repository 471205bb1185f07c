package vsock_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/microvm/microvm/virtio/virtiotest"
	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/vsocktest"
)

// floodLimit is how many batches a flooding guest refills before it gives
// up: a device whose TX pass has no bound returns only then.
const floodLimit = 2000

// maxBatchesAfter is how many more batches a worker may finish once what
// it must turn to (the other direction) is there: the rest of the pass
// under way, one budget of four batches, and one for slack.
const maxBatchesAfter = 6

// flood keeps a TX-side queue full from the device's own worker: after each
// batch the worker publishes, it takes back the used chains and makes as
// many again available, each the packet at addr, n bytes. It counts the
// batches and stops refilling after floodLimit.
type flood struct {
	mu      sync.Mutex // the test's first fill and the worker's refills
	q       *virtiotest.Queue
	addr    uint64
	n       uint32
	batches atomic.Int64
}

func (f *flood) refill() {
	if f.batches.Add(1) > floodLimit {
		return
	}
	f.fill()
}

// fill takes back the used chains and fills the queue.
func (f *flood) fill() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.q.Reap()
	for f.q.Free() > 0 {
		if _, ok := f.q.Add(virtiotest.Buf{Addr: f.addr, Len: f.n}); !ok {
			return
		}
	}
}

// newFlood writes pkt to guest memory for a flood on q.
func newFlood(t *testing.T, g *vsocktest.Guest, q *virtiotest.Queue, pkt []byte) *flood {
	a := g.Mem.Alloc(uint64(len(pkt)), 64)
	if err := g.Mem.Write(a, pkt); err != nil {
		t.Fatal(err)
	}
	return &flood{q: q, addr: a, n: uint32(len(pkt))}
}

// spinUntil waits for cond without polling the guest's rings (the flood's
// refills use them from the device's worker).
func spinUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(waitTimeout); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// stopDuringFlood resets the device while f goes on and checks that the
// worker stopped while the guest was still posting. (How many batches it
// handles after the stop eventfd fires cannot be seen from here: Stop
// first stops the other workers, and the flood rightly goes on meanwhile.)
func stopDuringFlood(t *testing.T, e *env, f *flood) {
	t.Helper()
	spinUntil(t, "the flood to start", func() bool { return f.batches.Load() >= 3 })
	e.g.Reset() // returns once the workers have stopped
	if n := f.batches.Load(); n > floodLimit {
		t.Errorf("Stop returned only after the guest stopped posting (%d batches)", n)
	}
}

// A guest that keeps the TX ring full delayed Stop for as long as it
// posted: the TX pass ran while the ring was not empty and looked at its
// stop eventfd only after. Each pass now ends after txPassBudget chains.
func TestTXPassBoundedUnderFlood(t *testing.T) {
	e := newEnv(t, envOpts{})
	var hb [vsock.HeaderSize]byte
	// An RST for no connection: the device drops it without a word.
	h := e.g.Header(vsock.OpRst, 1024, 5000)
	h.Encode(hb[:])
	f := newFlood(t, e.g, e.g.TX, hb[:])
	e.dev.SetBatchHooks(f.refill, nil)
	f.fill()
	e.g.Kick()
	stopDuringFlood(t, e, f)
	if s := e.dev.Stats(); s.TxPassesCut == 0 {
		t.Errorf("no TX pass was cut at its budget (stats %+v)", s)
	}
}

// A guest flooding the datagram TX queue kept the datagram worker from its
// RX side (and from Stop) for as long as it posted. A host datagram now
// reaches the guest within a pass's budget of the flood.
func TestDgramTXPassBoundedUnderFlood(t *testing.T) {
	e, _ := dgramEnv(t, vsocktest.Options{})
	// A datagram to a host port nobody listens on: dropped and counted.
	var hb [vsock.HeaderSize]byte
	h := e.g.DgramHeader(1024, 7000, 0)
	h.Encode(hb[:])
	f := newFlood(t, e.g, e.g.DTX, hb[:])
	var sentAt, gotAt atomic.Int64
	sentAt.Store(-1)
	gotAt.Store(-1)
	dev := e.dev
	e.dev.SetBatchHooks(nil, func() {
		if sentAt.Load() >= 0 && gotAt.Load() < 0 && dev.Stats().DgramRx > 0 {
			gotAt.Store(f.batches.Load())
		}
		f.refill()
	})
	f.fill()
	if err := e.g.DTXKick.Signal(); err != nil {
		t.Fatal(err)
	}
	spinUntil(t, "the flood to start", func() bool { return f.batches.Load() >= 3 })
	sender := hostDgramSender(t, e.dev)
	at := f.batches.Load()
	if _, err := sender.Write(withPrefix(1024, 6000, []byte("from the host"))); err != nil {
		t.Fatal(err)
	}
	sentAt.Store(at)
	spinUntil(t, "the host datagram to reach the guest", func() bool {
		return gotAt.Load() >= 0 || f.batches.Load() > floodLimit && e.dev.Stats().DgramRx > 0
	})
	switch got := gotAt.Load(); {
	case got < 0:
		t.Errorf("the host datagram reached the guest only after the flood (%d batches)", floodLimit)
	case got-at > maxBatchesAfter:
		t.Errorf("the host datagram reached the guest %d flood batches after it was sent (at most %d)", got-at, maxBatchesAfter)
	}
	if s := e.dev.Stats(); s.DgramPassesCut == 0 {
		t.Errorf("no datagram TX pass was cut at its budget (stats %+v)", s)
	}
	stopDuringFlood(t, e, f)
}
