package vsock

import (
	"encoding/binary"
	"fmt"
)

// HeaderSize is the size of struct virtio_vsock_hdr (virtio 1.2, 5.10.6).
const HeaderSize = 44

// Packet types.
const (
	TypeStream    = 1
	TypeSeqpacket = 2 // only with FeatureSeqpacket negotiated
	// TypeDgram (3) is in dgram.go.
)

// FeatureSeqpacket is VIRTIO_VSOCK_F_SEQPACKET (virtio 1.2, 5.10.3): the
// device accepts and sends packets of TypeSeqpacket.
const FeatureSeqpacket = 1 << 1

// Flags of SEQPACKET RW packets (5.10.6.3.2).
const (
	// SeqEOM marks the last packet of a message (VIRTIO_VSOCK_SEQ_EOM).
	SeqEOM = 1 << 0
	// SeqEOR marks the message as the end of a record: the sender passed
	// MSG_EOR (VIRTIO_VSOCK_SEQ_EOR). Only meaningful together with SeqEOM.
	SeqEOR = 1 << 1
)

// Op is a packet operation.
type Op uint16

// Operations (5.10.6).
const (
	OpInvalid       Op = 0
	OpRequest       Op = 1
	OpResponse      Op = 2
	OpRst           Op = 3
	OpShutdown      Op = 4
	OpRW            Op = 5
	OpCreditUpdate  Op = 6
	OpCreditRequest Op = 7
)

// String is the operation's name in the spec (VIRTIO_VSOCK_OP_ without the
// prefix).
func (o Op) String() string {
	switch o {
	case OpRequest:
		return "REQUEST"
	case OpResponse:
		return "RESPONSE"
	case OpRst:
		return "RST"
	case OpShutdown:
		return "SHUTDOWN"
	case OpRW:
		return "RW"
	case OpCreditUpdate:
		return "CREDIT_UPDATE"
	case OpCreditRequest:
		return "CREDIT_REQUEST"
	}
	return fmt.Sprintf("OP(%d)", uint16(o))
}

// SHUTDOWN flags: the sender will receive (RCV) or send (SEND) no more.
const (
	ShutdownRcv  = 1
	ShutdownSend = 2
	ShutdownBoth = ShutdownRcv | ShutdownSend
)

// Well-known CIDs.
const (
	CIDHypervisor = 0
	CIDLocal      = 1
	CIDHost       = 2
)

// MaxPacketPayload is the largest payload a packet may carry
// (VIRTIO_VSOCK_MAX_PKT_BUF_SIZE in Linux).
const MaxPacketPayload = 64 << 10

// Header is a decoded struct virtio_vsock_hdr. Devices decode it once from a
// copy of guest memory and never read it from the ring again.
type Header struct {
	SrcCID   uint64
	DstCID   uint64
	SrcPort  uint32
	DstPort  uint32
	Len      uint32
	Type     uint16
	Op       Op
	Flags    uint32
	BufAlloc uint32
	FwdCnt   uint32
}

// Decode parses b (at least HeaderSize bytes), little endian.
func (h *Header) Decode(b []byte) {
	_ = b[HeaderSize-1]
	h.SrcCID = binary.LittleEndian.Uint64(b[0:])
	h.DstCID = binary.LittleEndian.Uint64(b[8:])
	h.SrcPort = binary.LittleEndian.Uint32(b[16:])
	h.DstPort = binary.LittleEndian.Uint32(b[20:])
	h.Len = binary.LittleEndian.Uint32(b[24:])
	h.Type = binary.LittleEndian.Uint16(b[28:])
	h.Op = Op(binary.LittleEndian.Uint16(b[30:]))
	h.Flags = binary.LittleEndian.Uint32(b[32:])
	h.BufAlloc = binary.LittleEndian.Uint32(b[36:])
	h.FwdCnt = binary.LittleEndian.Uint32(b[40:])
}

// Encode writes h into b (at least HeaderSize bytes).
func (h *Header) Encode(b []byte) {
	_ = b[HeaderSize-1]
	binary.LittleEndian.PutUint64(b[0:], h.SrcCID)
	binary.LittleEndian.PutUint64(b[8:], h.DstCID)
	binary.LittleEndian.PutUint32(b[16:], h.SrcPort)
	binary.LittleEndian.PutUint32(b[20:], h.DstPort)
	binary.LittleEndian.PutUint32(b[24:], h.Len)
	binary.LittleEndian.PutUint16(b[28:], h.Type)
	binary.LittleEndian.PutUint16(b[30:], uint16(h.Op))
	binary.LittleEndian.PutUint32(b[32:], h.Flags)
	binary.LittleEndian.PutUint32(b[36:], h.BufAlloc)
	binary.LittleEndian.PutUint32(b[40:], h.FwdCnt)
}

// String renders the header on one line, for logs.
func (h *Header) String() string {
	return fmt.Sprintf("%s %d:%d->%d:%d len=%d type=%d flags=%#x buf_alloc=%d fwd_cnt=%d",
		h.Op, h.SrcCID, h.SrcPort, h.DstCID, h.DstPort, h.Len, h.Type, h.Flags, h.BufAlloc, h.FwdCnt)
}
