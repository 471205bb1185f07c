package virtionet

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
)

// waitUntil polls cond until it holds, or fails the test after waitTimeout.
func waitUntil(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	for deadline := time.Now().Add(waitTimeout); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			tb.Fatalf("waited %v for %s", waitTimeout, what)
		}
	}
}

// rxGuest is the driver's receive side: it posts chains and takes the used
// ones back, failing the test on a chain returned empty, returned twice
// (not posted since it last came back) or never posted.
type rxGuest struct {
	e      *env
	posted map[uint16]rxBuf
}

func newRXGuest(e *env) *rxGuest { return &rxGuest{e: e, posted: map[uint16]rxBuf{}} }

// post posts n chains of one buffer of size bytes and kicks.
func (g *rxGuest) post(n int, size uint32) {
	g.e.tb.Helper()
	for h, b := range g.e.postRX(n, size) {
		if _, ok := g.posted[h]; ok {
			g.e.tb.Fatalf("the driver posted chain %d twice", h)
		}
		g.posted[h] = b
	}
}

// take returns the bytes the device wrote into the used chain u.
func (g *rxGuest) take(u virtiotest.Used) []byte {
	g.e.tb.Helper()
	b, ok := g.posted[u.ID]
	if !ok {
		g.e.tb.Fatalf("RX chain %d returned but not posted: returned twice", u.ID)
	}
	delete(g.posted, u.ID)
	if u.Len == 0 {
		g.e.tb.Fatalf("RX chain %d returned empty", u.ID)
	}
	return g.e.read(b, u.Len)
}

// expect receives the next frame, across as many chains as its header's
// num_buffers says, and checks it is want.
func (g *rxGuest) expect(want []byte) {
	g.e.tb.Helper()
	got := g.take(g.e.reap(g.e.rx, 1)[0])
	if len(got) < HeaderSize {
		g.e.tb.Fatalf("RX: first chain of a frame holds %d bytes, less than a header", len(got))
	}
	var h Header
	h.Decode(got)
	if h.NumBuffers == 0 {
		g.e.tb.Fatal("RX: num_buffers 0")
	}
	for _, u := range g.e.reap(g.e.rx, int(h.NumBuffers)-1) {
		got = append(got, g.take(u)...)
	}
	if !bytes.Equal(got[HeaderSize:], want) {
		g.e.tb.Fatalf("RX: got frame seq %d of %d bytes, want seq %d of %d bytes",
			seqOf(got[HeaderSize:]), len(got)-HeaderSize, seqOf(want), len(want))
	}
}

// seqOf is the sequence number frame encoded, -1 for a frame too short.
func seqOf(f []byte) int {
	if len(f) < 18 {
		return -1
	}
	return int(binary.BigEndian.Uint32(f[14:]))
}

// txGuest is the driver's transmit side and the host end that reads what
// it sent: frames of txSize bytes numbered from 0, which must come out in
// order and once each.
type txGuest struct {
	e     *env
	heads []uint16 // per frame sent, its chain
	next  int      // the frame the host expects next
	used  int      // TX chains reaped, in order
}

const txSize = 1000

func (g *txGuest) send(n int) {
	for range n {
		g.heads = append(g.heads, g.e.sendTX(hdrBytes(Header{}), frame(txSize, len(g.heads))))
	}
}

// check checks that p, read at the host end, is the next frame.
func (g *txGuest) check(p []byte) {
	g.e.tb.Helper()
	if want := append(hdrBytes(Header{}), frame(txSize, g.next)...); !bytes.Equal(p, want) {
		g.e.tb.Fatalf("host: got frame seq %d of %d bytes, want seq %d (lost, duplicated or reordered)",
			seqOf(p[min(len(p), HeaderSize):]), len(p), g.next)
	}
	g.next++
}

// receive reads frames at the host end, waiting for each, until all sent
// have come, and reaps their chains, which must come back in order.
func (g *txGuest) receive() {
	g.e.tb.Helper()
	for g.next < len(g.heads) {
		g.check(g.e.hostRead())
	}
	g.reap(g.e.reap(g.e.tx, len(g.heads)-g.used))
}

func (g *txGuest) reap(used []virtiotest.Used) {
	g.e.tb.Helper()
	for _, u := range used {
		if u.ID != g.heads[g.used] || u.Len != 0 {
			g.e.tb.Fatalf("TX used %+v, want chain %d of frame %d with length 0", u, g.heads[g.used], g.used)
		}
		g.used++
	}
}

// hostPending reads the frames waiting at the host end, without waiting.
func (e *env) hostPending() [][]byte {
	e.tb.Helper()
	var out [][]byte
	for {
		buf := make([]byte, HeaderSize+MaxFrame+1)
		n, err := unix.Read(e.host, buf)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return out
		case err != nil:
			e.tb.Fatalf("host read: %v", err)
		}
		out = append(out, buf[:n])
	}
}

// inFlight sets up traffic in flight both ways and returns once the
// device holds it:
//
//   - RX: of four 1 KiB chains, two hold frames 0 and 1 (received); frame 2
//     (3000 bytes) needs three, so the device holds the other two with the
//     frame, and frame 3 waits in the back-end;
//   - TX: 120 frames posted, more than the back-end takes (tapSndBuf): the
//     device has sent some and holds the one the back-end refused.
func inFlight(tb testing.TB, e *env, rx *rxGuest, tx *txGuest) {
	tb.Helper()
	rx.post(4, 1024)
	for i := range 2 {
		e.hostWrite(append(hdrBytes(Header{}), frame(100, i)...))
	}
	for i := range 2 {
		rx.expect(frame(100, i))
	}
	// With two chains left nothing stalls RX until frame 2.
	stalls := e.dev.Stats().RxStalls
	e.hostWrite(append(hdrBytes(Header{}), frame(3000, 2)...))
	e.hostWrite(append(hdrBytes(Header{}), frame(100, 3)...))
	waitUntil(tb, "RX to run out of buffers for frame 2", func() bool { return e.dev.Stats().RxStalls > stalls })
	tx.send(120)
	waitUntil(tb, "TX to find the back-end full", func() bool { return e.dev.Stats().TxStalls > 0 })
}

// sentOnce checks, with the device quiesced, that the TX chains returned
// are exactly the frames the back-end has, in order, and that some but not
// all went (the rest are the next session's).
func sentOnce(tb testing.TB, e *env, tx *txGuest) {
	tb.Helper()
	out := e.hostPending()
	for _, p := range out {
		tx.check(p)
	}
	tx.reap(e.tx.Reap())
	if tx.used != tx.next {
		tb.Fatalf("%d TX chains returned, %d frames sent", tx.used, tx.next)
	}
	if tx.next == 0 || tx.next == len(tx.heads) {
		tb.Fatalf("%d of %d TX frames sent before the quiesce; the test wants some in flight", tx.next, len(tx.heads))
	}
}

// drained checks the Quiescer contract on the device's side of queue q:
// nothing popped and not returned, the used index in guest memory the
// device's.
func drained(tb testing.TB, e *env, name string, q *virtio.ActiveQueue, want uint16) {
	tb.Helper()
	used, err := e.mem.Load16Acquire(q.Config().Used + 2)
	if err != nil {
		tb.Fatal(err)
	}
	if q.LastAvail() != want || q.NextUsed() != want || used != want {
		tb.Errorf("%s: next available %d, next used %d, used index %d; want all %d",
			name, q.LastAvail(), q.NextUsed(), used, want)
	}
}

// TestQuiesceDrains: with frames in flight both ways, Quiesce returns with
// the workers gone, every TX chain taken either sent once and returned or
// put back, the RX chains held for a frame put back (not returned empty),
// and each queue's positions final. A resumed session then delivers the
// frame the device held, the frames the back-end queued, and the rest of
// the TX frames, in order; after a Reset instead, a fresh activation
// starts clean.
func TestQuiesceDrains(t *testing.T) {
	for _, tc := range []struct {
		name     string
		eventIdx bool
		reset    bool
	}{
		{"resume", false, false},
		{"resume event_idx", true, false},
		{"reset", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := runtime.NumGoroutine()
			e := newEnv(t, envOpts{features: Offered, eventIdx: tc.eventIdx, tapSndBuf: 16 << 10})
			rx, tx := newRXGuest(e), &txGuest{e: e}
			inFlight(t, e, rx, tx)

			e.dev.Quiesce()
			checkGoroutines(t, base)
			sentOnce(t, e, tx)
			drained(t, e, "TX", e.txq, uint16(tx.next))
			drained(t, e, "RX", e.rxq, 2)
			if u := e.rx.Reap(); len(u) != 0 {
				t.Fatalf("RX chains returned by the quiesce: %+v", u)
			}
			e.dev.Quiesce() // nothing runs: nothing happens

			rx.post(8, 1024)
			e.hostWrite(append(hdrBytes(Header{}), frame(100, 4)...))
			if tc.reset {
				e.reset()
				e.activate(256)
				rx, tx = newRXGuest(e), &txGuest{e: e}
				rx.post(4, 2048)
				e.hostWrite(append(hdrBytes(Header{}), frame(100, 9)...))
				// Frames 2 to 4 were the reset driver's.
				rx.expect(frame(100, 9))
				tx.send(3)
				tx.receive()
				return
			}
			e.resume()
			for i, n := range []int{3000, 100, 100} {
				rx.expect(frame(n, 2+i))
			}
			tx.receive()
			e.hostWrite(append(hdrBytes(Header{}), frame(100, 5)...))
			rx.expect(frame(100, 5))
			tx.send(3)
			tx.receive()
			if s := e.dev.Stats(); s.RxFrames != 6 || s.RxDropped != 0 || s.TxFrames != 123 || s.TxDropped != 0 || s.TxErrors != 0 {
				t.Errorf("stats %+v", s)
			}
		})
	}
}

// TestQuiesceHeldChain: without merged buffers, a chain kept after a frame
// too large for it was dropped is put back, and the resumed session uses
// it for the next frame.
func TestQuiesceHeldChain(t *testing.T) {
	e := newEnv(t, envOpts{})
	rx := newRXGuest(e)
	rx.post(1, 200)
	e.hostWrite(append(hdrBytes(Header{}), frame(1000, 0)...))
	waitUntil(t, "the frame to be dropped", func() bool { return e.dev.Stats().RxDropped == 1 })
	e.dev.Quiesce()
	drained(t, e, "RX", e.rxq, 0)
	e.resume()
	e.hostWrite(append(hdrBytes(Header{}), frame(100, 1)...))
	rx.expect(frame(100, 1))
}

// TestQuiesceFailed: a session that failed on a ring error touches no
// ring when quiesced (the transport marks the device for a reset); the
// reset and a fresh activation work, without a frame from before.
func TestQuiesceFailed(t *testing.T) {
	e := newEnv(t, envOpts{features: Offered})
	e.tx.SetAvailIdx(1000)
	_ = e.txKick.Signal()
	waitUntil(t, "the device to fail", func() bool { return len(e.failures()) > 0 })
	e.dev.Quiesce()
	drained(t, e, "TX", e.txq, 0)
	e.hostWrite(append(hdrBytes(Header{}), frame(100, 0)...))
	e.reset()
	e.activate(256)
	rx := newRXGuest(e)
	rx.post(1, 2048)
	e.hostWrite(append(hdrBytes(Header{}), frame(100, 1)...))
	rx.expect(frame(100, 1))
}

// TestQuiesceMMIO drives the device through a virtio-mmio transport: with
// frames in flight both ways, MMIO.Quiesce succeeds (the transport checks
// the contract), SaveState saves final positions, and either Resume or a
// restore into a new device and transport over the same guest memory
// carries on. Across a resume no frame is lost, duplicated or reordered
// either way; across a restore the frames the old back-end held go with
// it, the TX frames the old device had not sent come out of the new one,
// and the RX chains it put back are used.
func TestQuiesceMMIO(t *testing.T) {
	for _, tc := range []struct {
		name     string
		eventIdx bool
		restore  bool
	}{
		{"resume", false, false},
		{"resume event_idx", true, false},
		{"restore", true, true},
		{"restore no event_idx", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := runtime.NumGoroutine()
			o := envOpts{features: Offered, eventIdx: tc.eventIdx, tapSndBuf: 16 << 10, mmio: true}
			e := newEnv(t, o)
			rx, tx := newRXGuest(e), &txGuest{e: e}
			inFlight(t, e, rx, tx)

			if err := e.m.Quiesce(); err != nil {
				t.Fatal(err)
			}
			checkGoroutines(t, base)
			sentOnce(t, e, tx)
			s, err := e.m.SaveState()
			if err != nil {
				t.Fatal(err)
			}
			for i, want := range []uint16{QueueRX: 2, QueueTX: uint16(tx.next)} {
				if q := s.Queues[i]; q.NextAvail != want || q.UsedIdx != want {
					t.Errorf("queue %d saved at %d/%d; want %d", i, q.NextAvail, q.UsedIdx, want)
				}
			}
			var st State
			if err := json.Unmarshal(s.Device, &st); err != nil || st.MAC != e.dev.MAC().String() {
				t.Errorf("device state %s (%v); want MAC %v", s.Device, err, e.dev.MAC())
			}
			// The driver posts buffers and the host sends while the
			// device is stopped.
			rx.post(8, 1024)
			e.hostWrite(append(hdrBytes(Header{}), frame(100, 4)...))

			next := 2 // the next RX frame
			if tc.restore {
				b, err := json.Marshal(s)
				if err != nil {
					t.Fatal(err)
				}
				var saved virtio.MMIOState
				if err := json.Unmarshal(b, &saved); err != nil {
					t.Fatal(err)
				}
				mac := e.dev.MAC()
				if err := e.m.Close(); err != nil { // the old process goes away
					t.Fatal(err)
				}
				r := newDeviceEnv(t, o)
				r.mem, r.rx, r.tx, r.backlog = e.mem, e.rx, e.tx, e.backlog
				r.attachMMIO()
				if err := r.m.RestoreState(saved); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(r.dev.MAC(), mac) {
					t.Errorf("restored MAC %v; want %v", r.dev.MAC(), mac)
				}
				e, rx.e, tx.e = r, r, r
				next = 5
				e.hostWrite(append(hdrBytes(Header{}), frame(100, next)...))
			} else if err := e.m.Resume(); err != nil {
				t.Fatal(err)
			}
			for ; next <= 5; next++ {
				if next == 5 && !tc.restore {
					e.hostWrite(append(hdrBytes(Header{}), frame(100, next)...))
				}
				n := 100
				if next == 2 {
					n = 3000
				}
				rx.expect(frame(n, next))
			}
			tx.receive()
			tx.send(3)
			tx.receive()
			e.hostWrite(append(hdrBytes(Header{}), frame(100, 6)...))
			rx.expect(frame(100, 6))
			if st := e.reg(virtio.RegStatus); st != 15 {
				t.Errorf("status %s after the traffic", virtio.StatusString(st))
			}
			if s := e.dev.Stats(); s.RxDropped != 0 || s.TxDropped != 0 || s.TxErrors != 0 {
				t.Errorf("stats %+v", s)
			}
		})
	}
}

// TestDeviceState: the MAC is saved; a device made without one takes the
// saved one, a device configured with another refuses it (unless told it
// is a clone's new address: Config.NewMAC, which keeps its own), and a
// state that is not the device's is refused without a change.
func TestDeviceState(t *testing.T) {
	e := newEnv(t, envOpts{})
	saved, err := e.dev.SaveDeviceState()
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf(`{"MAC":%q}`, e.dev.MAC()); string(saved) != want {
		t.Errorf("saved %s; want %s", saved, want)
	}
	fresh := func(mac string, newMAC ...bool) *Device {
		t.Helper()
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		unix.Close(fds[1])
		cfg := Config{Log: quietLog(), NewMAC: len(newMAC) > 0 && newMAC[0]}
		if mac != "" {
			if cfg.MAC, err = ParseMAC(mac); err != nil {
				t.Fatal(err)
			}
		}
		d, err := NewSocket(cfg, fds[0])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}

	d := fresh("")
	if err := d.RestoreDeviceState(saved); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(d.MAC(), e.dev.MAC()) {
		t.Errorf("restored MAC %v; want %v", d.MAC(), e.dev.MAC())
	}
	cfg := make([]byte, 6)
	d.ReadConfig(0, cfg)
	if !bytes.Equal(cfg, e.dev.MAC()) {
		t.Errorf("config space MAC % x; want %v", cfg, e.dev.MAC())
	}
	for _, st := range []string{"", "null"} {
		before := d.MAC()
		if err := d.RestoreDeviceState(json.RawMessage(st)); err != nil || !bytes.Equal(d.MAC(), before) {
			t.Errorf("restore of %q: %v, MAC %v; want no change", st, err, d.MAC())
		}
	}

	same := fresh(e.dev.MAC().String())
	if err := same.RestoreDeviceState(saved); err != nil {
		t.Errorf("restore into a device configured with the saved MAC: %v", err)
	}
	clone := fresh("02:00:00:00:00:02", true)
	if err := clone.RestoreDeviceState(saved); err != nil || clone.MAC().String() != "02:00:00:00:00:02" {
		t.Errorf("restore into a clone's device with a new MAC: %v, MAC %v; want its own kept", err, clone.MAC())
	}
	if err := clone.RestoreDeviceState(json.RawMessage(`{"MAC":"01:00:5e:00:00:01"}`)); !errors.Is(err, virtio.ErrBadState) {
		t.Errorf("a clone's device took a multicast saved MAC: %v", err)
	}
	other := fresh("02:00:00:00:00:01")
	for _, st := range []string{
		string(saved), // another MAC than the configured one
		`{"MAC":"01:00:5e:00:00:01"}`,
		`{"MAC":"02:00:00:00:00"}`,
		`{"MAC":"02:00:00:00:00:01","Link":1}`,
		`[]`,
		`{`,
	} {
		if err := other.RestoreDeviceState(json.RawMessage(st)); !errors.Is(err, virtio.ErrBadState) {
			t.Errorf("restore of %s: %v; want ErrBadState", st, err)
		}
		if got := other.MAC().String(); got != "02:00:00:00:00:01" {
			t.Errorf("refused restore of %s changed the MAC to %s", st, got)
		}
	}
}
