package virtio

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Saved state of the virtio-mmio transport (snapshots; the
// package doc traces the sequence). The conventions are those of package
// devices (devices/state.go): plain data with exported fields, encoded
// with encoding/json, field names as the format's version; RestoreState
// checks every field before it changes anything and refuses with an error
// wrapping ErrBadState.

// Quiescer is a Device that can stop its session for a pause without
// dropping work, so that MMIO.Quiesce can save its queues' positions and
// MMIO.Resume or a restore can start a session at them. Devices that do
// not implement it cannot be snapshotted while their driver runs them
// (ErrNoQuiesce).
//
// The contract: when Quiesce returns, no goroutine of the device touches
// its queues or guest memory, and every chain its session popped has been
// either returned (pushed, published with Queue.Publish, and notified with
// ActiveQueue.Notify, as after normal completion) or put back with
// Queue.Undo; so each queue's LastAvail equals NextUsed, and the used
// index in guest memory equals both. In-flight work is finished, not
// abandoned: blk completes the I/O of each request it holds and pushes its
// status (where its Reset pushes nothing, the driver being about to tear
// the rings down); a device that holds buffers until the host has
// something for them (an RX queue) puts them back. Failing the contract is
// reported (ErrNotDrained) and the state cannot be saved. Everything else
// the device keeps (not its session) stays: Quiesce is not Reset, and the
// next Activate continues where the session stopped. Lifecycle.Quiesce with
// a Drainer session implements this. MMIO calls Quiesce with its mutex
// held, as it does Reset.
//
// A session started by an Activation must look at its rings before it
// waits for a kick: the transport kicks each queue once after a resumed or
// restored activation, but a device should not rely on a kick for buffers
// posted while its notifications were suppressed.
type Quiescer interface {
	Device
	Quiesce()
}

// StatefulDevice is a Device with state of its own that a snapshot must
// carry (a configuration space the driver writes, host-side state the
// driver relies on). The transport saves it in MMIOState.Device and hands
// it back on restore, before activation.
//
// The state is the device's own JSON (json.RawMessage) rather than a value
// of an interface type: only the device knows its concrete state type, so
// only it can decode it (a value decoded by the transport into an
// interface would come back as map[string]any), and it checks it there,
// as devices' RestoreState do. The raw message is embedded verbatim in
// the transport's JSON, so the snapshot stays one readable document.
type StatefulDevice interface {
	Device
	// SaveDeviceState returns the device's state. It is called after
	// Quiesce, with the transport's mutex held.
	SaveDeviceState() (json.RawMessage, error)
	// RestoreDeviceState makes the device's state st, or returns an
	// error wrapping ErrBadState and changes nothing. st is nil when the
	// snapshot has none (it was taken before the device had state): the
	// device then keeps or assumes its defaults. It is called on a device
	// that was never activated, before the transport activates it.
	RestoreDeviceState(st json.RawMessage) error
}

var (
	// ErrBadState is wrapped by every error of RestoreState that refuses
	// a state the transport or its device cannot be in. (It is package
	// devices's ErrBadState for virtio; virtio does not import devices.)
	ErrBadState = errors.New("invalid saved virtio state")
	// ErrNoQuiesce: the device does not implement Quiescer.
	ErrNoQuiesce = errors.New("device cannot be quiesced")
	// ErrNotQuiesced: SaveState was called while the device's session
	// runs.
	ErrNotQuiesced = errors.New("device not quiesced")
	// ErrNotDrained: a quiesced device left a chain popped and not
	// returned, or pushed and not published (it broke the Quiescer
	// contract), or the driver overwrote the used index.
	ErrNotDrained = errors.New("queue not drained")
)

// MMIOState is the saved state of a virtio-mmio transport: the registers
// the driver set and each queue's position.
type MMIOState struct {
	// DeviceType is the virtio device id; restore checks it.
	DeviceType uint32
	// Status is the device status as the driver reads it,
	// DEVICE_NEEDS_RESET included.
	Status uint32
	// DeviceFeaturesSel and DriverFeaturesSel select the features word
	// the driver reads or writes next.
	DeviceFeaturesSel, DriverFeaturesSel uint32
	// DriverFeatures are the features the driver wrote (accepted, once
	// FEATURES_OK is set).
	DriverFeatures uint64
	// QueueSel is the selected queue (any value the driver wrote).
	QueueSel uint32
	// ConfigGeneration is the configuration generation register.
	ConfigGeneration uint32
	// InterruptStatus holds the interrupt bits the driver has not
	// acknowledged (IntUsedBuffer, IntConfigChange).
	InterruptStatus uint32
	// Queues has one entry per queue the device has.
	Queues []MMIOQueueState
	// Device is the device's own state (StatefulDevice), absent for a
	// device without one.
	Device json.RawMessage `json:",omitempty"`
}

// MMIOQueueState is one queue of MMIOState: its registers and, for a
// queue the device was running, its position.
type MMIOQueueState struct {
	// Size is the queue size the driver set (0 until it sets one or
	// enables the queue).
	Size uint16
	// Ready is the QueueReady register.
	Ready bool
	// Desc, Avail and Used are the guest-physical addresses of the
	// descriptor table, the available ring and the used ring.
	Desc, Avail, Used uint64
	// NextAvail is the next available-ring entry the device will take
	// (Queue.LastAvail); UsedIdx the used index the device has published
	// (Queue.NextUsed, and the used ring's idx in guest memory). Both
	// are 0 unless the queue is live: ready, with DRIVER_OK set and
	// DEVICE_NEEDS_RESET not. For a live queue they are equal (nothing
	// is in flight across a snapshot; Quiescer); both are saved so that
	// restore can check the state against the rings in guest memory.
	NextAvail, UsedIdx uint16
}

// Quiesce stops the device's session without resetting what the driver
// sees: status, features, queue configuration and ring positions stay, so
// that SaveState can save them and Resume (or RestoreState in a new
// transport) can start a session where this one stopped. The device
// finishes or puts back its in-flight chains first (Quiescer). Call with
// the vCPUs stopped; it returns once the device's workers have. It does
// nothing when no session runs. An error wrapping ErrNoQuiesce leaves the
// device running; one wrapping ErrNotDrained leaves it quiesced (Resume
// still works, SaveState refuses).
func (t *MMIO) Quiesce() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.active {
		return nil
	}
	qd, ok := t.dev.(Quiescer)
	if !ok {
		return fmt.Errorf("virtio-mmio: %s device: %w", deviceName(t.dev.Type()), ErrNoQuiesce)
	}
	qd.Quiesce()
	// The stopped session's Fail is inert from here (activate).
	t.activations.Add(1)
	t.active, t.quiesced = false, true
	if t.needsReset.Load() {
		return nil // its positions do not matter: the driver must reset
	}
	for i, q := range t.live {
		if q == nil {
			continue
		}
		if _, err := drainedUsedIdx(t, i, q); err != nil {
			return err
		}
	}
	return nil
}

// drainedUsedIdx returns queue i's used index after checking the Quiescer
// contract: nothing popped and not pushed, nothing pushed and not
// published.
func drainedUsedIdx(t *MMIO, i int, q *Queue) (uint16, error) {
	if n := q.LastAvail() - q.NextUsed(); n != 0 {
		return 0, fmt.Errorf("virtio-mmio: queue %d: %d chains popped and not returned: %w", i, n, ErrNotDrained)
	}
	used, err := t.mem.Load16Acquire(q.Config().Used + 2)
	if err != nil {
		return 0, fmt.Errorf("virtio-mmio: queue %d: used index: %w", i, err)
	}
	if used != q.NextUsed() {
		return 0, fmt.Errorf("virtio-mmio: queue %d: used index in the ring is %d, the device pushed up to %d: %w",
			i, used, q.NextUsed(), ErrNotDrained)
	}
	return used, nil
}

// Resume restarts a quiesced device's session with its queues where the
// last one left them, re-kicking each queue once. It does nothing unless
// Quiesce stopped the session, nor while DEVICE_NEEDS_RESET is set (the
// driver must reset the device anyway). An activation error sets
// DEVICE_NEEDS_RESET, as at DRIVER_OK, and is returned.
func (t *MMIO) Resume() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.quiesced || t.needsReset.Load() {
		return nil
	}
	at := make([]uint16, len(t.live))
	for i, q := range t.live {
		if q != nil {
			at[i] = q.LastAvail()
		}
	}
	if err := t.activate(at); err != nil {
		t.Fail(err)
		return err
	}
	return nil
}

// SaveState returns the transport's state and, for a StatefulDevice, the
// device's. The device must not be running: call Quiesce first (an error
// wraps ErrNotQuiesced otherwise, or ErrNotDrained when the device broke
// the Quiescer contract). It changes nothing; Resume may follow.
func (t *MMIO) SaveState() (MMIOState, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.active {
		return MMIOState{}, fmt.Errorf("virtio-mmio: save %s device: %w", deviceName(t.dev.Type()), ErrNotQuiesced)
	}
	t.irqMu.Lock()
	intStatus := t.intStatus
	t.irqMu.Unlock()
	s := MMIOState{
		DeviceType: t.dev.Type(), Status: t.statusLocked(),
		DeviceFeaturesSel: t.devFeatSel, DriverFeaturesSel: t.drvFeatSel, DriverFeatures: t.drvFeat,
		QueueSel: t.queueSel, ConfigGeneration: t.configGen, InterruptStatus: intStatus,
		Queues: make([]MMIOQueueState, len(t.queues)),
	}
	live := t.quiesced && !t.needsReset.Load()
	for i, r := range t.queues {
		qs := MMIOQueueState{Size: r.size, Ready: r.ready, Desc: r.desc, Avail: r.avail, Used: r.used}
		if live && r.ready {
			if i >= len(t.live) || t.live[i] == nil {
				panic(fmt.Sprintf("virtio-mmio: queue %d ready at DRIVER_OK but never activated", i))
			}
			used, err := drainedUsedIdx(t, i, t.live[i])
			if err != nil {
				return MMIOState{}, err
			}
			qs.NextAvail, qs.UsedIdx = t.live[i].LastAvail(), used
		}
		s.Queues[i] = qs
	}
	if sd, ok := t.dev.(StatefulDevice); ok {
		st, err := sd.SaveDeviceState()
		if err != nil {
			return MMIOState{}, fmt.Errorf("virtio-mmio: save %s device state: %w", deviceName(t.dev.Type()), err)
		}
		s.Device = st
	}
	return s, nil
}

// ErrInUse is returned by RestoreState on a transport the driver has
// started using.
var ErrInUse = errors.New("transport in use")

// RestoreState makes a fresh transport (nothing written since NewMMIO,
// BindKicks aside, which should come first) the one s was saved from,
// over guest memory holding the snapshot's contents. It checks every field
// first, against the device and the rings in guest memory, and refuses a
// state the transport could not be in with an error wrapping ErrBadState,
// changing nothing. It then restores the device's own state
// (StatefulDevice), the registers, and, when the saved status has
// DRIVER_OK and not DEVICE_NEEDS_RESET, activates the device with each
// ready queue at its saved position, binding and kicking the queues as
// Resume does; last, it raises the interrupt again if one was pending.
// Call it before the vCPUs run. An activation error (from the host side)
// leaves the transport reset and is returned.
func (t *MMIO) RestoreState(s MMIOState) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	name := deviceName(t.dev.Type())
	if t.status != 0 || t.active || t.quiesced || t.needsReset.Load() {
		return fmt.Errorf("virtio-mmio: restore %s device: %w", name, ErrInUse)
	}
	if err := t.checkState(s); err != nil {
		return fmt.Errorf("virtio-mmio: restore %s device: %w: %w", name, ErrBadState, err)
	}
	if sd, ok := t.dev.(StatefulDevice); ok {
		if err := sd.RestoreDeviceState(s.Device); err != nil {
			return fmt.Errorf("virtio-mmio: restore %s device state: %w", name, err)
		}
	}
	t.status = s.Status &^ StatusNeedsReset
	t.devFeatSel, t.drvFeatSel, t.drvFeat = s.DeviceFeaturesSel, s.DriverFeaturesSel, s.DriverFeatures
	t.queueSel, t.configGen = s.QueueSel, s.ConfigGeneration
	for i, q := range s.Queues {
		t.queues[i] = queueRegs{size: q.Size, ready: q.Ready, desc: q.Desc, avail: q.Avail, used: q.Used}
	}
	t.needsReset.Store(s.Status&StatusNeedsReset != 0)
	if s.Status&StatusDriverOK != 0 {
		t.quiesced = true // stays so (no session) under NEEDS_RESET
		if !t.needsReset.Load() {
			at := make([]uint16, len(s.Queues))
			for i, q := range s.Queues {
				at[i] = q.NextAvail
			}
			if err := t.activate(at); err != nil {
				t.reset()
				return fmt.Errorf("virtio-mmio: restore: %w", err)
			}
		}
	}
	if s.InterruptStatus != 0 {
		t.irqMu.Lock()
		t.intStatus = s.InterruptStatus
		t.irqMu.Unlock()
		t.raise()
	}
	return nil
}

// initSteps are the driver-written status values the initialisation
// sequence passes through (statusTable), FAILED aside.
var initSteps = func() map[uint32]bool {
	m := map[uint32]bool{0: true}
	for _, s := range statusTable {
		m[s.to] = true
	}
	return m
}()

// checkState returns why s is not a state this transport could be in, or
// nil.
func (t *MMIO) checkState(s MMIOState) error {
	if s.DeviceType != t.dev.Type() {
		return fmt.Errorf("saved from a %s device", deviceName(s.DeviceType))
	}
	st := s.Status &^ (StatusNeedsReset | StatusFailed)
	if !initSteps[st] {
		return fmt.Errorf("status %#x (%s) is not a step of the initialisation sequence", s.Status, StatusString(s.Status))
	}
	const featuresOK = StatusAcknowledge | StatusDriver | StatusFeaturesOK
	switch {
	case st&StatusFeaturesOK != 0:
		if offered := t.dev.Features() | QueueFeatures; s.DriverFeatures&^offered != 0 {
			return fmt.Errorf("driver features %#x include %#x, which the device does not offer",
				s.DriverFeatures, s.DriverFeatures&^offered)
		}
		if s.DriverFeatures&FeatureVersion1 == 0 {
			return fmt.Errorf("driver features %#x lack VIRTIO_F_VERSION_1 after FEATURES_OK", s.DriverFeatures)
		}
	case st != StatusAcknowledge|StatusDriver && s.DriverFeatures != 0:
		// Only status ACKNOWLEDGE|DRIVER takes feature writes.
		return fmt.Errorf("driver features %#x in status %s", s.DriverFeatures, StatusString(s.Status))
	}
	if s.InterruptStatus&^(IntUsedBuffer|IntConfigChange) != 0 {
		return fmt.Errorf("interrupt status %#x has unknown bits", s.InterruptStatus)
	}
	sizes := t.dev.QueueSizes()
	if len(s.Queues) != len(sizes) {
		return fmt.Errorf("%d queues saved; the device has %d", len(s.Queues), len(sizes))
	}
	live := st&StatusDriverOK != 0 && s.Status&StatusNeedsReset == 0
	for i, q := range s.Queues {
		if err := t.checkQueue(q, sizes[i], st&featuresOK == featuresOK, live); err != nil {
			return fmt.Errorf("queue %d: %w", i, err)
		}
	}
	if _, ok := t.dev.(StatefulDevice); !ok && len(s.Device) != 0 && string(s.Device) != "null" {
		return errors.New("device state saved for a device that has none")
	}
	return nil
}

// checkQueue checks one saved queue of a device whose maximum size is
// maxSize:
// configurable says the status has reached FEATURES_OK (the only time the
// driver can set a queue up), live that the device runs its ready queues.
func (t *MMIO) checkQueue(q MMIOQueueState, maxSize uint16, configurable, live bool) error {
	if !configurable && q != (MMIOQueueState{}) {
		return errors.New("configured before FEATURES_OK")
	}
	if q.Size != 0 && (q.Size&(q.Size-1) != 0 || q.Size > maxSize) {
		return fmt.Errorf("size %d: want a power of two up to %d", q.Size, maxSize)
	}
	if !q.Ready || !live {
		if q.NextAvail != 0 || q.UsedIdx != 0 {
			return fmt.Errorf("ring positions %d/%d for a queue the device does not run", q.NextAvail, q.UsedIdx)
		}
	}
	if !q.Ready {
		return nil // the addresses are whatever the driver wrote, unused
	}
	cfg := QueueConfig{Size: q.Size, Desc: q.Desc, Avail: q.Avail, Used: q.Used}
	if err := cfg.Validate(t.mem, maxSize); err != nil {
		return err
	}
	if !live {
		return nil
	}
	if q.NextAvail != q.UsedIdx {
		return fmt.Errorf("%d chains in flight (next available %d, used index %d)", q.NextAvail-q.UsedIdx, q.NextAvail, q.UsedIdx)
	}
	// The device published UsedIdx last; the ring in guest memory must
	// say so (a snapshot whose memory does not match its state). The
	// available index is not checked: the driver may write anything
	// there at any time, and Pop reports that as a guest error when the
	// device next looks, as it would have without the snapshot.
	used, err := t.mem.Load16Acquire(q.Used + 2)
	if err != nil {
		return fmt.Errorf("used index: %w", err)
	}
	if used != q.UsedIdx {
		return fmt.Errorf("used index %d saved; the used ring in guest memory has %d", q.UsedIdx, used)
	}
	return nil
}
