package vsock_test

import (
	"bytes"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/vsocktest"
)

// FuzzConnectLine feeds arbitrary byte streams, cut into arbitrary chunks,
// to the CONNECT parser: it never panics, never accepts a line longer than
// MaxConnectLine, accepts exactly the well-formed lines, agrees with itself
// however the stream is cut, and hands back exactly the bytes after the
// newline.
func FuzzConnectLine(f *testing.F) {
	f.Fuzz(func(t *testing.T, stream, cuts []byte) {
		var chunks [][]byte
		rest := stream
		for _, c := range cuts {
			n := min(int(c)%(vsock.MaxConnectLine+2), len(rest))
			chunks = append(chunks, rest[:n])
			rest = rest[n:]
		}
		chunks = append(chunks, rest)
		port, after, done, err := feed(chunks)
		wport, wafter, wdone, werr := feed([][]byte{stream})
		if done != wdone || (err == nil) != (werr == nil) || port != wport || !bytes.Equal(after, wafter) {
			t.Fatalf("cut %q: port %d rest %q done %v err %v; whole: port %d rest %q done %v err %v",
				chunks, port, after, done, err, wport, wafter, wdone, werr)
		}
		nl := bytes.IndexByte(stream, '\n')
		switch {
		case err != nil:
			if !errors.Is(err, vsock.ErrConnectLine) {
				t.Fatalf("error %v does not wrap ErrConnectLine", err)
			}
			if nl >= 0 && nl < vsock.MaxConnectLine {
				if _, ok := wellFormed(stream[:nl]); ok {
					t.Fatalf("rejected the well-formed line %q: %v", stream[:nl], err)
				}
			} else if nl < 0 && len(stream) < vsock.MaxConnectLine {
				t.Fatalf("rejected %q before its newline (%d bytes)", stream, len(stream))
			}
		case done:
			if nl < 0 || nl+1 > vsock.MaxConnectLine {
				t.Fatalf("accepted a line of %d bytes (max %d)", nl+1, vsock.MaxConnectLine)
			}
			want, ok := wellFormed(stream[:nl])
			if !ok || want != port {
				t.Fatalf("accepted %q as port %d", stream[:nl], port)
			}
			if !bytes.Equal(after, stream[nl+1:]) {
				t.Fatalf("rest %q; want %q", after, stream[nl+1:])
			}
		default:
			if nl >= 0 || len(stream) >= vsock.MaxConnectLine {
				t.Fatalf("%q (%d bytes): neither done nor failed", stream, len(stream))
			}
		}
	})
}

// wellFormed is the reference grammar: two blank-separated words (any run of
// Go's Unicode white space, as strings.Fields and Firecracker's
// split_whitespace split them), "CONNECT" in any case and a decimal 32-bit
// port.
func wellFormed(line []byte) (uint32, bool) {
	words := strings.Fields(string(line))
	if len(words) != 2 || !strings.EqualFold(words[0], "CONNECT") {
		return 0, false
	}
	for _, c := range words[1] {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	v, err := strconv.ParseUint(words[1], 10, 32)
	return uint32(v), err == nil
}

// FuzzPacketHeader sends arbitrary TX packets through an activated device
// (SEQPACKET negotiated) with four live connections: a stream and a
// SEQPACKET one opened from each side. Each packet takes one control byte
// and a 44-byte header from the input:
//
//	bits 0-1  descriptors the packet is split across (1-3), or 3: the
//	          chain is cut short to (next input byte % 44) bytes
//	bit 2     write our CIDs over the header's
//	bit 3     write the ports of a live connection over the header's: a
//	          SEQPACKET one if the header's type is SEQPACKET, else a
//	          stream one
//	bit 4     which live connection
//	bit 5     set len to the payload's length
//	bits 6-7  payload size: 0, 1..255 (next input byte), 4096, 65536+1
//
// The device never panics, never calls Fail (the chains are well formed),
// returns every chain, keeps its promises to the guest (vsocktest checks
// what it sends) and leaves no goroutine behind after a reset.
func FuzzPacketHeader(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		base := runtime.NumGoroutine()
		e := newEnv(t, envOpts{noLeakCheck: true, guest: vsocktest.Options{RxSplit: 2, Seqpacket: true}})
		e.allowGuestErrs = true
		a, ha := e.connectGuest(5000, 1025)
		b, hb := e.connectHost(6000, nil)
		c, hc := e.connectSeq(5001, 1026)
		hd, err := vsocktest.HostConnectSeqpacket(t, e.dev, 6001, time.Now().Add(waitTimeout))
		if err != nil {
			t.Fatal(err)
		}
		d := e.g.Accept(6001)
		for _, h := range []interface{ Read([]byte) (int, error) }{ha, hb, hc, hd} {
			go func() {
				var buf [64 << 10]byte
				for {
					if _, err := h.Read(buf[:]); err != nil {
						return
					}
				}
			}()
		}
		// The fuzzed packets may change credit and state behind the
		// guest connections' backs: their packets go to the pending list.
		for _, c := range []*vsocktest.Conn{a, b, c, d} {
			c.Forget()
		}
		live := [][]*vsocktest.Conn{{a, b}, {c, d}}
		for n := 0; len(in) > 0 && n < 16; n++ {
			ctl := in[0]
			in = in[1:]
			var hdr [vsock.HeaderSize]byte
			in = in[copy(hdr[:], in):]
			var h vsock.Header
			h.Decode(hdr[:])
			if ctl&4 != 0 {
				h.SrcCID, h.DstCID = vsocktest.DefaultCID, vsock.CIDHost
			}
			if ctl&8 != 0 {
				c := live[0][ctl>>4&1]
				if h.Type == vsock.TypeSeqpacket {
					c = live[1][ctl>>4&1]
				}
				h.SrcPort, h.DstPort = c.GuestPort, c.HostPort
			}
			var size int
			switch ctl >> 6 {
			case 1:
				if len(in) > 0 {
					size = int(in[0])
					in = in[1:]
				}
			case 2:
				size = 4096
			case 3:
				size = vsock.MaxPacketPayload + 1
			}
			if ctl&32 != 0 {
				h.Len = uint32(size)
			}
			pkt := make([]byte, vsock.HeaderSize+size)
			h.Encode(pkt)
			copy(pkt[vsock.HeaderSize:], vsocktest.Pattern(uint64(n), size))
			var at []uint32
			switch ctl & 3 {
			case 1:
				at = []uint32{uint32(min(20, len(pkt)))}
			case 2:
				at = []uint32{uint32(min(7, len(pkt))), uint32(min(vsock.HeaderSize+1, len(pkt)))}
			case 3:
				cut := 0
				if len(in) > 0 {
					cut = int(in[0]) % vsock.HeaderSize
					in = in[1:]
				}
				pkt, at = pkt[:cut], []uint32{1}
			}
			e.g.SendBytes(pkt, at)
		}
		e.g.Sync()
		e.g.Poll()
		if f := e.g.Fails(); len(f) > 0 {
			if !errors.Is(f[0], virtio.ErrGuest) {
				t.Fatalf("Fail(%v): not a guest error", f[0])
			}
			t.Fatalf("Fail(%v) on well-formed chains", f[0])
		}
		e.g.Reset()
		e.dev.Close()
		ha.Close()
		hb.Close()
		hc.Close()
		hd.Close()
		checkGoroutines(t, base)
	})
}
