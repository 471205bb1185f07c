package virtionet

import (
	"encoding/binary"
	"fmt"
)

// HeaderSize is the size of struct virtio_net_hdr under VIRTIO_F_VERSION_1
// (virtio 1.2, 5.1.6): num_buffers is always present, merged RX buffers or
// not. The TAP is told the same size (TUNSETVNETHDRSZ), so a frame read from
// it starts with a header the guest can take as it is.
const HeaderSize = 12

// Header flags and GSO types (virtio 1.2, 5.1.6).
const (
	FlagNeedsCsum = 1 // VIRTIO_NET_HDR_F_NEEDS_CSUM
	FlagDataValid = 2 // VIRTIO_NET_HDR_F_DATA_VALID (device to driver only)

	GSONone  = 0    // VIRTIO_NET_HDR_GSO_NONE
	GSOTCPv4 = 1    // VIRTIO_NET_HDR_GSO_TCPV4
	GSOUDP   = 3    // VIRTIO_NET_HDR_GSO_UDP
	GSOTCPv6 = 4    // VIRTIO_NET_HDR_GSO_TCPV6
	GSOECN   = 0x80 // VIRTIO_NET_HDR_GSO_ECN
)

// Frame bounds. MaxFrame is the largest frame after the header either way:
// a 64 KiB GSO packet plus its Ethernet and VLAN headers, as Firecracker and
// QEMU bound it. MinFrame is an Ethernet header.
const (
	MaxFrame = 65550
	MinFrame = 14
)

// Header is struct virtio_net_hdr, copied out of guest memory once.
type Header struct {
	Flags      uint8
	GSOType    uint8
	HdrLen     uint16
	GSOSize    uint16
	CsumStart  uint16
	CsumOffset uint16
	NumBuffers uint16
}

// Decode reads h from the first HeaderSize bytes of b.
func (h *Header) Decode(b []byte) {
	_ = b[HeaderSize-1]
	h.Flags = b[0]
	h.GSOType = b[1]
	h.HdrLen = binary.LittleEndian.Uint16(b[2:])
	h.GSOSize = binary.LittleEndian.Uint16(b[4:])
	h.CsumStart = binary.LittleEndian.Uint16(b[6:])
	h.CsumOffset = binary.LittleEndian.Uint16(b[8:])
	h.NumBuffers = binary.LittleEndian.Uint16(b[10:])
}

// Encode writes h into the first HeaderSize bytes of b.
func (h *Header) Encode(b []byte) {
	_ = b[HeaderSize-1]
	b[0] = h.Flags
	b[1] = h.GSOType
	binary.LittleEndian.PutUint16(b[2:], h.HdrLen)
	binary.LittleEndian.PutUint16(b[4:], h.GSOSize)
	binary.LittleEndian.PutUint16(b[6:], h.CsumStart)
	binary.LittleEndian.PutUint16(b[8:], h.CsumOffset)
	binary.LittleEndian.PutUint16(b[10:], h.NumBuffers)
}

// CheckTX validates a header the driver wrote for a frame of frameLen bytes
// (after the header) against the negotiated features, as 5.1.6.2 asks of
// the driver: checksum offload only with VIRTIO_NET_F_CSUM and inside the
// frame; a GSO type only when its HOST_ feature was negotiated, with a
// segment size and a checksum request. The kernel checks the header again
// when the frame is written to the TAP; this check is what lets the device
// count a bad header as the guest's error instead of a host write error.
func (h *Header) CheckTX(features uint64, frameLen int) error {
	if frameLen < MinFrame || frameLen > MaxFrame {
		return fmt.Errorf("frame of %d bytes: want %d..%d", frameLen, MinFrame, MaxFrame)
	}
	if h.Flags&^FlagNeedsCsum != 0 {
		return fmt.Errorf("flags %#x: only NEEDS_CSUM is valid from the driver", h.Flags)
	}
	if h.Flags&FlagNeedsCsum != 0 {
		if features&FeatureCsum == 0 {
			return fmt.Errorf("NEEDS_CSUM without VIRTIO_NET_F_CSUM")
		}
		if int(h.CsumStart)+int(h.CsumOffset)+2 > frameLen {
			return fmt.Errorf("checksum at %d+%d outside the %d-byte frame", h.CsumStart, h.CsumOffset, frameLen)
		}
	}
	if int(h.HdrLen) > frameLen {
		return fmt.Errorf("hdr_len %d beyond the %d-byte frame", h.HdrLen, frameLen)
	}
	gso := h.GSOType &^ GSOECN
	var need uint64
	switch gso {
	case GSONone:
		if h.GSOType&GSOECN != 0 {
			return fmt.Errorf("ECN bit without a GSO type")
		}
		return nil
	case GSOTCPv4:
		need = FeatureHostTSO4
	case GSOTCPv6:
		need = FeatureHostTSO6
	case GSOUDP:
		need = FeatureHostUFO
	default:
		return fmt.Errorf("unknown GSO type %#x", h.GSOType)
	}
	switch {
	case features&need == 0:
		return fmt.Errorf("GSO type %#x without its feature", h.GSOType)
	case h.GSOType&GSOECN != 0 && features&FeatureHostECN == 0:
		return fmt.Errorf("GSO ECN without VIRTIO_NET_F_HOST_ECN")
	case h.GSOSize == 0:
		return fmt.Errorf("GSO type %#x with a zero segment size", h.GSOType)
	case h.Flags&FlagNeedsCsum == 0:
		return fmt.Errorf("GSO type %#x without NEEDS_CSUM", h.GSOType)
	}
	return nil
}
