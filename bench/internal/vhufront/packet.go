package vhufront

import (
	"encoding/binary"
	"fmt"
)

// The vsock packet header (virtio 1.2, 5.10.6), encoded here independently
// of package vsock.
const (
	// HdrSize is the size of struct virtio_vsock_hdr.
	HdrSize = 44
	// MaxPayload is the most payload the generator puts in one packet (as
	// Linux, VIRTIO_VSOCK_MAX_PKT_BUF_SIZE).
	MaxPayload = 64 << 10

	// HostCID is the host's context id.
	HostCID = 2

	typeStream = 1
)

// Packet operations.
const (
	OpRequest       = 1
	OpResponse      = 2
	OpRst           = 3
	OpShutdown      = 4
	OpRW            = 5
	OpCreditUpdate  = 6
	OpCreditRequest = 7
)

// SHUTDOWN flags.
const (
	ShutRcv  = 1
	ShutSend = 2
	ShutBoth = ShutRcv | ShutSend
)

var opNames = [...]string{"OP(0)", "REQUEST", "RESPONSE", "RST", "SHUTDOWN", "RW", "CREDIT_UPDATE", "CREDIT_REQUEST"}

func opName(op uint16) string {
	if int(op) < len(opNames) {
		return opNames[op]
	}
	return fmt.Sprintf("OP(%d)", op)
}

// Hdr is a decoded packet header.
type Hdr struct {
	SrcCID, DstCID   uint64
	SrcPort, DstPort uint32
	Len              uint32
	Type, Op         uint16
	Flags            uint32
	BufAlloc, FwdCnt uint32
}

func (h *Hdr) encode(b []byte) {
	_ = b[HdrSize-1]
	binary.LittleEndian.PutUint64(b[0:], h.SrcCID)
	binary.LittleEndian.PutUint64(b[8:], h.DstCID)
	binary.LittleEndian.PutUint32(b[16:], h.SrcPort)
	binary.LittleEndian.PutUint32(b[20:], h.DstPort)
	binary.LittleEndian.PutUint32(b[24:], h.Len)
	binary.LittleEndian.PutUint16(b[28:], h.Type)
	binary.LittleEndian.PutUint16(b[30:], h.Op)
	binary.LittleEndian.PutUint32(b[32:], h.Flags)
	binary.LittleEndian.PutUint32(b[36:], h.BufAlloc)
	binary.LittleEndian.PutUint32(b[40:], h.FwdCnt)
}

func (h *Hdr) decode(b []byte) {
	_ = b[HdrSize-1]
	h.SrcCID = binary.LittleEndian.Uint64(b[0:])
	h.DstCID = binary.LittleEndian.Uint64(b[8:])
	h.SrcPort = binary.LittleEndian.Uint32(b[16:])
	h.DstPort = binary.LittleEndian.Uint32(b[20:])
	h.Len = binary.LittleEndian.Uint32(b[24:])
	h.Type = binary.LittleEndian.Uint16(b[28:])
	h.Op = binary.LittleEndian.Uint16(b[30:])
	h.Flags = binary.LittleEndian.Uint32(b[32:])
	h.BufAlloc = binary.LittleEndian.Uint32(b[36:])
	h.FwdCnt = binary.LittleEndian.Uint32(b[40:])
}

func (h Hdr) String() string {
	return fmt.Sprintf("%s %d:%d->%d:%d len %d flags %#x buf_alloc %d fwd_cnt %d",
		opName(h.Op), h.SrcCID, h.SrcPort, h.DstCID, h.DstPort, h.Len, h.Flags, h.BufAlloc, h.FwdCnt)
}
