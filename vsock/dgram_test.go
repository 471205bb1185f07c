package vsock_test

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/vsocktest"
)

// dgramEnv is an env whose device offers datagrams and whose guest
// negotiates them, with the host sockets under a fresh directory.
func dgramEnv(tb testing.TB, g vsocktest.Options) (*env, string) {
	tb.Helper()
	uds := filepath.Join(tb.TempDir(), "v")
	g.Dgram = true
	return newEnv(tb, envOpts{cfg: vsock.Config{Dgram: true, DgramUDS: uds}, guest: g}), uds
}

// hostDgramListener binds the host service for host port port.
func hostDgramListener(tb testing.TB, uds string, port uint32) *net.UnixConn {
	tb.Helper()
	path := vsock.DgramHostPath(uds, port)
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// hostDgramSender is an unbound datagram socket connected to the device.
func hostDgramSender(tb testing.TB, dev *vsock.Device) *net.UnixConn {
	tb.Helper()
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: dev.DgramPath(), Net: "unixgram"})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

func withPrefix(guestPort, hostPort uint32, payload []byte) []byte {
	b := make([]byte, vsock.DgramPrefixSize, vsock.DgramPrefixSize+len(payload))
	vsock.EncodeDgramPrefix(b, guestPort, hostPort)
	return append(b, payload...)
}

func readDgram(tb testing.TB, c *net.UnixConn) ([]byte, net.Addr) {
	tb.Helper()
	buf := make([]byte, vsock.DgramPrefixSize+vsock.MaxDgramPayload+1)
	_ = c.SetReadDeadline(time.Now().Add(waitTimeout))
	n, from, err := c.ReadFrom(buf)
	if err != nil {
		tb.Fatalf("host datagram read: %v", err)
	}
	return buf[:n], from
}

func TestDgramFeatureAndQueues(t *testing.T) {
	off, err := vsock.New(vsock.Config{CID: 3, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer off.Close()
	if off.Features()&vsock.FeatureDgram != 0 || len(off.QueueSizes()) != 3 || off.DgramPath() != "" {
		t.Errorf("default device: features %#x, %d queues, datagram socket %q; want no DGRAM bit, 3, none",
			off.Features(), len(off.QueueSizes()), off.DgramPath())
	}
	if q := off.BackendQueues(vsock.FeatureDgram); len(q) != 2 {
		t.Errorf("default device hands a vhost-user back-end queues %v; want rx, tx", q)
	}
	uds := filepath.Join(t.TempDir(), "v")
	on, err := vsock.New(vsock.Config{CID: 3, Log: quietLog(), Dgram: true, DgramUDS: uds})
	if err != nil {
		t.Fatal(err)
	}
	if on.Features() != vsock.FeatureDgram|vsock.FeatureSeqpacket || len(on.QueueSizes()) != 5 || on.DgramPath() != uds+".dgram" {
		t.Errorf("datagram device: features %#x, %d queues, socket %q; want %#x, 5, %s.dgram",
			on.Features(), len(on.QueueSizes()), on.DgramPath(), vsock.FeatureDgram|vsock.FeatureSeqpacket, uds)
	}
	if q := on.BackendQueues(vsock.FeatureDgram); fmt.Sprint(q) != "[0 1 3 4]" {
		t.Errorf("BackendQueues(DGRAM) = %v; want [0 1 3 4]", q)
	}
	if q := on.BackendQueues(0); fmt.Sprint(q) != "[0 1]" {
		t.Errorf("BackendQueues(0) = %v; want [0 1]", q)
	}
	if fi, err := os.Stat(on.DgramPath()); err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("datagram socket: %v, %v; want a 0600 socket", fi, err)
	}
	on.Close()
	if _, err := os.Stat(uds + ".dgram"); !os.IsNotExist(err) {
		t.Errorf("Close left the datagram socket behind: %v", err)
	}
	// Paths that cannot fit sun_path with "_<port>.dgram" are refused up
	// front; so is Dgram without a path.
	long := filepath.Join(t.TempDir(), string(bytes.Repeat([]byte("x"), 90)))
	if _, err := vsock.New(vsock.Config{CID: 3, Dgram: true, DgramUDS: long}); err == nil {
		t.Error("New accepted a datagram path prefix too long for sun_path")
	}
	if _, err := vsock.New(vsock.Config{CID: 3, Dgram: true}); err == nil {
		t.Error("New accepted Dgram without DgramUDS")
	}
}

// A driver that negotiates DGRAM must hand over both datagram queues.
func TestDgramActivateWithoutQueues(t *testing.T) {
	uds := filepath.Join(t.TempDir(), "v")
	dev, err := vsock.New(vsock.Config{CID: 3, Log: quietLog(), Dgram: true, DgramUDS: uds})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	g := vsocktest.New(t, dev, vsocktest.Options{})
	a := g.Activation
	g.Reset()
	a.Features |= vsock.FeatureDgram
	if err := dev.Activate(a); err == nil {
		t.Fatal("Activate with DGRAM and no datagram queues succeeded")
	}
}

func TestDgramGuestToHost(t *testing.T) {
	e, uds := dgramEnv(t, vsocktest.Options{})
	host := hostDgramListener(t, uds, 7000)
	const n = 50
	for i := 0; i < n; i++ {
		size := []int{0, 1, 64, 4096, vsock.MaxDgramPayload}[i%5]
		e.g.SendDgram(1234, 7000, vsocktest.Pattern(uint64(i), size))
		got, from := readDgram(t, host)
		if len(got) < vsock.DgramPrefixSize {
			t.Fatalf("datagram %d: %d bytes, shorter than the prefix", i, len(got))
		}
		gp, hp := vsock.DecodeDgramPrefix(got)
		if gp != 1234 || hp != 7000 {
			t.Fatalf("datagram %d: prefix guest port %d host port %d; want 1234, 7000", i, gp, hp)
		}
		vsocktest.CheckEqual(t, fmt.Sprintf("datagram %d", i), got[vsock.DgramPrefixSize:], vsocktest.Pattern(uint64(i), size))
		if from == nil || from.String() != e.dev.DgramPath() {
			t.Fatalf("datagram %d came from %v; want the device's socket %s (where replies go)", i, from, e.dev.DgramPath())
		}
	}
	e.g.SyncDgram()
	if s := e.dev.Stats(); s.DgramTx != n || s.DgramTxDropped != 0 || s.TxPackets != 0 {
		t.Errorf("stats %+v: want %d datagrams sent, none dropped, no stream packets", s, n)
	}
}

func TestDgramHostToGuest(t *testing.T) {
	e, _ := dgramEnv(t, vsocktest.Options{})
	h := hostDgramSender(t, e.dev)
	sizes := []int{0, 1, 64, 4096}
	for i, size := range sizes {
		if _, err := h.Write(withPrefix(1234, 7000+uint32(i), vsocktest.Pattern(uint64(i), size))); err != nil {
			t.Fatal(err)
		}
	}
	got := e.g.WaitDgrams(len(sizes))
	if len(got) != len(sizes) {
		t.Fatalf("%d datagrams; want %d", len(got), len(sizes))
	}
	for i, p := range got {
		if p.Hdr.SrcPort != 7000+uint32(i) || p.Hdr.DstPort != 1234 {
			t.Errorf("datagram %d: %v; want ports 7000+%d -> 1234", i, &p.Hdr, i)
		}
		vsocktest.CheckEqual(t, fmt.Sprintf("datagram %d", i), p.Data, vsocktest.Pattern(uint64(i), sizes[i]))
	}
	if s := e.dev.Stats(); s.DgramRx != uint64(len(sizes)) || s.DgramRxDropped != 0 || s.RxPackets != 0 {
		t.Errorf("stats %+v: want %d datagrams delivered, none dropped, no stream packets", s, len(sizes))
	}
}

// A host echo service answers from the address a guest datagram came from
// with the same bytes: the reply reaches the sending guest port.
func TestDgramEcho(t *testing.T) {
	e, uds := dgramEnv(t, vsocktest.Options{})
	host := hostDgramListener(t, uds, 7000)
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 1<<16)
		for i := 0; i < 20; i++ {
			n, from, err := host.ReadFromUnix(buf)
			if err == nil {
				_, err = host.WriteToUnix(buf[:n], from)
			}
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	for i := 0; i < 20; i++ {
		want := vsocktest.Pattern(uint64(i), 100+i)
		e.g.SendDgram(2000+uint32(i), 7000, want)
		p := e.g.WaitDgrams(1)[0]
		if p.Hdr.SrcPort != 7000 || p.Hdr.DstPort != 2000+uint32(i) {
			t.Fatalf("echo %d: %v", i, &p.Hdr)
		}
		vsocktest.CheckEqual(t, "echo", p.Data, want)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A guest that posts no datagram RX buffers loses datagrams, counted; the
// device holds none of them, and stream traffic goes on meanwhile.
func TestDgramFullQueueCountsLoss(t *testing.T) {
	e, _ := dgramEnv(t, vsocktest.Options{DgramRxBuffers: 4})
	e.g.AutoRepost = false
	h := hostDgramSender(t, e.dev)
	const sent = 20
	for i := 0; i < sent; i++ {
		if _, err := h.Write(withPrefix(1234, 7000, []byte{byte(i)})); err != nil {
			t.Fatal(err)
		}
	}
	var got []vsocktest.Packet
	e.g.WaitFor("4 delivered and 16 counted as lost", func() bool {
		got = append(got, e.g.Dgrams()...)
		s := e.dev.Stats()
		// The counters move before the guest sees the used ring: wait
		// for both, or a delivered datagram is read as the late one.
		return s.DgramRx == 4 && s.DgramRxDropped == sent-4 && len(got) == 4
	})
	for i, p := range got {
		if len(p.Data) != 1 || p.Data[0] != byte(i) {
			t.Errorf("datagram %d carries %v; want the first four in order", i, p.Data)
		}
	}
	// Streams are not held up by the full datagram queue.
	c, hc := e.connectGuest(5000, 1025)
	e.transfer(c, hc, []byte("stream g2h"), []byte("stream h2g"))
	// Buffers posted later take the next datagrams.
	e.g.PostDgramRX(1, vsocktest.DgramRxBufLen)
	if _, err := h.Write(withPrefix(1234, 7000, []byte("late"))); err != nil {
		t.Fatal(err)
	}
	if p := e.g.WaitDgrams(1)[0]; string(p.Data) != "late" {
		t.Errorf("got %q; want late", p.Data)
	}
}

// Guest datagrams to a host port nobody serves are dropped and counted.
func TestDgramNoHostSocket(t *testing.T) {
	e, _ := dgramEnv(t, vsocktest.Options{})
	for i := 0; i < 3; i++ {
		e.g.SendDgram(1234, 7001, []byte("nobody"))
	}
	e.g.SyncDgram()
	if s := e.dev.Stats(); s.DgramTxDropped != 3 || s.DgramTx != 0 || s.GuestErrors != 0 {
		t.Errorf("stats %+v: want 3 dropped, none sent, no guest error", s)
	}
}

// Malformed guest datagrams are counted guest errors: nothing reaches the
// host, the device keeps working, and nothing panics.
func TestDgramMalformed(t *testing.T) {
	type tc struct {
		name    string
		mod     func(h *vsock.Header)
		payload int
		raw     []byte // sent as the whole chain instead of a header
	}
	tests := []tc{
		{name: "src-cid", mod: func(h *vsock.Header) { h.SrcCID = 4 }},
		{name: "dst-cid", mod: func(h *vsock.Header) { h.DstCID = 5 }},
		{name: "type-stream", mod: func(h *vsock.Header) { h.Type = vsock.TypeStream }},
		{name: "type-0", mod: func(h *vsock.Header) { h.Type = 0 }},
		{name: "op-request", mod: func(h *vsock.Header) { h.Op = vsock.OpRequest }},
		{name: "op-rst", mod: func(h *vsock.Header) { h.Op = vsock.OpRst }},
		{name: "src-port-any", mod: func(h *vsock.Header) { h.SrcPort = 0xffffffff }},
		{name: "dst-port-any", mod: func(h *vsock.Header) { h.DstPort = 0xffffffff }},
		{name: "len-past-chain", payload: 10, mod: func(h *vsock.Header) { h.Len = 11 }},
		{name: "len-huge", payload: 10, mod: func(h *vsock.Header) { h.Len = 0xffffffff }},
		{name: "len-over-max", payload: vsock.MaxDgramPayload + 1, mod: func(h *vsock.Header) {}},
		{name: "short-header", raw: make([]byte, 43)},
		{name: "empty-chain", raw: []byte{}},
	}
	for _, c := range tests {
		t.Run(c.name, func(t *testing.T) {
			e, uds := dgramEnv(t, vsocktest.Options{})
			e.allowGuestErrs = true
			host := hostDgramListener(t, uds, 7000)
			if c.raw != nil {
				e.g.SendDgramBytes(c.raw)
			} else {
				h := e.g.DgramHeader(1234, 7000, c.payload)
				c.mod(&h)
				e.g.SendDgramRaw(h, make([]byte, c.payload))
			}
			e.g.SyncDgram()
			if s := e.dev.Stats(); s.GuestErrors != 1 || s.DgramTx != 0 || s.DgramTxDropped != 0 {
				t.Errorf("stats %+v: want 1 guest error, nothing sent or dropped", s)
			}
			if f := e.g.Fails(); len(f) > 0 {
				t.Errorf("a malformed datagram failed the device: %v", f)
			}
			// The device still carries datagrams.
			e.g.SendDgram(1234, 7000, []byte("ok"))
			got, _ := readDgram(t, host)
			if string(got[vsock.DgramPrefixSize:]) != "ok" {
				t.Errorf("after the bad datagram the host got %q", got)
			}
		})
	}
}

// Malformed host datagrams (shorter than the address prefix, or larger than
// the guest's buffer) are counted and dropped; the guest's buffer is reused.
func TestDgramHostMalformed(t *testing.T) {
	e, _ := dgramEnv(t, vsocktest.Options{DgramRxBuffers: 1})
	h := hostDgramSender(t, e.dev)
	for _, b := range [][]byte{
		{}, {1, 2, 3, 4, 5, 6, 7},
		withPrefix(1234, 7000, make([]byte, vsocktest.DgramRxBufLen-vsock.HeaderSize+1)),
	} {
		if _, err := h.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	full := vsocktest.Pattern(9, vsocktest.DgramRxBufLen-vsock.HeaderSize)
	if _, err := h.Write(withPrefix(1234, 7000, full)); err != nil {
		t.Fatal(err)
	}
	p := e.g.WaitDgrams(1)[0]
	vsocktest.CheckEqual(t, "a datagram that fills the buffer exactly", p.Data, full)
	if s := e.dev.Stats(); s.DgramRxRejected != 3 || s.DgramRx != 1 || s.GuestErrors != 0 {
		t.Errorf("stats %+v: want 3 rejected, 1 delivered", s)
	}
}

// With the feature off (the default) DGRAM packets are refused on the
// stream queue as any unknown type is: a guest error and an RST. So they are
// when the feature is on but the packet comes on the stream queue.
func TestDgramOnStreamQueueRejected(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("dgram-%v", on), func(t *testing.T) {
			var e *env
			if on {
				e, _ = dgramEnv(t, vsocktest.Options{})
			} else {
				e = newEnv(t, envOpts{})
			}
			e.allowGuestErrs = true
			p := e.g.Header(vsock.OpRW, 1025, 5000)
			p.Type = vsock.TypeDgram
			p.Len = 2
			e.g.Send(p, []byte("hi"))
			e.g.ExpectOp(vsock.OpRst, 5000, 1025)
			if s := e.dev.Stats(); s.GuestErrors != 1 || s.DgramTx != 0 {
				t.Errorf("stats %+v: want 1 guest error, no datagram sent", s)
			}
		})
	}
}

// A datagram-capable device serves a driver that does not negotiate
// datagrams exactly as before: streams work, no datagram worker runs.
func TestDgramNotNegotiated(t *testing.T) {
	uds := filepath.Join(t.TempDir(), "v")
	e := newEnv(t, envOpts{cfg: vsock.Config{Dgram: true, DgramUDS: uds}})
	c, h := e.connectGuest(5000, 1025)
	e.transfer(c, h, []byte("g2h"), []byte("h2g"))
	if e.g.Activation.Features&vsock.FeatureDgram != 0 || len(e.g.Activation.Queues) != 3 {
		t.Errorf("activation %+v: want no DGRAM and three queues", e.g.Activation)
	}
}

// A reset stops the datagram worker (the leak check sees it) and a new
// activation carries datagrams again.
func TestDgramReset(t *testing.T) {
	e, uds := dgramEnv(t, vsocktest.Options{})
	host := hostDgramListener(t, uds, 7000)
	for round := 0; round < 3; round++ {
		e.g.SendDgram(1234, 7000, []byte{byte(round)})
		if got, _ := readDgram(t, host); got[vsock.DgramPrefixSize] != byte(round) {
			t.Fatalf("round %d: %v", round, got)
		}
		e.g.Reset()
		e.g.Activate()
	}
}
