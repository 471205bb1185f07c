package vhostuser

import (
	"encoding/binary"
	"fmt"
)

// Request is a vhost-user front-end request type (QEMU
// docs/interop/vhost-user.rst, "Front-end message types").
type Request uint32

// Requests.
const (
	GetFeatures         Request = 1
	SetFeatures         Request = 2
	SetOwner            Request = 3
	ResetOwner          Request = 4
	SetMemTable         Request = 5
	SetLogBase          Request = 6
	SetLogFD            Request = 7
	SetVringNum         Request = 8
	SetVringAddr        Request = 9
	SetVringBase        Request = 10
	GetVringBase        Request = 11
	SetVringKick        Request = 12
	SetVringCall        Request = 13
	SetVringErr         Request = 14
	GetProtocolFeatures Request = 15
	SetProtocolFeatures Request = 16
	GetQueueNum         Request = 17
	SetVringEnable      Request = 18
	SendRARP            Request = 19
	NetSetMTU           Request = 20
	SetBackendReqFD     Request = 21
	IOTLBMsg            Request = 22
	SetVringEndian      Request = 23
	GetConfig           Request = 24
	SetConfig           Request = 25
	ResetDevice         Request = 34
	GetMaxMemSlots      Request = 36
	SetStatus           Request = 39
	GetStatus           Request = 40
)

var requestNames = map[Request]string{
	GetFeatures: "GET_FEATURES", SetFeatures: "SET_FEATURES", SetOwner: "SET_OWNER",
	ResetOwner: "RESET_OWNER", SetMemTable: "SET_MEM_TABLE", SetLogBase: "SET_LOG_BASE",
	SetLogFD: "SET_LOG_FD", SetVringNum: "SET_VRING_NUM", SetVringAddr: "SET_VRING_ADDR",
	SetVringBase: "SET_VRING_BASE", GetVringBase: "GET_VRING_BASE", SetVringKick: "SET_VRING_KICK",
	SetVringCall: "SET_VRING_CALL", SetVringErr: "SET_VRING_ERR",
	GetProtocolFeatures: "GET_PROTOCOL_FEATURES", SetProtocolFeatures: "SET_PROTOCOL_FEATURES",
	GetQueueNum: "GET_QUEUE_NUM", SetVringEnable: "SET_VRING_ENABLE", SendRARP: "SEND_RARP",
	NetSetMTU: "NET_SET_MTU", SetBackendReqFD: "SET_BACKEND_REQ_FD", IOTLBMsg: "IOTLB_MSG",
	SetVringEndian: "SET_VRING_ENDIAN", GetConfig: "GET_CONFIG", SetConfig: "SET_CONFIG",
	ResetDevice: "RESET_DEVICE", GetMaxMemSlots: "GET_MAX_MEM_SLOTS", SetStatus: "SET_STATUS",
	GetStatus: "GET_STATUS",
}

// String is the request's name in the specification (GET_FEATURES, ...).
func (r Request) String() string {
	if n, ok := requestNames[r]; ok {
		return n
	}
	return fmt.Sprintf("REQUEST(%d)", uint32(r))
}

// Header flags and sizes.
const (
	headerSize    = 12
	flagVersion   = 0x1
	flagReply     = 1 << 2
	flagNeedReply = 1 << 3
	versionMask   = 0x3

	// maxPayload bounds a message body: the largest we accept is
	// SET_MEM_TABLE with maxRegions regions (8 + 32*8 bytes) or GET_CONFIG
	// with a 256-byte config space.
	maxPayload = 512
	maxFDs     = 8

	// maxRegions is VHOST_MEMORY_BASELINE_NREGIONS.
	maxRegions = 8
)

// FeatureProtocolFeatures is VHOST_USER_F_PROTOCOL_FEATURES, a virtio
// feature bit vhost-user borrows to announce protocol features.
const FeatureProtocolFeatures = 1 << 30

// Protocol feature bits (VHOST_USER_PROTOCOL_F_*).
const (
	ProtocolMQ          = 1 << 0
	ProtocolReplyAck    = 1 << 3
	ProtocolConfig      = 1 << 9
	ProtocolResetDevice = 1 << 13
)

// vring file (SET_VRING_KICK/CALL/ERR) payload: bits 0-7 the ring index,
// bit 8 set when no descriptor is attached.
const (
	vringIndexMask = 0xff
	vringNoFD      = 1 << 8
)

// header is the vhost-user message header.
type header struct {
	Request Request
	Flags   uint32
	Size    uint32
}

func (h *header) decode(b []byte) {
	h.Request = Request(binary.LittleEndian.Uint32(b[0:]))
	h.Flags = binary.LittleEndian.Uint32(b[4:])
	h.Size = binary.LittleEndian.Uint32(b[8:])
}

func (h *header) encode(b []byte) {
	binary.LittleEndian.PutUint32(b[0:], uint32(h.Request))
	binary.LittleEndian.PutUint32(b[4:], h.Flags)
	binary.LittleEndian.PutUint32(b[8:], h.Size)
}

// vringState is struct vhost_vring_state: a ring index and a number.
type vringState struct {
	Index uint32
	Num   uint32
}

func decodeState(p []byte) (vringState, error) {
	if len(p) != 8 {
		return vringState{}, fmt.Errorf("vring state of %d bytes, want 8", len(p))
	}
	return vringState{binary.LittleEndian.Uint32(p[0:]), binary.LittleEndian.Uint32(p[4:])}, nil
}

func (s vringState) encode() []byte {
	b := make([]byte, 8)
	binary.LittleEndian.PutUint32(b[0:], s.Index)
	binary.LittleEndian.PutUint32(b[4:], s.Num)
	return b
}

// vringAddr is struct vhost_vring_addr: front-end virtual addresses of the
// ring parts (note the order: descriptors, used, available).
type vringAddr struct {
	Index uint32
	Flags uint32
	Desc  uint64
	Used  uint64
	Avail uint64
	Log   uint64
}

func decodeAddr(p []byte) (vringAddr, error) {
	if len(p) != 40 {
		return vringAddr{}, fmt.Errorf("vring address of %d bytes, want 40", len(p))
	}
	return vringAddr{
		Index: binary.LittleEndian.Uint32(p[0:]),
		Flags: binary.LittleEndian.Uint32(p[4:]),
		Desc:  binary.LittleEndian.Uint64(p[8:]),
		Used:  binary.LittleEndian.Uint64(p[16:]),
		Avail: binary.LittleEndian.Uint64(p[24:]),
		Log:   binary.LittleEndian.Uint64(p[32:]),
	}, nil
}

// memRegion is struct vhost_user_memory_region.
type memRegion struct {
	GPA      uint64
	Size     uint64
	UserAddr uint64
	Offset   uint64
}

func decodeMemTable(p []byte) ([]memRegion, error) {
	if len(p) < 8 {
		return nil, fmt.Errorf("memory table of %d bytes", len(p))
	}
	n := binary.LittleEndian.Uint32(p[0:])
	if n == 0 || n > maxRegions {
		return nil, fmt.Errorf("memory table with %d regions (1..%d)", n, maxRegions)
	}
	if uint64(len(p)) != 8+32*uint64(n) {
		return nil, fmt.Errorf("memory table of %d bytes for %d regions", len(p), n)
	}
	out := make([]memRegion, n)
	for i := range out {
		b := p[8+32*i:]
		out[i] = memRegion{
			GPA:      binary.LittleEndian.Uint64(b[0:]),
			Size:     binary.LittleEndian.Uint64(b[8:]),
			UserAddr: binary.LittleEndian.Uint64(b[16:]),
			Offset:   binary.LittleEndian.Uint64(b[24:]),
		}
	}
	return out, nil
}

func decodeU64(p []byte) (uint64, error) {
	if len(p) != 8 {
		return 0, fmt.Errorf("payload of %d bytes, want a u64", len(p))
	}
	return binary.LittleEndian.Uint64(p), nil
}

func encodeU64(v uint64) []byte {
	b := make([]byte, 8)
	binary.LittleEndian.PutUint64(b, v)
	return b
}

// configMsg is struct vhost_user_config: offset, size, flags, then size
// bytes of the device configuration space.
type configMsg struct {
	Offset, Size, Flags uint32
	Data                []byte
}

func decodeConfig(p []byte) (configMsg, error) {
	if len(p) < 12 {
		return configMsg{}, fmt.Errorf("config message of %d bytes", len(p))
	}
	c := configMsg{
		Offset: binary.LittleEndian.Uint32(p[0:]),
		Size:   binary.LittleEndian.Uint32(p[4:]),
		Flags:  binary.LittleEndian.Uint32(p[8:]),
	}
	if uint64(len(p)-12) != uint64(c.Size) || c.Size > 256 {
		return configMsg{}, fmt.Errorf("config message of %d bytes says size %d", len(p), c.Size)
	}
	c.Data = p[12:]
	return c, nil
}

func (c configMsg) encode() []byte {
	b := make([]byte, 12+len(c.Data))
	binary.LittleEndian.PutUint32(b[0:], c.Offset)
	binary.LittleEndian.PutUint32(b[4:], uint32(len(c.Data)))
	binary.LittleEndian.PutUint32(b[8:], c.Flags)
	copy(b[12:], c.Data)
	return b
}
