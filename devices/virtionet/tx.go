package virtionet

import (
	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/virtio"
)

// txBatch bounds the frames sent between two publishes of the used index.
const txBatch = 64

// txState is the TX worker's scratch, reused across passes.
type txState struct {
	chain   virtio.Chain
	pending bool             // chain holds a checked frame the TAP did not take yet (EAGAIN)
	hdr     [HeaderSize]byte // the frame's header, copied out of guest memory once
	views   [][]byte         // hdr, then the frame's views of guest memory
	iov     iovecs
	pushed  int // used entries pushed, not yet published
}

// txLoop is the TX worker. It owns the TX queue and writes to the TAP.
// While the TAP is full it waits for POLLOUT and leaves kicks pending in
// the eventfd; otherwise it sleeps on the kick eventfd.
func (s *session) txLoop() {
	st := s.txst
	kick := unix.PollFd{Fd: int32(s.tx.Kick.FD()), Events: unix.POLLIN}
	out := unix.PollFd{Fd: int32(s.d.be.FD()), Events: unix.POLLOUT}
	stop := unix.PollFd{Fd: int32(s.stopTX.FD()), Events: unix.POLLIN}
	for {
		blocked := false
		if !s.failed.Load() {
			blocked = s.processTX(st)
		}
		fds := []unix.PollFd{kick, stop}
		switch {
		case s.failed.Load():
			fds = []unix.PollFd{stop}
		case blocked:
			fds = []unix.PollFd{out, stop}
		}
		stopped, err := eventfd.PollStop(fds, -1)
		if err != nil {
			s.d.log.WithError(err).Error("virtio-net: tx poll")
			return
		}
		if stopped {
			return
		}
		if n, _ := s.tx.Kick.Wait(); n > 0 {
			s.d.ctr.txKicks.Add(1)
		}
	}
}

// processTX sends the guest's frames until the ring is empty or the TAP is
// full. It returns whether the TAP is full: the frame that found it so
// stays pending in st, and the worker waits for POLLOUT, not for a kick.
func (s *session) processTX(st *txState) bool {
	for {
		if err := s.tx.DisableNotification(); err != nil {
			s.failDevice(err)
			return false
		}
		for n := 0; n < txBatch; n++ {
			if !st.pending {
				ok, err := s.tx.Pop(&st.chain)
				if err != nil {
					s.failDevice(err)
					return false
				}
				if !ok {
					break
				}
				if !s.checkTX(st) {
					if !s.pushTX(st) {
						return false
					}
					continue
				}
				st.pending = true
			}
			if !s.sendTX(st) {
				s.d.ctr.txStalls.Add(1)
				// Return what was sent, then wait for room.
				s.publishTX(st)
				return true
			}
			st.pending = false
			if !s.pushTX(st) {
				return false
			}
		}
		if !s.publishTX(st) {
			return false
		}
		more, err := s.tx.EnableNotification()
		if err != nil {
			s.failDevice(err)
			return false
		}
		if !more {
			return false
		}
	}
}

// checkTX copies the popped chain's header out, checks it and the frame
// length, and prepares the views to write. A bad frame is counted.
func (s *session) checkTX(st *txState) bool {
	r := st.chain.Reader()
	if r.Read(st.hdr[:]) < HeaderSize {
		s.txError("TX chain %d of %d bytes has no room for a header", st.chain.Head, st.chain.ReadableLen())
		return false
	}
	if r.Len() > MaxFrame {
		s.txError("TX frame of %d bytes (max %d)", r.Len(), MaxFrame)
		return false
	}
	var h Header
	h.Decode(st.hdr[:])
	if err := h.CheckTX(s.features, int(r.Len())); err != nil {
		s.txError("TX header: %v", err)
		return false
	}
	// num_buffers is the device's field; the TAP sees zero whatever the
	// driver left there.
	h.NumBuffers = 0
	h.Encode(st.hdr[:])
	st.views = append(st.views[:0], st.hdr[:])
	st.views = r.Views(st.views, r.Len())
	if len(st.views) > maxIov {
		s.txError("TX frame in %d buffers (max %d)", len(st.views)-1, maxIov-1)
		return false
	}
	return true
}

func (s *session) txError(format string, args ...any) {
	s.d.ctr.txErrors.Add(1)
	s.d.log.Debugf("virtio-net: "+format, args...)
}

// sendTX writes the pending frame to the TAP in one writev straight from
// guest memory; it returns false when the TAP is full (the views stay for
// the retry). Other errors drop the frame and are counted.
func (s *session) sendTX(st *txState) bool {
	views, hdr := st.views, HeaderSize
	if !s.d.be.VnetHeader() {
		// A plain frame: the header was checked (CheckTX refuses offload
		// requests that were not negotiated, and none were offered).
		views, hdr = st.views[1:], 0
	}
	n, err := st.iov.writev(s.d.be.FD(), views)
	if err == unix.EAGAIN {
		return false
	}
	clear(st.views) // drop the references to guest memory
	st.views = st.views[:0]
	if err != nil {
		s.d.ctr.txDropped.Add(1)
		s.d.log.WithError(err).Debug("virtio-net: TAP write")
		return true
	}
	s.d.ctr.txFrames.Add(1)
	s.d.ctr.txBytes.Add(uint64(max(n-hdr, 0)))
	return true
}

// pushTX returns the chain to the driver (TX buffers are read-only: 0
// bytes written).
func (s *session) pushTX(st *txState) bool {
	if err := s.tx.PushNoPublish(st.chain.Head, 0); err != nil {
		s.failDevice(err)
		return false
	}
	st.pushed++
	return true
}

// publishTX publishes the pushed entries and interrupts the driver.
func (s *session) publishTX(st *txState) bool {
	if st.pushed == 0 {
		return true
	}
	st.pushed = 0
	if err := s.tx.Publish(); err != nil {
		s.failDevice(err)
		return false
	}
	if err := s.notify(s.tx); err != nil {
		s.failDevice(err)
		return false
	}
	return true
}
