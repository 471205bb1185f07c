package virtionet

import (
	"encoding/binary"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/virtio"
)

// rxBatch bounds the frames delivered between two publishes of the used
// index.
const rxBatch = 64

// rxState is the RX worker's scratch, allocated per activation; its frame
// buffer, with a frame waiting in it, passes from a drained session to the
// next (quiesce.go).
type rxState struct {
	// buf holds one frame read from the TAP, header first; n is its
	// length, 0 when no frame is waiting for guest buffers.
	buf []byte
	n   int
	// held are chains popped from the RX ring and not yet used, in pop
	// order: a frame waiting for more room (merged buffers), or a chain
	// kept after a frame too large for it was dropped. At most the queue
	// size.
	held   []virtio.Chain
	nheld  int
	room   uint64 // writable bytes of the held chains
	pushed int    // used entries pushed, not yet published
}

// newRXState returns the RX worker's state for a queue of size chains,
// with the frame a drained session left waiting, if p has one.
func newRXState(size uint16, p *paused) *rxState {
	st := &rxState{held: make([]virtio.Chain, size)}
	if p != nil && p.buf != nil {
		st.buf, st.n = p.buf, p.n
	} else {
		st.buf = make([]byte, HeaderSize+MaxFrame)
	}
	return st
}

// rxLoop is the RX worker. It owns the RX queue and reads the TAP. It
// reads the TAP only while the guest has buffers; without them it sleeps on
// the RX kick instead, leaving frames in the TAP's queue (the kernel's
// bound on it applies).
func (s *session) rxLoop() {
	st := s.rxst
	in := unix.PollFd{Fd: int32(s.d.be.FD()), Events: unix.POLLIN}
	kick := unix.PollFd{Fd: int32(s.rx.Kick.FD()), Events: unix.POLLIN}
	stop := unix.PollFd{Fd: int32(s.stopRX.FD()), Events: unix.POLLIN}
	// RX kicks matter only once the device has run out of buffers.
	if err := s.rx.DisableNotification(); err != nil {
		s.failDevice(err)
	}
	for {
		starved := false
		if !s.failed.Load() {
			starved = s.processRX(st)
		}
		fds := []unix.PollFd{in, kick, stop}
		switch {
		case s.failed.Load():
			fds = []unix.PollFd{stop}
		case starved:
			fds = []unix.PollFd{kick, stop}
		}
		stopped, err := eventfd.PollStop(fds, -1)
		if err != nil {
			s.d.log.WithError(err).Error("virtio-net: rx poll")
			return
		}
		if stopped {
			return
		}
		if n, _ := s.rx.Kick.Wait(); n > 0 {
			s.d.ctr.rxKicks.Add(1)
		}
	}
}

// processRX moves frames from the TAP into guest buffers until the TAP is
// empty (false: wait for POLLIN) or the guest has no buffers for the next
// frame (true: wait for the RX kick, which it has been asked for).
func (s *session) processRX(st *rxState) bool {
	for !s.failed.Load() {
		starved := s.rxPass(st)
		if !s.publishRX(st) || !starved {
			return false
		}
		// Out of buffers: ask for a kick, then look again, since the
		// driver may have posted buffers before it saw the request.
		more, err := s.rx.EnableNotification()
		if err != nil {
			s.failDevice(err)
			return false
		}
		if !more {
			s.d.ctr.rxStalls.Add(1)
			return true
		}
		if err := s.rx.DisableNotification(); err != nil {
			s.failDevice(err)
			return false
		}
	}
	return false
}

// rxPass delivers frames, publishing every rxBatch of them, until the TAP
// is empty or failed (false) or the guest has no buffers for the next frame
// (true). The caller publishes the rest.
func (s *session) rxPass(st *rxState) bool {
	for k := 1; !s.failed.Load(); k++ {
		if st.n == 0 {
			// Read only when there is somewhere to put the frame.
			if st.nheld == 0 {
				ok, err := s.rx.HasAvailable()
				if err != nil {
					s.failDevice(err)
					return false
				}
				if !ok {
					return true
				}
			}
			if !s.readFrame(st) {
				return false
			}
			if st.n == 0 {
				continue // a runt, dropped
			}
		}
		ok, err := s.deliver(st)
		if err != nil {
			s.failDevice(err)
			return false
		}
		if !ok {
			return true
		}
		if k%rxBatch == 0 && !s.publishRX(st) {
			return false
		}
	}
	return false
}

// readFrame reads one frame from the TAP into st.buf. It returns false
// when the TAP has nothing (EAGAIN) or failed.
func (s *session) readFrame(st *rxState) bool {
	for {
		buf, hdr := st.buf, s.d.be.VnetHeader()
		if !hdr {
			buf = st.buf[HeaderSize:]
		}
		n, err := unix.Read(s.d.be.FD(), buf)
		if !hdr && err == nil {
			clear(st.buf[:HeaderSize]) // no offload: flags 0, GSO_NONE
			n += HeaderSize
		}
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return false
		case err != nil:
			s.d.ctr.rxErrors.Add(1)
			s.d.log.WithError(err).Debug("virtio-net: TAP read")
			return false
		case n < HeaderSize+MinFrame:
			s.d.ctr.rxErrors.Add(1)
			st.n = 0
			return true
		}
		st.n = n
		return true
	}
}

// deliver puts the waiting frame into guest buffers: one chain, or with
// VIRTIO_NET_F_MRG_RXBUF as many as its length needs (5.1.6.4). It returns
// false when the ring ran out of buffers first: the chains popped so far
// stay held and the frame waits. A frame larger than what the guest's
// buffers can ever hold is dropped and counted.
func (s *session) deliver(st *rxState) (bool, error) {
	need := uint64(st.n)
	mrg := s.features&FeatureMrgRxbuf != 0
	for st.nheld == 0 || (mrg && st.room < need) {
		if st.nheld == len(st.held) {
			// Every buffer of the ring is held and still too small.
			s.dropFrame(st)
			return true, nil
		}
		c := &st.held[st.nheld]
		ok, err := s.rx.Pop(c)
		if err != nil {
			return false, err
		}
		if !ok {
			return false, nil
		}
		if c.WritableLen() < HeaderSize {
			// 5.1.6.3.1: every receive buffer holds at least a header.
			return false, virtioGuestErr("RX chain %d has %d writable bytes, less than a header", c.Head, c.WritableLen())
		}
		st.nheld++
		st.room += c.WritableLen()
	}
	if !mrg && st.held[0].WritableLen() < need {
		s.dropFrame(st)
		return true, nil
	}
	// The TAP wrote the first ten bytes of the header; num_buffers (and,
	// without GUEST_CSUM, flags: 5.1.6.4.1) are ours.
	if s.features&FeatureGuestCsum == 0 {
		st.buf[0] = 0
	}
	off, used := 0, 0
	for off < st.n {
		c := &st.held[used]
		w := c.Writer()
		off += w.Write(st.buf[off:st.n])
		if err := s.rx.PushNoPublish(c.Head, uint32(w.Written())); err != nil {
			return false, err
		}
		st.room -= c.WritableLen()
		used++
		st.pushed++
	}
	// Written last: the header is in the first chain, which nobody sees
	// before Publish.
	var nb [2]byte
	binary.LittleEndian.PutUint16(nb[:], uint16(used))
	w := st.held[0].Writer()
	w.Advance(HeaderSize - 2)
	w.Write(nb[:])
	// Keep the unused chains at the front, storage swapped, not copied.
	for i := 0; i < st.nheld-used; i++ {
		st.held[i], st.held[i+used] = st.held[i+used], st.held[i]
	}
	st.nheld -= used
	s.d.ctr.rxFrames.Add(1)
	s.d.ctr.rxBytes.Add(uint64(st.n - HeaderSize))
	st.n = 0
	return true, nil
}

// dropFrame discards the waiting frame; the held chains stay for the next.
func (s *session) dropFrame(st *rxState) {
	s.d.ctr.rxDropped.Add(1)
	s.d.log.Debugf("virtio-net: RX frame of %d bytes dropped: the guest's buffers hold %d", st.n-HeaderSize, st.room)
	st.n = 0
}

// publishRX publishes the delivered frames and interrupts the driver.
func (s *session) publishRX(st *rxState) bool {
	if st.pushed == 0 {
		return true
	}
	st.pushed = 0
	if err := s.rx.Publish(); err != nil {
		s.failDevice(err)
		return false
	}
	if err := s.notify(s.rx); err != nil {
		s.failDevice(err)
		return false
	}
	return true
}
