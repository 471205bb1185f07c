package virtio

import (
	"fmt"
	"strings"
)

// What a running transport looks like from outside, for an operator asking
// why a device stalled (microvm run: SIGUSR1 logs it): the status byte, the
// interrupt status the driver has not acknowledged yet, and each ring's
// indices as they stand in guest memory. Nothing here takes a worker's
// state: the rings' indices and event fields are read with the same atomic
// loads the workers use, so an inspection never stops or races a device.

// RingState is one ring's indices and notification fields as guest memory
// holds them. AvailIdx - UsedIdx is how many buffers the driver has posted
// that the device has not returned: on a transmit ring with the device idle
// and kicks enabled, a missed kick; on a receive ring, the buffers the
// device may fill.
type RingState struct {
	Queue int
	Size  uint16
	// AvailIdx is the driver's available index, UsedIdx the device's used
	// index.
	AvailIdx, UsedIdx uint16
	// AvailFlags (VIRTQ_AVAIL_F_NO_INTERRUPT) and UsedFlags
	// (VIRTQ_USED_F_NO_NOTIFY) are the flag words; UsedEvent and
	// AvailEvent are the EVENT_IDX fields (meaningless without it).
	AvailFlags, UsedFlags uint16
	UsedEvent, AvailEvent uint16
}

// String is a log line's worth: "q1 size=128 avail=300 used=300 ...".
func (r RingState) String() string {
	return fmt.Sprintf("q%d size=%d avail=%d used=%d outstanding=%d avail_flags=%#x used_flags=%#x used_event=%d avail_event=%d",
		r.Queue, r.Size, r.AvailIdx, r.UsedIdx, uint16(r.AvailIdx-r.UsedIdx), r.AvailFlags, r.UsedFlags, r.UsedEvent, r.AvailEvent)
}

// TransportState is an inspection of a virtio-mmio transport (MMIO.Inspect).
type TransportState struct {
	Device string
	// Status is the device status byte as the driver reads it;
	// InterruptStatus the bits raised and not yet acknowledged.
	Status, InterruptStatus uint32
	Active                  bool
	// Rings are the ready queues' rings (none while not active).
	Rings []RingState
	// Err is set when a ring's address no longer lies in guest memory.
	Err error
}

// String is a multi-line description, one ring per line.
func (s TransportState) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s status=%#x interrupt_status=%#x active=%v", s.Device, s.Status, s.InterruptStatus, s.Active)
	for _, r := range s.Rings {
		b.WriteString("\n  ")
		b.WriteString(r.String())
	}
	if s.Err != nil {
		fmt.Fprintf(&b, "\n  error: %v", s.Err)
	}
	return b.String()
}

// Inspect returns the transport's state. Safe from any goroutine; it takes
// the register lock and the interrupt lock, one after the other, briefly.
func (t *MMIO) Inspect() TransportState {
	t.mu.Lock()
	s := TransportState{Device: deviceName(t.dev.Type()), Status: t.statusLocked(), Active: t.active}
	var regs []queueRegs
	if t.active {
		regs = append(regs, t.queues...)
	}
	t.mu.Unlock()
	t.irqMu.Lock()
	s.InterruptStatus = t.intStatus
	t.irqMu.Unlock()
	for i, q := range regs {
		if !q.ready {
			continue
		}
		r, err := inspectRing(t, i, q)
		if err != nil {
			s.Err = err
			break
		}
		s.Rings = append(s.Rings, r)
	}
	return s
}

// inspectRing reads queue i's ring fields from guest memory (virtio 1.2,
// 2.7.6 and 2.7.8: flags, idx, ring[size], then the event field).
func inspectRing(t *MMIO, i int, q queueRegs) (RingState, error) {
	r := RingState{Queue: i, Size: q.size}
	n := uint64(q.size)
	fields := []struct {
		gpa uint64
		v   *uint16
	}{
		{q.avail, &r.AvailFlags}, {q.avail + 2, &r.AvailIdx}, {q.avail + 4 + 2*n, &r.UsedEvent},
		{q.used, &r.UsedFlags}, {q.used + 2, &r.UsedIdx}, {q.used + 4 + usedElemSize*n, &r.AvailEvent},
	}
	for _, f := range fields {
		v, err := t.mem.Load16Acquire(f.gpa)
		if err != nil {
			return r, fmt.Errorf("queue %d at %#x: %w", i, f.gpa, err)
		}
		*f.v = v
	}
	return r, nil
}
