package vsock_test

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/microvm/microvm/vsock"
)

// The header is struct virtio_vsock_hdr (virtio 1.2, 5.10.6): 44 bytes,
// little endian, packed.
func TestHeaderLayout(t *testing.T) {
	if vsock.HeaderSize != 44 {
		t.Fatalf("HeaderSize = %d; want 44", vsock.HeaderSize)
	}
	h := vsock.Header{
		SrcCID: 0x0102030405060708, DstCID: 0x1112131415161718,
		SrcPort: 0x21222324, DstPort: 0x31323334, Len: 0x41424344,
		Type: 0x5152, Op: 0x6162, Flags: 0x71727374,
		BufAlloc: 0x81828384, FwdCnt: 0x91929394,
	}
	want := []byte{
		0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, // src_cid
		0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11, // dst_cid
		0x24, 0x23, 0x22, 0x21, // src_port
		0x34, 0x33, 0x32, 0x31, // dst_port
		0x44, 0x43, 0x42, 0x41, // len
		0x52, 0x51, // type
		0x62, 0x61, // op
		0x74, 0x73, 0x72, 0x71, // flags
		0x84, 0x83, 0x82, 0x81, // buf_alloc
		0x94, 0x93, 0x92, 0x91, // fwd_cnt
	}
	got := make([]byte, vsock.HeaderSize)
	h.Encode(got)
	if !bytes.Equal(got, want) {
		t.Fatalf("Encode:\n got %x\nwant %x", got, want)
	}
	var back vsock.Header
	back.Decode(want)
	if diff := cmp.Diff(h, back); diff != "" {
		t.Fatalf("Decode (-want +got):\n%s", diff)
	}
}

func TestHeaderRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, vsock.HeaderSize+8)
	for i := 0; i < 1000; i++ {
		for j := range buf {
			buf[j] = byte(r.Uint32())
		}
		var h vsock.Header
		h.Decode(buf)
		out := make([]byte, vsock.HeaderSize+8)
		copy(out[vsock.HeaderSize:], buf[vsock.HeaderSize:])
		h.Encode(out)
		if !bytes.Equal(out, buf) {
			t.Fatalf("decode+encode changed the bytes:\n got %x\nwant %x", out, buf)
		}
		var h2 vsock.Header
		h2.Decode(out)
		if h2 != h {
			t.Fatalf("encode+decode: %v != %v", &h2, &h)
		}
	}
	// Only the first 44 bytes are touched.
	var h vsock.Header
	out := bytes.Repeat([]byte{0xee}, vsock.HeaderSize+4)
	h.Encode(out)
	if binary.LittleEndian.Uint32(out[vsock.HeaderSize:]) != 0xeeeeeeee {
		t.Fatal("Encode wrote past the header")
	}
}

func TestHeaderShortBuffer(t *testing.T) {
	for _, f := range []func(b []byte){
		func(b []byte) { new(vsock.Header).Decode(b) },
		func(b []byte) { new(vsock.Header).Encode(b) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Error("43-byte buffer accepted")
				}
			}()
			f(make([]byte, vsock.HeaderSize-1))
		}()
	}
}

func TestOpString(t *testing.T) {
	for op, want := range map[vsock.Op]string{
		vsock.OpRequest: "REQUEST", vsock.OpResponse: "RESPONSE", vsock.OpRst: "RST",
		vsock.OpShutdown: "SHUTDOWN", vsock.OpRW: "RW", vsock.OpCreditUpdate: "CREDIT_UPDATE",
		vsock.OpCreditRequest: "CREDIT_REQUEST", vsock.OpInvalid: "OP(0)", 99: "OP(99)",
	} {
		if got := op.String(); got != want {
			t.Errorf("Op(%d).String() = %q; want %q", uint16(op), got, want)
		}
	}
}
