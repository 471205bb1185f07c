package vsock

// The TX worker's interrupts (Options.IRQCoalesce).
//
// Each TX batch the worker handles returns its chains to the guest, and the
// driver usually asks to hear of it: one interrupt per batch. Host-to-guest,
// a batch is typically one CREDIT_UPDATE whose credit lets the same worker
// put host data in the RX ring at once (DirectEnqueue, in endRun, before
// the batch's chains are published), which interrupts the guest too: two
// interrupts a moment apart. When the transport raises one interrupt for
// every queue and the driver looks at every queue when it comes
// (virtio-mmio: virtio.Activation.SharedInterrupt), the RX interrupt of the
// worker's direct enqueues waits for the end of the batch and goes out with
// the TX completions as one.
//
// The bound: the RX interrupt waits at most for the rest of one batch
// (txBatch chains). Holding longer, to the end of the worker's pass, was
// measured and lost: a guest whose TX ring fills waits for the completions,
// and under vhost-user 64 B guest-to-host fell to 0.78x with 2.5x the kicks
// (docs/notes/performance.md). Without a shared line nothing is held.

// txIRQ is what the TX worker holds back for the end of a batch. Owned by
// the TX worker.
type txIRQ struct {
	rx bool // RX buffers of its direct enqueues the driver asked to hear of
}

// holdRX reports whether the RX interrupt publishRX is about to raise is
// left to the end of the TX worker's batch: only for the TX worker's own
// direct enqueues (h not nil), with IRQCoalesce, on a shared line. Called
// under rxMu.
func (s *session) holdRX(h *txIRQ) bool {
	if h == nil || !s.opts.IRQCoalesce || !s.sharedIRQ {
		return false
	}
	h.rx = true
	return true
}

// notifyTX ends a batch whose chains were just published: one interrupt if
// the driver asked for it for the TX chains, or an RX interrupt is held
// (which then serves both). TX worker only.
func (s *session) notifyTX(h *txIRQ) error {
	need, err := s.tx.NeedsNotification()
	if err != nil {
		return err
	}
	s.flushTXIRQ(h, need)
	return nil
}

// flushTXIRQ sends the held RX interrupt, which on the shared line also
// announces TX completions (needTX), or the TX interrupt alone. TX worker
// only; also after a batch cut short, so nothing held is lost.
func (s *session) flushTXIRQ(h *txIRQ, needTX bool) {
	held := h.rx
	h.rx = false
	switch {
	case s.failed.Load():
	case held:
		if needTX {
			s.d.ctr.txIRQCovered.Add(1)
		}
		s.d.ctr.interrupts.Add(1)
		s.rx.Interrupt()
	case needTX:
		s.d.ctr.txInterrupts.Add(1)
		s.tx.Interrupt()
	}
}
