package vsock

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// EventTransportReset is VIRTIO_VSOCK_EVENT_TRANSPORT_RESET, the id of the
// only event the spec defines (virtio 1.2, 5.10.6.7).
const EventTransportReset = 0

// EventSize is the size of struct virtio_vsock_event: one le32 id. A Linux
// driver acts on a used event buffer only if the device wrote exactly this
// many bytes.
const EventSize = 4

// ErrNotActive is returned by ResetTransport while no guest driver is
// using the device (before its first activation, after a device reset, or
// after Close).
var ErrNotActive = errors.New("vsock: the guest driver is not using the device")

// ResetTransport is a host-side transport reset (virtio 1.2, 5.10.6.7): the
// host side of the device forgets every connection while the guest driver
// stays live, and the guest is told so on the event queue, so that its
// sockets fail with ECONNRESET instead of waiting for a peer that is gone.
// It is what a VMM does when the host end of the transport restarts under a
// running guest (Linux's vhost-vsock and QEMU send the same event after a
// migration or snapshot restore, and so does this device in the first
// session after a quiesce or a restore: quiesce.go). The embedder calls
// it, through Machine.ResetVsockTransport, when it drops its host services.
//
// In order:
//
//  1. a fence goes up: until the guest has handled the event, no connection
//     is set up (guest REQUESTs are held in the TX ring, host connects wait;
//     below);
//  2. every connection is dropped and its host socket closed: host clients
//     read end of stream (without "OK" if the guest had not accepted yet);
//  3. each gets an RST, queued behind whatever the RX ring already holds
//     for it;
//  4. VIRTIO_VSOCK_EVENT_TRANSPORT_RESET (id 0, 4 bytes) is written into the
//     next event buffer and the guest interrupted. Without an event buffer
//     the event waits until the driver posts one (resets in the meantime
//     make one event); Linux keeps eight posted.
//  5. the fence comes down when the driver posts an event buffer after the
//     event was written: a Linux driver refills only after acting on an
//     event, by when it has reset every connected socket. A driver that
//     does not within the connect timeout (Config.ConnectTimeout) gets the
//     fence lifted anyway, and an event still undelivered then is dropped
//     (logged): the RSTs told the guest already.
//
// The event alone is not enough: a Linux driver resets only its connected
// sockets on it, and handles its event and RX queues on separate work
// items. A guest socket still in connect() whose RESPONSE the device had
// not sent, or had sent but the guest had not yet read when it handled the
// event, would otherwise wait for a peer that is gone, or become connected
// to nothing. The RSTs close those; on a socket the event already reset
// they are ignored, and one that reaches a connected socket before the
// event closes it as a peer's reset does.
//
// Without the fence, a connection set up after step 2 whose RESPONSE (or
// REQUEST) the guest read before it handled the event would be reset by
// the guest, without a packet, and kept by the device: a leak until the
// host closes it. Held REQUESTs are processed, in order, once the fence is
// down; host connects (ConnectFromHost, DialVsock) wait for it within their
// own deadline.
//
// The queues keep running; packets the guest sent before it saw the event
// for a dropped connection are answered with RST (a Linux guest ignores
// them: the socket is closed). A guest that reconnects at once from the
// same port to the same host port may see the RST for the dropped
// connection, still in the RX ring, on the new one (Linux picks a new
// port for an unbound socket). The guest CID does not change; Linux
// re-reads it on the event. Listening sockets on either side are untouched.
//
// Without an event queue (a driver that did not set one up, or vhost-user,
// where the front-end keeps it: QEMU itself sends the event after a
// migration) the RSTs are all the guest gets, and there is no fence: an RST
// is ordered with every other packet in the RX ring.
//
// It returns ErrNotActive when no driver uses the device. Stats counts the
// calls (TransportResets) and the events written (EventsSent).
func (d *Device) ResetTransport() error {
	s, ok := d.life.Current()
	if !ok {
		return ErrNotActive
	}
	s.resetTransport()
	return nil
}

// errFenced: no connection may start while a transport reset waits for the
// guest (session.fence).
var errFenced = errors.New("vsock: transport reset in progress")

// resetTransport implements ResetTransport on the session.
func (s *session) resetTransport() {
	s.d.ctr.transportResets.Add(1)
	s.connMu.Lock()
	// Raised before the table is emptied, so that no connection starts
	// in between.
	s.raiseFenceLocked()
	conns := make([]*conn, 0, len(s.conns))
	for _, c := range s.conns {
		conns = append(conns, c)
	}
	s.connMu.Unlock()
	dropped := 0
	for _, c := range conns {
		c.mu.Lock()
		if c.sm.state != stateClosed {
			c.resetLocked()
			dropped++
		}
		c.unlock()
	}
	s.d.log.WithField("connections", dropped).Info("vsock: transport reset")
	s.announceReset()
}

// raiseFenceLocked puts up the fence of a transport reset (or extends it:
// its deadline is the connect timeout from now), unless the session has no
// event queue or is closed. Called with connMu held.
func (s *session) raiseFenceLocked() {
	if s.ev == nil || s.closed {
		return
	}
	if s.fence == nil {
		s.fence = make(chan struct{})
	}
	s.fenceEnd = time.Now().Add(s.d.cfg.ConnectTimeout)
}

// announceReset marks a TRANSPORT_RESET pending for the RX worker to write
// into the next event buffer, and wakes it. Without an event queue it does
// nothing. Takes rxMu, then connMu (never together).
func (s *session) announceReset() {
	if s.ev == nil {
		return
	}
	s.rxMu.Lock()
	s.evPending = true
	s.rxMu.Unlock()
	// shutdown closes the wake eventfd only after marking the session
	// closed under connMu: a session seen open here is still open while
	// connMu is held.
	s.connMu.Lock()
	if !s.closed {
		s.wakeRX()
	}
	s.connMu.Unlock()
}

// deliverEventLocked writes a pending TRANSPORT_RESET into the next event
// buffer. It reports false when the driver has posted none (the event stays
// pending). Called by the RX worker with rxMu held.
func (s *session) deliverEventLocked() bool {
	if !s.evPending || s.failed.Load() {
		return true
	}
	ch := &s.evChain
	ok, err := s.ev.Pop(ch)
	if err != nil {
		s.failDevice(err)
		return true
	}
	if !ok {
		return false
	}
	if ch.WritableLen() < EventSize {
		s.ev.Undo()
		s.failDevice(virtioGuestErr("event buffer of %d bytes cannot hold an event", ch.WritableLen()))
		return true
	}
	// The driver posts a buffer again once it has handled the event
	// (Linux: virtio_transport_event_work refills after acting on it):
	// note its available index before it can see the event, and have it
	// kick when it moves past, whatever it had posted before.
	mark, err := s.ev.AvailIdx()
	if err == nil {
		err = s.ev.NotifyAfter(mark)
	}
	if err != nil {
		s.ev.Undo()
		s.failDevice(err)
		return true
	}
	var b [EventSize]byte
	binary.LittleEndian.PutUint32(b[:], EventTransportReset)
	w := ch.Writer()
	w.Write(b[:])
	if err := s.ev.Push(ch.Head, EventSize); err != nil {
		s.failDevice(err)
		return true
	}
	if err := s.ev.Notify(); err != nil {
		s.failDevice(err)
		return true
	}
	s.evPending = false
	s.d.ctr.eventsSent.Add(1)
	s.evDelivered, s.evMark = true, mark
	return true
}

// fenced reports whether a transport reset waits for the guest.
func (s *session) fenced() bool {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	return s.fence != nil
}

// waitFence waits, up to deadline, until no transport reset waits for the
// guest.
func (s *session) waitFence(deadline time.Time) error {
	s.connMu.Lock()
	ch := s.fence
	s.connMu.Unlock()
	if ch == nil {
		return nil
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-ch:
		return nil
	case <-t.C:
		return fmt.Errorf("%w: the guest did not handle it before the connect deadline", errFenced)
	}
}

// fenceTimeout is how long the RX worker may sleep before it must look at
// the fence again (-1: no fence).
func (s *session) fenceTimeout() int {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if s.fence == nil {
		return -1
	}
	return int(max(time.Until(s.fenceEnd)/time.Millisecond, 0)) + 1
}

// checkFence lifts the fence of a transport reset once the guest has
// handled the event: it posted an event buffer after the event was written
// (a Linux driver refills only after acting on an event, and every
// connected socket is reset by then). A driver that does not within the
// connect timeout (no event buffer, or never refilling) gets the fence
// lifted anyway, and an event still undelivered is dropped: the RSTs
// already reached it, and an event arriving later would reset connections
// made since. Called by the RX worker, holding no lock.
func (s *session) checkFence() {
	s.connMu.Lock()
	active, end := s.fence != nil, s.fenceEnd
	s.connMu.Unlock()
	if !active {
		return
	}
	s.rxMu.Lock()
	handled := false
	if !s.evPending && s.evDelivered {
		idx, err := s.ev.AvailIdx()
		if err != nil {
			s.failDevice(err)
		}
		handled = err == nil && idx != s.evMark
	}
	expired := !handled && !time.Now().Before(end)
	dropped := expired && s.evPending
	if handled || expired {
		s.evPending, s.evDelivered = false, false
		_ = s.ev.DisableNotification()
	}
	s.rxMu.Unlock()
	if !handled && !expired {
		return
	}
	if dropped {
		s.d.log.Warn("vsock: transport reset: the driver posted no event buffer within the connect timeout; event dropped")
	} else if expired {
		s.d.log.Warn("vsock: transport reset: the driver did not handle the event within the connect timeout")
	}
	s.connMu.Lock()
	if s.fence != nil {
		close(s.fence)
		s.fence = nil
	}
	s.connMu.Unlock()
	_ = s.resumeTX.Signal()
}

// eventWaitsLocked reports whether a pending event can be delivered now.
// When the driver has no event buffer it re-enables the event queue's
// kicks (with a re-check), so that posting one wakes the RX worker. Called
// with rxMu held.
func (s *session) eventWaitsLocked() bool {
	if !s.evPending || s.failed.Load() {
		return false
	}
	ok, err := s.ev.HasAvailable()
	if err != nil {
		s.failDevice(err)
		return false
	}
	if ok {
		return true
	}
	more, err := s.ev.EnableNotification()
	if err != nil {
		s.failDevice(err)
		return false
	}
	if more {
		_ = s.ev.DisableNotification()
	}
	return more
}
