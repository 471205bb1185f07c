package vsock

import (
	"encoding/binary"
	"errors"
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
// migration or snapshot restore; microvm has neither, so the embedder calls
// it, through Machine.ResetVsockTransport, when it drops its host services).
//
// In order:
//
//  1. every connection is dropped and its host socket closed: host clients
//     read end of stream (without "OK" if the guest had not accepted yet);
//  2. each gets an RST, queued behind whatever the RX ring already holds
//     for it;
//  3. VIRTIO_VSOCK_EVENT_TRANSPORT_RESET (id 0, 4 bytes) is written into the
//     next event buffer and the guest interrupted. Without an event buffer
//     the event waits until the driver posts one (resets in the meantime
//     make one event); Linux keeps eight posted.
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
// The queues keep running: packets the guest sent before it saw the event
// for a dropped connection are answered with RST (a Linux guest ignores
// them: the socket is closed), and new connections may be opened at once,
// both ways. The guest CID does not change; Linux re-reads it on the event.
// Listening sockets on either side are untouched.
//
// Without an event queue (a driver that did not set one up, or vhost-user,
// where the front-end keeps it: QEMU itself sends the event after a
// migration) the RSTs are all the guest gets.
//
// A connection the guest completes between step 1 and its handling of the
// event is reset by the guest without a packet (Linux resets every
// connected socket); the device learns of it at the next packet either side
// sends for it.
//
// It returns ErrNotActive when no driver uses the device. Stats counts the
// calls (TransportResets) and the events written (EventsSent).
func (d *Device) ResetTransport() error {
	d.mu.Lock()
	s := d.sess
	d.mu.Unlock()
	if s == nil {
		return ErrNotActive
	}
	s.resetTransport()
	return nil
}

// resetTransport implements ResetTransport on the session.
func (s *session) resetTransport() {
	s.d.ctr.transportResets.Add(1)
	s.connMu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for _, c := range s.conns {
		conns = append(conns, c)
	}
	s.connMu.Unlock()
	dropped := 0
	for _, c := range conns {
		c.mu.Lock()
		if c.state != stateClosed {
			s.resetConnLocked(c)
			dropped++
		}
		c.mu.Unlock()
	}
	s.d.log.WithField("connections", dropped).Info("vsock: transport reset")
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
	// Kicks stay off until the next event finds no buffer.
	_ = s.ev.DisableNotification()
	return true
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
