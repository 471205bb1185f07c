package vsock

import (
	"errors"

	"github.com/microvm/microvm/virtio"
)

// Quiesce (snapshots: virtio.Quiescer, virtio.Drainer) stops the session
// for a pause, leaving the rings as a new session can take them over.
// Connections do not survive it (as in Firecracker): their host sockets are
// closed, and the next session tells the guest with a TRANSPORT_RESET
// before anything else (event.go's machinery, as after ResetTransport).
//
// Who holds what when the workers have returned (each looks for the stop
// signal only between passes, so none stops with a packet half handled):
//
//   - TX: every chain the TX worker popped was handled, pushed and
//     published, and the guest interrupted, except those it holds behind a
//     REQUEST while a transport reset's fence is up (txState.held). Those
//     were popped last and nothing of them was acted on, so the worker
//     puts them back on its way out (putBackHeld: Undo, newest first) and
//     the next session handles them in order, the REQUEST included: a
//     guest connection attempt the device had not taken yet survives the
//     pause.
//   - RX: buffers are popped and pushed under rxMu in one go (control
//     packets, SEQPACKET records, rxChain), or popped for a host read and,
//     when it is over, pushed or put on the spare list (rxspare.go). Once
//     the workers have stopped and every connection is closed under its
//     lock (so no dial goroutine or host connect can emit any more), the
//     spare list holds every RX buffer popped and not returned. Pops take
//     the oldest spare buffer first, so the list is normally the ring's
//     most recent pops, in order, and putBackRX puts them back with Undo,
//     newest first. A buffer under a newer one already returned (a
//     producer popped and pushed while another's read was out) cannot be
//     put back: it is returned empty (used length 0; Linux drops such a
//     buffer and posts a new one).
//   - The event queue: the RX worker pops an event buffer and pushes the
//     event in one go under rxMu (evChain never stays popped); an event
//     still pending is owed again to the next session anyway.
//   - Datagrams: the datagram worker returns every chain it pops before it
//     looks at the stop signal (pushed, or put back with Undo when the
//     host socket had nothing for it). Nothing is held.
//
// Connections are closed as a device reset closes them (the host sockets
// read end of stream, or fail on write), with no RST queued: the event
// tells the guest, and the session's budget goes back to zero with them.
// The Device owes the next session a TRANSPORT_RESET (Device.resetOwed)
// until an activation takes it or a Reset drops it; RestoreDeviceState
// owes one too (state.go), for a restore in a new process.
//
// A session that failed (Activation.Fail) touches no ring: the transport
// has set DEVICE_NEEDS_RESET and will not save its positions.
//
// Host connects (ConnectFromHost) waiting on a drained session, at its
// fence or about to add their connection, keep their socket and wait for
// the next session within their deadline (errQuiesced), as connects that
// come while the device is paused do. A guest connection being dialled is
// dropped with the rest: the guest's socket was still connecting, so the
// event does not reset it, and it fails after its own connect timeout.

// errQuiesced: the session was closed for a quiesce; a host connect tries
// the next one.
var errQuiesced = errors.New("vsock: device quiesced")

// Quiesce implements virtio.Quiescer: the session drains (Drain) and the
// next activation starts with a TRANSPORT_RESET.
func (d *Device) Quiesce() { d.life.Quiesce() }

// Drain implements virtio.Drainer: it stops the session as Stop does, but
// the workers and then Drain itself return or put back every chain popped
// (see above), and the Device owes the next session a transport reset.
func (s *session) Drain() {
	s.d.resetOwed.Store(true)
	s.shutdown(true)
}

// putBackHeld puts the TX chains held behind a REQUEST during a fence back
// in the ring with Undo, newest first: they were the worker's last pops and
// none of them was handled. TX worker, on its way out (after a device reset
// the positions do not matter, and Undo touches no guest memory).
func (s *session) putBackHeld(st *txState) {
	for n := st.heldN - st.held; n > 0; n-- {
		s.tx.Undo()
	}
	st.held, st.heldN = 0, 0
}

// putBackRX puts back, or returns empty, every RX buffer on the spare
// list, and publishes and notifies what it returned. Called by shutdown
// for a drain, once no other goroutine can pop an RX buffer.
func (s *session) putBackRX() {
	s.rxMu.Lock()
	defer s.rxMu.Unlock()
	if s.failed.Load() {
		return
	}
	sp := &s.rxSpare
	if out := int(s.rx.LastAvail() - s.rx.NextUsed()); out != sp.n {
		// A host bug the transport reports too (ErrNotDrained): the
		// snapshot is refused, the pause can still be resumed.
		s.d.log.Errorf("vsock: quiesce: %d RX buffers popped and not returned, %d of them on the spare list", out, sp.n)
	}
	// The newest first (index 0), while each is the ring's latest pop.
	undone := 0
	for undone < sp.n && sp.pos[undone] == s.rx.LastAvail()-1 {
		s.rx.Undo()
		undone++
	}
	emptied := sp.n - undone
	for k := sp.n - 1; k >= undone; k-- {
		if err := s.rx.PushNoPublish(sp.chains[k].Head, 0); err != nil {
			s.failDevice(err)
			return
		}
	}
	sp.n = 0
	if emptied > 0 {
		s.d.log.WithField("buffers", emptied).Info("vsock: quiesce: RX buffers that could not be put back returned empty")
		s.rxPushed = true
	}
	if !s.rxPushed {
		return
	}
	s.rxPushed = false
	if err := s.rx.Publish(); err != nil {
		s.failDevice(err)
		return
	}
	need, err := s.rx.NeedsNotification()
	if err != nil {
		s.failDevice(err)
		return
	}
	if need {
		s.d.ctr.interrupts.Add(1)
		s.rx.Interrupt()
	}
}

// resetAfterQuiesce starts a session with the TRANSPORT_RESET the Device
// owes the guest: the fence goes up and the event is pending, as after
// ResetTransport, with no connection to drop. Called by Activate before
// the workers start; the RX worker's first pass delivers the event.
func (s *session) resetAfterQuiesce() {
	if s.ev == nil {
		s.d.log.Warn("vsock: the driver set up no event queue: it cannot be told that its connections did not survive the pause")
		return
	}
	s.connMu.Lock()
	s.raiseFenceLocked()
	s.connMu.Unlock()
	s.announceReset()
	s.d.log.Info("vsock: new session after a quiesce or restore: sending the guest a transport reset")
}

// The Lifecycle finds Drain through an interface check; a typo in its name
// would silently turn every Quiesce into a Stop.
var (
	_ virtio.Quiescer = (*Device)(nil)
	_ virtio.Drainer  = (*session)(nil)
)
