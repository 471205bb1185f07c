package vsock

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/internal/jail"
	"github.com/microvm/microvm/internal/unixsock"
	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/virtio"
)

// Datagrams (experimental, off by default): microvm's own, behind a
// feature bit of their own. The virtio-vsock datagram RFC series (v2)
// defines VIRTIO_VSOCK_F_DGRAM as bit 3 with datagrams (packet type 3) on
// the stream queues; microvm gives them a queue pair of their own (as the
// series' first version did) so that they never take the RX buffers a
// stream's credit counts on, and so must not claim bit 3: a driver written
// to the series would put datagrams where this device does not look. No
// mainline driver speaks either; microvm's test guest and load generator
// speak this one. See the package comment for the data path.
const (
	// FeatureDgram is microvm's datagram feature, bit 23 (the top of the
	// device-specific range 0-23 of the virtio spec, "Reserved Feature
	// Bits"; vsock uses bits 0-2 and the RFC proposes 3), offered only
	// with Config.Dgram. It is not VIRTIO_VSOCK_F_DGRAM.
	FeatureDgram = 1 << 23
	// TypeDgram is the packet type of a datagram: one packet, one
	// datagram, op RW; no connection, no credit.
	TypeDgram = 3
	// QueueDgramRX and QueueDgramTX are the datagram queue pair, after the
	// event queue: the device has 5 queues when datagrams are enabled.
	QueueDgramRX = 3
	QueueDgramTX = 4
	// DgramPrefixSize is the size of the address prefix every datagram
	// carries on the host side: the guest port, then the host port, both
	// u32 little endian, in both directions.
	DgramPrefixSize = 8
	// MaxDgramPayload is the largest datagram payload, either direction.
	MaxDgramPayload = MaxPacketPayload
	// dgramBatch bounds the packets one pass handles per direction before
	// publishing them and interrupting the guest.
	dgramBatch = 64
	// dgramPassBudget bounds the guest datagrams one TX pass handles
	// (dgramTX), as dgramRX bounds its own pass.
	dgramPassBudget = 4 * dgramBatch
	// dgramSuffix ends the host datagram socket paths.
	dgramSuffix = ".dgram"
)

// CheckDgramPath verifies that the datagram socket paths derived from the
// prefix uds ("<uds>.dgram" and "<uds>_<port>.dgram") fit in sun_path.
func CheckDgramPath(uds string) error {
	if uds == "" {
		return errors.New("vsock: datagrams need a Unix socket path prefix")
	}
	longest := len(uds) + len("_4294967295") + len(dgramSuffix)
	if longest > maxSunPath {
		return fmt.Errorf("vsock: datagram socket paths from %q reach %d bytes (%q), over the %d that sun_path holds",
			uds, longest, uds+"_4294967295"+dgramSuffix, maxSunPath)
	}
	return nil
}

// DgramHostPath is the host socket a guest datagram to host port port is
// sent to: "<uds>_<port>.dgram".
func DgramHostPath(uds string, port uint32) string {
	return uds + "_" + strconv.FormatUint(uint64(port), 10) + dgramSuffix
}

// DgramDevicePath is the device's own datagram socket, where host
// applications send datagrams for the guest: "<uds>.dgram".
func DgramDevicePath(uds string) string { return uds + dgramSuffix }

// EncodeDgramPrefix writes the host-side address prefix into b (at least
// DgramPrefixSize bytes).
func EncodeDgramPrefix(b []byte, guestPort, hostPort uint32) {
	binary.LittleEndian.PutUint32(b[0:], guestPort)
	binary.LittleEndian.PutUint32(b[4:], hostPort)
}

// DecodeDgramPrefix reads the host-side address prefix from b (at least
// DgramPrefixSize bytes).
func DecodeDgramPrefix(b []byte) (guestPort, hostPort uint32) {
	return binary.LittleEndian.Uint32(b[0:]), binary.LittleEndian.Uint32(b[4:])
}

// dgramHost is the device's host datagram socket, bound for the device's
// lifetime (New to Close), across activations.
type dgramHost struct {
	uds  string // the path prefix
	path string // DgramDevicePath(uds)
	fd   int    // non-blocking; read and written only by the session's datagram worker
}

// openDgramHost binds "<uds>.dgram".
func openDgramHost(uds string) (*dgramHost, error) {
	if err := CheckDgramPath(uds); err != nil {
		return nil, err
	}
	path := DgramDevicePath(uds)
	fd, err := unixsock.ListenDgram(path)
	if err != nil {
		return nil, fmt.Errorf("vsock: %w", err)
	}
	return &dgramHost{uds: uds, path: path, fd: fd}, nil
}

// close closes the socket and removes its file. Called by Device.Close after
// the session (the only user of fd) has stopped.
func (h *dgramHost) close() {
	closeFD(h.fd)
	h.fd = -1
	_ = os.Remove(jail.Path(h.path))
}

// dgramState is the datagram worker's scratch, reused across passes.
type dgramState struct {
	chain   virtio.Chain
	hdr     [HeaderSize]byte
	prefix  [DgramPrefixSize]byte
	bufs    [][]byte
	scratch []byte // where a datagram nobody can take is read to be dropped
	// The last destination, so a stream of datagrams to one port does
	// not build its address each time.
	toPort uint32
	to     *unix.SockaddrUnix
}

// dgramLoop is the datagram worker: it owns both datagram queues and the
// device's host datagram socket for the session. Woken by the datagram TX
// kick (guest datagrams to send) or the host socket (datagrams for the
// guest); RX kicks are not used: a host datagram that finds no RX buffer is
// dropped, not held.
func (s *session) dgramLoop() {
	st := &dgramState{scratch: make([]byte, DgramPrefixSize+MaxDgramPayload+1)}
	if err := s.drx.DisableNotification(); err != nil {
		s.failDevice(err)
	}
	fds := []unix.PollFd{
		{Fd: int32(s.dtx.Kick.FD()), Events: unix.POLLIN},
		{Fd: int32(s.d.dgram.fd), Events: unix.POLLIN},
		{Fd: int32(s.stopDgram.FD()), Events: unix.POLLIN},
	}
	for {
		wait := -1 // until a kick, a host datagram or the stop
		if s.failed.Load() {
			// The queues are off limits; a readable host socket must not
			// make poll spin.
			fds[1].Fd = -1
		} else {
			if s.dgramTX(st) {
				wait = 0 // the TX pass spent its budget: look, then go on
			}
			s.dgramRX(st)
		}
		stopped, err := eventfd.PollStop(fds, wait)
		if err != nil {
			s.d.log.WithError(err).Error("vsock: datagram poll")
			return
		}
		if stopped {
			return
		}
		if fds[0].Revents != 0 {
			if n, _ := s.dtx.Kick.Wait(); n > 0 {
				s.d.ctr.dgramKicks.Add(1)
			}
		}
	}
}

// dgramTX sends the guest's datagrams to host sockets until the queue is
// empty, with kicks off while it drains and a final re-check
// (Options.KickSuppress; without it kicks stay on), or until it
// has handled dgramPassBudget of them: then it reports that more may wait
// (kicks stay off), and the worker serves the RX side and looks at its
// stop eventfd before the next pass, so a guest that floods the queue
// starves neither.
func (s *session) dgramTX(st *dgramState) (more bool) {
	budget := dgramPassBudget
	for !s.failed.Load() {
		if s.opts.KickSuppress {
			if err := s.dtx.DisableNotification(); err != nil {
				s.failDevice(err)
				return false
			}
			s.d.ctr.kickSuppressions.Add(1)
		}
		for {
			n := 0
			for ; n < dgramBatch; n++ {
				ok, err := s.dtx.Pop(&st.chain)
				if err != nil {
					s.failDevice(err)
					return false
				}
				if !ok {
					break
				}
				s.dgramSend(st)
				if err := s.dtx.PushNoPublish(st.chain.Head, 0); err != nil {
					s.failDevice(err)
					return false
				}
			}
			if n == 0 {
				break
			}
			if err := s.dtx.Publish(); err != nil {
				s.failDevice(err)
				return false
			}
			if err := s.dtx.Notify(); err != nil {
				s.failDevice(err)
				return false
			}
			if hook := s.d.afterDgramBatch.Load(); hook != nil {
				(*hook)()
			}
			if budget -= n; budget <= 0 {
				s.d.ctr.dgramPassesCut.Add(1)
				return true
			}
		}
		again, err := s.dtx.EnableNotification()
		if err != nil {
			s.failDevice(err)
			return false
		}
		if !again {
			return false
		}
	}
	return false
}

// dgramSend checks one guest datagram (st.chain) and sends it to its host
// socket. A malformed one is a counted guest error; one no host socket takes
// is counted as dropped. Neither stops anything else.
func (s *session) dgramSend(st *dgramState) {
	c := &st.chain
	r := c.Reader()
	if r.Read(st.hdr[:]) != HeaderSize {
		s.guestError(virtio.GuestErrHeader, "datagram chain %d of %d bytes cannot hold a packet header", c.Head, c.ReadableLen())
		return
	}
	var h Header
	h.Decode(st.hdr[:])
	switch {
	case h.SrcCID != s.d.cfg.CID || h.DstCID != CIDHost:
		s.guestError(virtio.GuestErrAddress, "datagram %v: bad CIDs (guest is %d)", &h, s.d.cfg.CID)
		return
	case h.Type != TypeDgram || h.Op != OpRW:
		s.guestError(virtio.GuestErrType, "datagram %v: want type %d, op RW on the datagram queue", &h, TypeDgram)
		return
	case h.SrcPort == portAny || h.DstPort == portAny:
		s.guestError(virtio.GuestErrAddress, "datagram %v: port %d is not an address", &h, uint32(portAny))
		return
	case uint64(h.Len) > r.Len() || h.Len > MaxDgramPayload:
		s.guestError(virtio.GuestErrLength, "datagram %v: len %d but the chain holds %d payload bytes (max %d)",
			&h, h.Len, r.Len(), MaxDgramPayload)
		return
	}
	EncodeDgramPrefix(st.prefix[:], h.SrcPort, h.DstPort)
	st.bufs = r.Views(append(st.bufs[:0], st.prefix[:]), uint64(h.Len))
	if st.to == nil || st.toPort != h.DstPort {
		st.to, st.toPort = &unix.SockaddrUnix{Name: jail.Path(DgramHostPath(s.d.dgram.uds, h.DstPort))}, h.DstPort
	}
	_, err := unix.SendmsgBuffers(s.d.dgram.fd, st.bufs, nil, st.to, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
	clear(st.bufs) // drop the views of guest memory
	if err != nil {
		// No socket at the path, nobody bound to it, or its queue full:
		// a datagram is lost, as UDP's would be.
		s.d.ctr.dgramTxDropped.Add(1)
		s.d.log.WithError(err).Debugf("vsock: datagram to host port %d dropped", h.DstPort)
		return
	}
	s.d.ctr.dgramTx.Add(1)
	s.d.ctr.dgramTxBytes.Add(uint64(h.Len))
}

// portAny is VMADDR_PORT_ANY, never an address on the wire.
const portAny = 0xffffffff

// dgramRX delivers datagrams waiting on the host socket, each straight into
// one guest RX buffer (its address prefix read aside), until the socket is
// empty or dgramBatch are delivered; then publishes and interrupts once.
// Without an RX buffer a datagram is read into scratch and dropped: the host
// socket never backs up behind a guest that does not read, and the device
// holds no datagram of its own.
func (s *session) dgramRX(st *dgramState) {
	fd := s.d.dgram.fd
	pushed := 0
	defer func() {
		if pushed == 0 || s.failed.Load() {
			return
		}
		if err := s.drx.Publish(); err != nil {
			s.failDevice(err)
			return
		}
		if err := s.drx.Notify(); err != nil {
			s.failDevice(err)
		}
	}()
	// Drops count towards the pass too, so a host flooding a guest that
	// posts no buffers cannot keep the worker from the TX queue.
	for seen := 0; seen < 4*dgramBatch && pushed < dgramBatch && !s.failed.Load(); seen++ {
		ok, err := s.drx.Pop(&st.chain)
		if err != nil {
			s.failDevice(err)
			return
		}
		if !ok {
			_, err := unix.Read(fd, st.scratch)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return // EAGAIN: nothing waits
			}
			s.d.ctr.dgramRxDropped.Add(1)
			continue
		}
		c := &st.chain
		if c.WritableLen() < HeaderSize {
			s.drx.Undo()
			s.failDevice(virtioGuestErr("datagram RX buffer of %d bytes cannot hold a packet header", c.WritableLen()))
			return
		}
		room := min(c.WritableLen()-HeaderSize, MaxDgramPayload)
		w := c.Writer()
		w.Advance(HeaderSize) // the header goes in once the size is known
		st.bufs = w.Views(append(st.bufs[:0], st.prefix[:]), room)
		n, _, rflags, _, err := unix.RecvmsgBuffers(fd, st.bufs, nil, unix.MSG_DONTWAIT)
		clear(st.bufs)
		if err != nil {
			s.drx.Undo()
			if err == unix.EINTR {
				continue
			}
			if !isAgain(err) {
				s.d.log.WithError(err).Warn("vsock: datagram socket read")
			}
			return
		}
		if n < DgramPrefixSize || rflags&unix.MSG_TRUNC != 0 {
			// Shorter than its address, or larger than the guest's buffer
			// (what fit was written there; the buffer goes back unused).
			s.drx.Undo()
			s.d.ctr.dgramRxRejected.Add(1)
			s.d.log.Debugf("vsock: host datagram of %d bytes rejected (prefix %d, guest buffer room %d)", n, DgramPrefixSize, room)
			continue
		}
		guestPort, hostPort := DecodeDgramPrefix(st.prefix[:])
		k := uint32(n - DgramPrefixSize)
		h := Header{SrcCID: CIDHost, DstCID: s.d.cfg.CID, SrcPort: hostPort, DstPort: guestPort,
			Len: k, Type: TypeDgram, Op: OpRW}
		h.Encode(st.hdr[:])
		hw := c.Writer()
		hw.Write(st.hdr[:])
		if err := s.drx.PushNoPublish(c.Head, HeaderSize+k); err != nil {
			s.failDevice(err)
			return
		}
		pushed++
		s.d.ctr.dgramRx.Add(1)
		s.d.ctr.dgramRxBytes.Add(uint64(k))
	}
}
