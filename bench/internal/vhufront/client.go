package vhufront

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// vhost-user requests the front-end sends (QEMU docs/interop/vhost-user.rst,
// "Front-end message types"). Encoded here independently of package
// vhostuser, so that a bug in one is not mirrored by the other.
const (
	reqGetFeatures         = 1
	reqSetFeatures         = 2
	reqSetOwner            = 3
	reqSetMemTable         = 5
	reqSetVringNum         = 8
	reqSetVringAddr        = 9
	reqSetVringBase        = 10
	reqGetVringBase        = 11
	reqSetVringKick        = 12
	reqSetVringCall        = 13
	reqGetProtocolFeatures = 15
	reqSetProtocolFeatures = 16
	reqGetQueueNum         = 17
	reqSetVringEnable      = 18
	reqGetConfig           = 24
)

var reqNames = map[uint32]string{
	reqGetFeatures: "GET_FEATURES", reqSetFeatures: "SET_FEATURES", reqSetOwner: "SET_OWNER",
	reqSetMemTable: "SET_MEM_TABLE", reqSetVringNum: "SET_VRING_NUM", reqSetVringAddr: "SET_VRING_ADDR",
	reqSetVringBase: "SET_VRING_BASE", reqGetVringBase: "GET_VRING_BASE", reqSetVringKick: "SET_VRING_KICK",
	reqSetVringCall: "SET_VRING_CALL", reqGetProtocolFeatures: "GET_PROTOCOL_FEATURES",
	reqSetProtocolFeatures: "SET_PROTOCOL_FEATURES", reqGetQueueNum: "GET_QUEUE_NUM",
	reqSetVringEnable: "SET_VRING_ENABLE", reqGetConfig: "GET_CONFIG",
}

func reqName(r uint32) string {
	if n, ok := reqNames[r]; ok {
		return n
	}
	return fmt.Sprintf("request %d", r)
}

// Header flags, feature and protocol feature bits.
const (
	msgVersion   = 0x1
	msgReply     = 1 << 2
	msgNeedReply = 1 << 3
	msgHeader    = 12
	maxReply     = 4096

	// FeatureVersion1, FeatureEventIdx and FeatureProtocolFeatures are the
	// virtio and vhost-user feature bits the front-end may negotiate.
	FeatureVersion1         = 1 << 32
	FeatureEventIdx         = 1 << 29
	FeatureProtocolFeatures = 1 << 30

	protoMQ       = 1 << 0
	protoReplyAck = 1 << 3
	protoConfig   = 1 << 9
)

// ErrBackend wraps an error the back-end reported (a non-zero REPLY_ACK) or
// a reply that breaks the protocol.
var ErrBackend = errors.New("vhost-user back-end")

// Client is a vhost-user front-end connection. It is used by one goroutine.
type Client struct {
	c       *net.UnixConn
	timeout time.Duration
	// Features and Protocol are what Negotiate agreed on; Queues is what
	// the back-end says it has (GET_QUEUE_NUM, or 2 without MQ).
	Features, Protocol uint64
	Queues             int
}

// Dial connects to a back-end's socket. Every request and reply is bounded
// by timeout.
func Dial(path string, timeout time.Duration) (*Client, error) {
	d := net.Dialer{Timeout: timeout}
	nc, err := d.Dial("unix", path)
	if err != nil {
		return nil, fmt.Errorf("vhost-user: connect to %s: %w", path, err)
	}
	return &Client{c: nc.(*net.UnixConn), timeout: timeout}, nil
}

// Close drops the connection; the back-end resets the device.
func (c *Client) Close() error { return c.c.Close() }

// send writes one message with its descriptors.
func (c *Client) send(req, flags uint32, payload []byte, fds ...int) error {
	b := make([]byte, msgHeader, msgHeader+len(payload))
	binary.LittleEndian.PutUint32(b[0:], req)
	binary.LittleEndian.PutUint32(b[4:], msgVersion|flags)
	binary.LittleEndian.PutUint32(b[8:], uint32(len(payload)))
	b = append(b, payload...)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	_ = c.c.SetWriteDeadline(time.Now().Add(c.timeout))
	n, _, err := c.c.WriteMsgUnix(b, oob, nil)
	if err == nil && n != len(b) {
		err = io.ErrShortWrite
	}
	if err != nil {
		return fmt.Errorf("vhost-user: send %s: %w", reqName(req), err)
	}
	return nil
}

// reply reads the reply to req.
func (c *Client) reply(req uint32) ([]byte, error) {
	_ = c.c.SetReadDeadline(time.Now().Add(c.timeout))
	defer c.c.SetReadDeadline(time.Time{})
	var h [msgHeader]byte
	if _, err := io.ReadFull(c.c, h[:]); err != nil {
		return nil, fmt.Errorf("vhost-user: reply to %s: %w", reqName(req), err)
	}
	got, flags, size := binary.LittleEndian.Uint32(h[0:]), binary.LittleEndian.Uint32(h[4:]), binary.LittleEndian.Uint32(h[8:])
	if got != req || flags&msgReply == 0 || flags&0x3 != msgVersion {
		return nil, fmt.Errorf("%w: reply to %s is %s with flags %#x", ErrBackend, reqName(req), reqName(got), flags)
	}
	if size > maxReply {
		return nil, fmt.Errorf("%w: reply to %s of %d bytes", ErrBackend, reqName(req), size)
	}
	p := make([]byte, size)
	if _, err := io.ReadFull(c.c, p); err != nil {
		return nil, fmt.Errorf("vhost-user: reply to %s: %w", reqName(req), err)
	}
	return p, nil
}

// get sends a request that has a reply and returns the reply's payload.
func (c *Client) get(req uint32, payload []byte) ([]byte, error) {
	if err := c.send(req, 0, payload); err != nil {
		return nil, err
	}
	return c.reply(req)
}

// getU64 is get for replies that are one u64.
func (c *Client) getU64(req uint32, payload []byte) (uint64, error) {
	p, err := c.get(req, payload)
	if err != nil {
		return 0, err
	}
	if len(p) != 8 {
		return 0, fmt.Errorf("%w: reply to %s of %d bytes, want 8", ErrBackend, reqName(req), len(p))
	}
	return binary.LittleEndian.Uint64(p), nil
}

// set sends a request without a reply. With REPLY_ACK it asks for one and
// turns a non-zero status into an error, so a refused message fails here
// and not some requests later.
func (c *Client) set(req uint32, payload []byte, fds ...int) error {
	if c.Protocol&protoReplyAck == 0 {
		return c.send(req, 0, payload, fds...)
	}
	if err := c.send(req, msgNeedReply, payload, fds...); err != nil {
		return err
	}
	p, err := c.reply(req)
	if err != nil {
		return err
	}
	if len(p) != 8 {
		return fmt.Errorf("%w: ack of %s has %d bytes", ErrBackend, reqName(req), len(p))
	}
	if v := binary.LittleEndian.Uint64(p); v != 0 {
		return fmt.Errorf("%w: %s refused (status %d)", ErrBackend, reqName(req), v)
	}
	return nil
}

// Negotiate does what QEMU does first: SET_OWNER, features (VERSION_1 is
// required; want is added where offered), protocol features (REPLY_ACK, MQ
// and CONFIG where offered) and the number of queues.
func (c *Client) Negotiate(want uint64) error {
	if err := c.send(reqSetOwner, 0, nil); err != nil {
		return err
	}
	offered, err := c.getU64(reqGetFeatures, nil)
	if err != nil {
		return err
	}
	if offered&FeatureVersion1 == 0 {
		return fmt.Errorf("%w: features %#x lack VIRTIO_F_VERSION_1", ErrBackend, offered)
	}
	c.Features = FeatureVersion1 | offered&(want|FeatureProtocolFeatures)
	c.Queues = 2
	if c.Features&FeatureProtocolFeatures != 0 {
		pf, err := c.getU64(reqGetProtocolFeatures, nil)
		if err != nil {
			return err
		}
		p := pf & (protoReplyAck | protoMQ | protoConfig)
		if err := c.send(reqSetProtocolFeatures, 0, le64(p)); err != nil {
			return err
		}
		c.Protocol = p
		if p&protoMQ != 0 {
			n, err := c.getU64(reqGetQueueNum, nil)
			if err != nil {
				return err
			}
			if n < 2 || n > 64 {
				return fmt.Errorf("%w: %d queues", ErrBackend, n)
			}
			c.Queues = int(n)
		}
	}
	return c.set(reqSetFeatures, le64(c.Features))
}

// GuestCID reads the device's config space (GET_CONFIG): the guest CID. It
// reports false when the back-end has no CONFIG protocol feature.
func (c *Client) GuestCID() (uint64, bool, error) {
	if c.Protocol&protoConfig == 0 {
		return 0, false, nil
	}
	p, err := c.get(reqGetConfig, append(le32(0, 8, 0), make([]byte, 8)...))
	if err != nil {
		return 0, false, err
	}
	if len(p) != 12+8 {
		return 0, false, fmt.Errorf("%w: GET_CONFIG reply of %d bytes", ErrBackend, len(p))
	}
	return binary.LittleEndian.Uint64(p[12:]), true, nil
}

// SetMemTable hands over guest memory: one entry and one descriptor per
// region.
func (c *Client) SetMemTable(m *Memory) error {
	regs := m.Regions()
	p := le32(uint32(len(regs)), 0)
	fds := make([]int, len(regs))
	for i, r := range regs {
		p = append(p, le64(r.GPA, r.Size, r.UserAddr, r.Offset)...)
		fds[i] = m.FD()
	}
	return c.set(reqSetMemTable, p, fds...)
}

// StartRing configures and starts ring index: size, base 0, addresses, call
// and kick descriptors, and enables it (with protocol features), in QEMU's
// order.
func (c *Client) StartRing(index uint32, r *Ring, m *Memory, kick, call int) error {
	if err := c.set(reqSetVringNum, le32(index, uint32(r.Size))); err != nil {
		return err
	}
	if err := c.set(reqSetVringBase, le32(index, 0)); err != nil {
		return err
	}
	var ua [3]uint64
	for i, gpa := range []uint64{r.Desc, r.Used, r.Avail} {
		var err error
		if ua[i], err = m.UserAddr(gpa); err != nil {
			return err
		}
	}
	if err := c.set(reqSetVringAddr, append(le32(index, 0), le64(ua[0], ua[1], ua[2], 0)...)); err != nil {
		return err
	}
	if err := c.set(reqSetVringCall, le64(uint64(index)), call); err != nil {
		return err
	}
	if err := c.set(reqSetVringKick, le64(uint64(index)), kick); err != nil {
		return err
	}
	if c.Features&FeatureProtocolFeatures != 0 {
		return c.set(reqSetVringEnable, le32(index, 1))
	}
	return nil
}

// StopRing stops ring index (GET_VRING_BASE) and returns the back-end's
// next available index, where it would resume.
func (c *Client) StopRing(index uint32) (uint16, error) {
	p, err := c.get(reqGetVringBase, le32(index, 0))
	if err != nil {
		return 0, err
	}
	if len(p) != 8 || binary.LittleEndian.Uint32(p) != index {
		return 0, fmt.Errorf("%w: GET_VRING_BASE reply %x", ErrBackend, p)
	}
	return uint16(binary.LittleEndian.Uint32(p[4:])), nil
}

func le32(vs ...uint32) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	return b
}

func le64(vs ...uint64) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	return b
}
