package virtionet

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
)

// frame returns an Ethernet frame of n bytes whose payload encodes seq.
func frame(n int, seq int) []byte {
	f := make([]byte, n)
	copy(f, []byte{0x52, 0x54, 0, 0x12, 0x34, 0x56, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00})
	for i := 14; i < n; i++ {
		f[i] = byte(i*7 + seq)
	}
	if n >= 18 {
		binary.BigEndian.PutUint32(f[14:], uint32(seq))
	}
	return f
}

func hdrBytes(h Header) []byte {
	b := make([]byte, HeaderSize)
	h.Encode(b)
	return b
}

func TestConfigSpace(t *testing.T) {
	e := newEnv(t, envOpts{})
	p := make([]byte, 12)
	e.dev.ReadConfig(0, p)
	if !bytes.Equal(p[:6], e.dev.MAC()) {
		t.Errorf("config MAC % x, device MAC %v", p[:6], e.dev.MAC())
	}
	if e.dev.MAC()[0]&3 != 2 {
		t.Errorf("random MAC %v is not unicast and locally administered", e.dev.MAC())
	}
	if got := binary.LittleEndian.Uint16(p[6:]); got != statusLinkUp {
		t.Errorf("status %#x, want link up", got)
	}
	if p[10] != 0 || p[11] != 0 {
		t.Errorf("bytes past the config space read % x, want zero", p[10:])
	}
	e.dev.WriteConfig(0, []byte{1, 2, 3})
	e.dev.ReadConfig(0, p[:6])
	if !bytes.Equal(p[:6], e.dev.MAC()) {
		t.Error("a config write changed the MAC")
	}
	if got := e.tap.lastOffload(); got != 0 {
		t.Errorf("offload %#x without guest offload features, want 0", got)
	}
}

func TestMACConfig(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{"02:00:00:00:00:01", true},
		{"52:54:00:12:34:56", true},
		{"01:00:5e:00:00:01", false}, // multicast
		{"02:00:00:00:00", false},
		{"zz:00:00:00:00:01", false},
		{"02:00:00:00:00:00:00:01", false},
	} {
		m, err := ParseMAC(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("ParseMAC(%q) = %v, %v; want ok=%v", tc.in, m, err, tc.ok)
		}
	}
}

func TestOffloadFollowsNegotiation(t *testing.T) {
	for _, tc := range []struct {
		features uint64
		want     uint
	}{
		{0, 0},
		{FeatureGuestTSO4, 0}, // TSO without GUEST_CSUM is nothing
		{FeatureGuestCsum, tunFCsum},
		{FeatureGuestCsum | FeatureGuestTSO4 | FeatureGuestTSO6, tunFCsum | tunFTSO4 | tunFTSO6},
		{FeatureGuestCsum | FeatureGuestUFO, tunFCsum | tunFUFO},
		{Offered, tunFCsum | tunFTSO4 | tunFTSO6 | tunFUFO},
	} {
		t.Run(fmt.Sprintf("%#x", tc.features), func(t *testing.T) {
			e := newEnv(t, envOpts{features: tc.features})
			if got := e.tap.lastOffload(); got != tc.want {
				t.Errorf("TUNSETOFFLOAD %#x, want %#x", got, tc.want)
			}
		})
	}
}

func TestTXFrame(t *testing.T) {
	for _, ev := range []bool{false, true} {
		t.Run(fmt.Sprintf("event_idx=%v", ev), func(t *testing.T) {
			e := newEnv(t, envOpts{features: Offered, eventIdx: ev})
			h := Header{Flags: FlagNeedsCsum, CsumStart: 34, CsumOffset: 16, NumBuffers: 7}
			for i := 0; i < 100; i++ {
				f := frame(60+i*13, i)
				head := e.sendTX(hdrBytes(h), f)
				got := e.hostRead()
				want := hdrBytes(Header{Flags: FlagNeedsCsum, CsumStart: 34, CsumOffset: 16}) // num_buffers zeroed
				want = append(want, f...)
				if !bytes.Equal(got, want) {
					t.Fatalf("frame %d: host got %d bytes % x..., want %d bytes % x...", i, len(got), got[:20], len(want), want[:20])
				}
				u := e.reap(e.tx, 1)
				if u[0].ID != head || u[0].Len != 0 {
					t.Fatalf("used %+v, want id %d len 0", u[0], head)
				}
			}
			if s := e.dev.Stats(); s.TxFrames != 100 || s.TxErrors != 0 || s.TxDropped != 0 {
				t.Errorf("stats %+v", s)
			}
		})
	}
}

func TestTXGSO(t *testing.T) {
	e := newEnv(t, envOpts{features: Offered})
	h := Header{Flags: FlagNeedsCsum, GSOType: GSOTCPv4, HdrLen: 54, GSOSize: 1448, CsumStart: 34, CsumOffset: 16}
	f := frame(MaxFrame, 1)
	e.sendTX(hdrBytes(h), f)
	got := e.hostRead()
	if !bytes.Equal(got, append(hdrBytes(h), f...)) {
		t.Fatalf("GSO frame of %d bytes came out as %d bytes", len(f), len(got))
	}
	e.reap(e.tx, 1)
}

func TestTXBadFrames(t *testing.T) {
	good := Header{}
	for _, tc := range []struct {
		name     string
		features uint64
		hdr      []byte
		frame    []byte
	}{
		{"no header", Offered, nil, nil},
		{"short header", Offered, make([]byte, 11), nil},
		{"runt frame", Offered, hdrBytes(good), make([]byte, 13)},
		{"oversized frame", Offered, hdrBytes(good), make([]byte, MaxFrame+1)},
		{"unknown flag", Offered, hdrBytes(Header{Flags: 4}), frame(60, 0)},
		{"data valid from driver", Offered, hdrBytes(Header{Flags: FlagDataValid}), frame(60, 0)},
		{"csum without feature", 0, hdrBytes(Header{Flags: FlagNeedsCsum, CsumStart: 14, CsumOffset: 6}), frame(60, 0)},
		{"csum outside frame", Offered, hdrBytes(Header{Flags: FlagNeedsCsum, CsumStart: 50, CsumOffset: 9}), frame(60, 0)},
		{"csum at the end", Offered, hdrBytes(Header{Flags: FlagNeedsCsum, CsumStart: 58, CsumOffset: 1}), frame(60, 0)},
		{"tso without feature", FeatureCsum, hdrBytes(Header{Flags: FlagNeedsCsum, GSOType: GSOTCPv4, GSOSize: 1000, CsumStart: 34, CsumOffset: 16}), frame(2000, 0)},
		{"gso size zero", Offered, hdrBytes(Header{Flags: FlagNeedsCsum, GSOType: GSOTCPv6, CsumStart: 54, CsumOffset: 16}), frame(2000, 0)},
		{"gso without csum", Offered, hdrBytes(Header{GSOType: GSOUDP, GSOSize: 1000}), frame(2000, 0)},
		{"unknown gso", Offered, hdrBytes(Header{Flags: FlagNeedsCsum, GSOType: 5, GSOSize: 1000, CsumStart: 34, CsumOffset: 6}), frame(2000, 0)},
		{"ecn not offered", Offered, hdrBytes(Header{Flags: FlagNeedsCsum, GSOType: GSOTCPv4 | GSOECN, GSOSize: 1000, CsumStart: 34, CsumOffset: 16}), frame(2000, 0)},
		{"ecn alone", Offered, hdrBytes(Header{GSOType: GSOECN}), frame(60, 0)},
		{"hdr_len past frame", Offered, hdrBytes(Header{HdrLen: 61}), frame(60, 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOpts{features: tc.features})
			if tc.hdr == nil && tc.frame == nil {
				// An empty readable buffer: a chain of one zero-length descriptor.
				a := e.mem.Alloc(8, 8)
				e.tx.Add(virtiotestBuf(a, 0))
				_ = e.txKick.Signal()
			} else {
				e.sendTX(tc.hdr, tc.frame)
			}
			if u := e.reap(e.tx, 1); u[0].Len != 0 {
				t.Errorf("used len %d, want 0", u[0].Len)
			}
			// The next good frame still goes through.
			f := frame(60, 9)
			e.sendTX(hdrBytes(good), f)
			if got := e.hostRead(); !bytes.Equal(got[HeaderSize:], f) {
				t.Errorf("the good frame after the bad one came out as % x", got)
			}
			e.reap(e.tx, 1)
			if s := e.dev.Stats(); s.TxErrors != 1 || s.TxFrames != 1 {
				t.Errorf("stats %+v, want 1 TX error and 1 frame", s)
			}
			if f := e.failures(); len(f) != 0 {
				t.Errorf("a bad frame failed the device: %v", f)
			}
		})
	}
}

func TestRXFrame(t *testing.T) {
	e := newEnv(t, envOpts{}) // no merged buffers: one chain per frame
	bufs := e.postRX(32, HeaderSize+1514)
	for i := 0; i < 100; i++ {
		f := frame(60+i*14, i)
		h := hdrBytes(Header{Flags: FlagDataValid, NumBuffers: 0xffff})
		e.hostWrite(append(h, f...))
		u := e.reap(e.rx, 1)[0]
		if int(u.Len) != HeaderSize+len(f) {
			t.Fatalf("frame %d: used len %d, want %d", i, u.Len, HeaderSize+len(f))
		}
		got := e.read(bufs[u.ID], u.Len)
		var gh Header
		gh.Decode(got)
		if gh.NumBuffers != 1 || gh.Flags != 0 {
			t.Errorf("frame %d: header %+v, want num_buffers 1 and flags 0 (no GUEST_CSUM)", i, gh)
		}
		if !bytes.Equal(got[HeaderSize:], f) {
			t.Fatalf("frame %d: payload differs", i)
		}
		// Repost the chain's buffers.
		e.rx.Add(virtiotestBuf(bufs[u.ID].addr[0], bufs[u.ID].size[0], true))
		_ = e.rxKick.Signal()
	}
	if s := e.dev.Stats(); s.RxFrames != 100 || s.RxDropped != 0 || s.RxErrors != 0 {
		t.Errorf("stats %+v", s)
	}
}

func TestRXMergeable(t *testing.T) {
	e := newEnv(t, envOpts{features: Offered, eventIdx: true})
	bufs := e.postRX(200, 1500)
	f := frame(60000, 3)
	h := Header{Flags: FlagNeedsCsum, GSOType: GSOTCPv4, HdrLen: 66, GSOSize: 1448, CsumStart: 34, CsumOffset: 16}
	e.hostWrite(append(hdrBytes(h), f...))
	total := HeaderSize + len(f)
	n := (total + 1499) / 1500
	u := e.reap(e.rx, n)
	var got []byte
	for _, x := range u {
		got = append(got, e.read(bufs[x.ID], x.Len)...)
	}
	var gh Header
	gh.Decode(got)
	if int(gh.NumBuffers) != n {
		t.Errorf("num_buffers %d, want %d", gh.NumBuffers, n)
	}
	h.NumBuffers = uint16(n)
	if gh != h {
		t.Errorf("header %+v, want %+v", gh, h)
	}
	if !bytes.Equal(got[HeaderSize:], f) {
		t.Error("merged payload differs")
	}
}

// TestRXWaitsForBuffers: with no RX buffers the device leaves frames in
// the TAP; TX keeps working meanwhile; posted buffers then receive the
// frames in order.
func TestRXWaitsForBuffers(t *testing.T) {
	for _, ev := range []bool{false, true} {
		t.Run(fmt.Sprintf("event_idx=%v", ev), func(t *testing.T) {
			e := newEnv(t, envOpts{features: Offered, eventIdx: ev})
			for i := 0; i < 5; i++ {
				e.hostWrite(append(hdrBytes(Header{}), frame(100, i)...))
			}
			deadline := time.Now().Add(waitTimeout)
			for e.dev.Stats().RxStalls == 0 {
				if time.Now().After(deadline) {
					t.Fatal("the RX worker never stalled")
				}
				time.Sleep(time.Millisecond)
			}
			// TX is not blocked by RX.
			f := frame(80, 42)
			e.sendTX(hdrBytes(Header{}), f)
			if got := e.hostRead(); !bytes.Equal(got[HeaderSize:], f) {
				t.Fatal("TX frame differs")
			}
			e.reap(e.tx, 1)
			bufs := e.postRX(8, 2048)
			u := e.reap(e.rx, 5)
			for i, x := range u {
				got := e.read(bufs[x.ID], x.Len)
				if seq := binary.BigEndian.Uint32(got[HeaderSize+14:]); seq != uint32(i) {
					t.Errorf("frame %d carries seq %d", i, seq)
				}
			}
			if s := e.dev.Stats(); s.RxFrames != 5 || s.RxDropped != 0 {
				t.Errorf("stats %+v", s)
			}
		})
	}
}

// TestTXWaitsForTAP: a full TAP (EAGAIN) holds TX frames back without
// dropping them, and does not block RX.
func TestTXWaitsForTAP(t *testing.T) {
	e := newEnv(t, envOpts{features: Offered, tapSndBuf: 16 << 10})
	const n = 120 // far more than the host end queues (2 descriptors each)
	var want [][]byte
	for i := 0; i < n; i++ {
		f := frame(1000, i)
		want = append(want, f)
		e.sendTX(hdrBytes(Header{}), f)
	}
	deadline := time.Now().Add(waitTimeout)
	for e.dev.Stats().TxStalls == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("TX never found the TAP full: %+v", e.dev.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	// RX still works while TX waits.
	bufs := e.postRX(4, 2048)
	f := frame(300, 77)
	e.hostWrite(append(hdrBytes(Header{}), f...))
	u := e.reap(e.rx, 1)[0]
	if got := e.read(bufs[u.ID], u.Len); !bytes.Equal(got[HeaderSize:], f) {
		t.Fatal("RX frame differs while TX is stalled")
	}
	for i := 0; i < n; i++ {
		got := e.hostRead()
		if !bytes.Equal(got[HeaderSize:], want[i]) {
			t.Fatalf("TX frame %d differs or is out of order", i)
		}
	}
	e.reap(e.tx, n)
	if s := e.dev.Stats(); s.TxFrames != n || s.TxDropped != 0 {
		t.Errorf("stats %+v, want %d frames and none dropped", s, n)
	}
}

func TestRXFrameTooLargeForBuffer(t *testing.T) {
	e := newEnv(t, envOpts{}) // no MRG_RXBUF: a frame must fit one chain
	bufs := e.postRX(1, 200)
	e.hostWrite(append(hdrBytes(Header{}), frame(1000, 1)...))
	small := frame(100, 2)
	e.hostWrite(append(hdrBytes(Header{}), small...))
	u := e.reap(e.rx, 1)[0]
	if got := e.read(bufs[u.ID], u.Len); !bytes.Equal(got[HeaderSize:], small) {
		t.Error("the chain kept after a dropped frame did not get the next one")
	}
	if s := e.dev.Stats(); s.RxDropped != 1 || s.RxFrames != 1 {
		t.Errorf("stats %+v, want 1 dropped and 1 delivered", s)
	}
}

func TestRXRunt(t *testing.T) {
	e := newEnv(t, envOpts{})
	bufs := e.postRX(2, 2048)
	e.hostWrite(make([]byte, HeaderSize+5))
	f := frame(64, 1)
	e.hostWrite(append(hdrBytes(Header{}), f...))
	u := e.reap(e.rx, 1)[0]
	if got := e.read(bufs[u.ID], u.Len); !bytes.Equal(got[HeaderSize:], f) {
		t.Error("frame after a runt differs")
	}
	if s := e.dev.Stats(); s.RxErrors != 1 {
		t.Errorf("stats %+v, want 1 RX error", s)
	}
}

// Ring errors stop the device and report through Activation.Fail; no
// panic, and the device can be reset and activated again.
func TestRingErrorsFail(t *testing.T) {
	for _, tc := range []struct {
		name string
		do   func(e *env)
	}{
		{"tx avail index far ahead", func(e *env) { e.tx.SetAvailIdx(1000); _ = e.txKick.Signal() }},
		{"rx avail index far ahead", func(e *env) {
			e.rx.SetAvailIdx(1000)
			_ = e.rxKick.Signal()
			e.hostWrite(append(hdrBytes(Header{}), frame(60, 0)...))
		}},
		{"tx head out of range", func(e *env) {
			e.tx.PublishHead(4000)
			_ = e.txKick.Signal()
		}},
		{"rx chain without room for a header", func(e *env) {
			a := e.mem.Alloc(8, 8)
			e.rx.Add(virtiotestBuf(a, 8, true))
			_ = e.rxKick.Signal()
			e.hostWrite(append(hdrBytes(Header{}), frame(60, 0)...))
		}},
		{"rx buffer outside memory", func(e *env) {
			e.rx.Add(virtiotestBuf(1<<40, 2048, true))
			_ = e.rxKick.Signal()
			e.hostWrite(append(hdrBytes(Header{}), frame(60, 0)...))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOpts{features: Offered})
			tc.do(e)
			deadline := time.Now().Add(waitTimeout)
			for len(e.failures()) == 0 {
				if time.Now().After(deadline) {
					t.Fatal("the device did not fail")
				}
				time.Sleep(time.Millisecond)
			}
			if f := e.failures(); !errors.Is(f[0], virtio.ErrGuest) {
				t.Errorf("failure %v does not wrap ErrGuest", f[0])
			}
			// Reset and a fresh activation work.
			e.reset()
			e.activate(256)
			bufs := e.postRX(1, 2048)
			// Drain the frame the failing case left, if any.
			f := frame(60, 5)
			e.hostWrite(append(hdrBytes(Header{}), f...))
			u := e.reap(e.rx, 1)[0]
			if got := e.read(bufs[u.ID], u.Len); !bytes.Equal(got[HeaderSize:], f) {
				t.Error("after reset: RX frame differs")
			}
		})
	}
}

func TestCloseRefusesActivation(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.reset()
	if err := e.dev.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.dev.Activate(virtio.Activation{Queues: []*virtio.ActiveQueue{{}, {}}}); err == nil {
		t.Error("Activate after Close succeeded")
	}
}

func virtiotestBuf(addr uint64, n uint32, writable ...bool) virtiotest.Buf {
	return virtiotest.Buf{Addr: addr, Len: n, Writable: len(writable) > 0 && writable[0]}
}

// TestPlainFrames: on a socket of plain frames (NewSocket) the device
// offers no offload, strips the header the driver wrote from each frame
// it sends, and gives each frame it receives a header of its own (no
// flags, no GSO, num_buffers).
func TestPlainFrames(t *testing.T) {
	e := newEnv(t, envOpts{plain: true, features: OfferedPlain, eventIdx: true})
	if got := e.dev.Features(); got != OfferedPlain {
		t.Fatalf("features %#x on a socket, want %#x", got, uint64(OfferedPlain))
	}
	for i := 0; i < 50; i++ {
		f := frame(60+i*29, i)
		head := e.sendTX(hdrBytes(Header{NumBuffers: 3}), f)
		if got := e.hostRead(); !bytes.Equal(got, f) {
			t.Fatalf("TX frame %d: the socket got %d bytes % x..., want the %d-byte frame alone", i, len(got), got[:min(len(got), 16)], len(f))
		}
		if u := e.reap(e.tx, 1)[0]; u.ID != head {
			t.Fatalf("TX used %+v, want id %d", u, head)
		}
	}
	// An offload request the device never offered is refused, not sent.
	e.sendTX(hdrBytes(Header{Flags: FlagNeedsCsum, CsumStart: 34, CsumOffset: 16}), frame(100, 0))
	e.reap(e.tx, 1)

	bufs := e.postRX(8, 1600)
	for i := 0; i < 20; i++ {
		f := frame(60+i*70, i)
		e.hostWrite(f)
		u := e.reap(e.rx, 1)[0]
		if int(u.Len) != HeaderSize+len(f) {
			t.Fatalf("RX frame %d: used len %d, want %d", i, u.Len, HeaderSize+len(f))
		}
		got := e.read(bufs[u.ID], u.Len)
		var gh Header
		gh.Decode(got)
		if gh != (Header{NumBuffers: 1}) {
			t.Errorf("RX frame %d: header %+v, want only num_buffers 1", i, gh)
		}
		if !bytes.Equal(got[HeaderSize:], f) {
			t.Fatalf("RX frame %d: payload differs", i)
		}
		e.rx.Add(virtiotestBuf(bufs[u.ID].addr[0], bufs[u.ID].size[0], true))
		_ = e.rxKick.Signal()
	}
	e.hostWrite(make([]byte, MinFrame-1)) // a runt
	s := e.dev.Stats()
	if s.TxFrames != 50 || s.TxErrors != 1 || s.RxFrames != 20 {
		t.Errorf("stats %+v, want 50 frames sent, 1 refused, 20 received", s)
	}
	var txBytes, rxBytes uint64
	for i := 0; i < 50; i++ {
		txBytes += uint64(60 + i*29)
	}
	for i := 0; i < 20; i++ {
		rxBytes += uint64(60 + i*70)
	}
	if s.TxBytes != txBytes || s.RxBytes != rxBytes {
		t.Errorf("bytes %d sent, %d received; want the frames' own, %d and %d", s.TxBytes, s.RxBytes, txBytes, rxBytes)
	}
}

// TestNewSocketRefusesStream: a stream socket has no frame boundaries.
func TestNewSocketRefusesStream(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[1])
	if _, err := NewSocket(Config{Log: quietLog()}, fds[0]); err == nil {
		t.Fatal("NewSocket accepted a SOCK_STREAM socket")
	}
	if _, err := unix.FcntlInt(uintptr(fds[0]), unix.F_GETFD, 0); err != unix.EBADF {
		t.Errorf("NewSocket left the refused descriptor open (F_GETFD: %v)", err)
	}
}
