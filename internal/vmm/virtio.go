package vmm

import (
	"errors"
	"fmt"
	"sync"

	"github.com/microvm/microvm/kvm"
	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/virtio"
)

// virtio-mmio slots (docs/machine.md): 4 KiB windows from 0xd0000000, each
// with its own edge-triggered IRQ.
const (
	virtioMMIOBase = 0xd000_0000
	virtioFirstIRQ = 5
	// VirtioSlots is how many virtio-mmio devices a machine can have.
	VirtioSlots = 8
)

// virtioSlot is one virtio-mmio device on the bus.
type virtioSlot struct {
	base uint64
	irq  uint32
	t    *virtio.MMIO // its transport (snapshots quiesce, save and restore it)
}

// AddVirtio puts dev in the next virtio-mmio slot: register window on the
// MMIO bus, an irqfd for its interrupt, and, once the driver first starts
// the device, one ioeventfd per queue it uses on QueueNotify (datamatch =
// queue index) so a kick never exits to a vCPU goroutine. The slot's place
// on the command line and in the ACPI tables follows from it (Boot). It returns the device's transport (for its
// counters); Close closes the transport.
func (m *Machine) AddVirtio(dev virtio.Device) (*virtio.MMIO, error) {
	n := len(m.slots)
	if n >= VirtioSlots {
		return nil, fmt.Errorf("%w: too many virtio devices (at most %d)", ErrConfig, VirtioSlots)
	}
	slot := virtioSlot{base: virtioMMIOBase + uint64(n)*virtio.MMIOSize, irq: uint32(virtioFirstIRQ + n)}
	irq, err := eventfd.New()
	if err != nil {
		return nil, err
	}
	m.closers = append(m.closers, irq.Close)
	if err := m.registerIRQFD(irq.FD(), slot.irq); err != nil {
		return nil, err
	}
	raise := func() {
		_ = irq.Signal()
		m.pvwait.Notify()
	}
	log := m.log.WithField("device", fmt.Sprintf("virtio-mmio@%#x", slot.base))
	t, err := virtio.NewMMIO(dev, m.mem, raise, log)
	if err != nil {
		return nil, err
	}
	m.closers = append(m.closers, t.Close)
	kicks := &ioEventFDs{vm: m.vm, addr: slot.base + virtio.RegQueueNotify}
	t.BindKicks(kicks.register)
	// Unregistered before the transport closes the eventfds (closers run
	// in reverse): see registerIRQFD.
	m.closers = append(m.closers, kicks.close)
	if err := m.mmio.Register(slot.base, virtio.MMIOSize, "virtio-mmio", t); err != nil {
		return nil, err
	}
	slot.t = t
	m.slots = append(m.slots, slot)
	return t, nil
}

// ioEventFDs are the ioeventfds of one virtio-mmio slot's QueueNotify
// register. register runs on a vCPU goroutine (the transport's BindKicks),
// close on the goroutine closing the Machine, after the vCPUs stopped or
// not: mu orders them, and nothing registers after close.
type ioEventFDs struct {
	vm   *kvm.VM
	addr uint64

	mu     sync.Mutex
	fds    []kvm.IOEventFD
	closed bool
}

func (s *ioEventFDs) register(queue int, kick *eventfd.EventFD) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("queue %d: the machine is closing", queue)
	}
	dm := uint64(queue)
	e := kvm.IOEventFD{FD: kick.FD(), Addr: s.addr, Len: 4, Datamatch: &dm}
	if err := s.vm.RegisterIOEventFD(e); err != nil {
		return fmt.Errorf("queue %d: %w", queue, err)
	}
	s.fds = append(s.fds, e)
	return nil
}

func (s *ioEventFDs) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	var errs []error
	for _, e := range s.fds {
		errs = append(errs, s.vm.UnregisterIOEventFD(e))
	}
	s.fds = nil
	return errors.Join(errs...)
}

// virtioCmdline returns the virtio_mmio.device= entries for the kernel
// command line, in the syntax of Linux's virtio_mmio.device parameter.
func (m *Machine) virtioCmdline() []string {
	var out []string
	for _, s := range m.slots {
		out = append(out, fmt.Sprintf("virtio_mmio.device=%dK@%#x:%d", virtio.MMIOSize>>10, s.base, s.irq))
	}
	return out
}

// registerIRQFD binds eventfd efd to gsi and has Close unbind it before the
// eventfd is closed (OnClose order: the caller registered the eventfd's
// Close first). Unbinding irqfds and ioeventfds one by one before the VM
// is closed, rather than leaving them to the VM's destruction, takes 6-12
// ms off every machine's teardown on the hosts measured (docs/benchmarks.md,
// "Start-up").
func (m *Machine) registerIRQFD(efd int, gsi uint32) error {
	if err := m.vm.RegisterIRQFD(efd, gsi); err != nil {
		return err
	}
	m.closers = append(m.closers, func() error { return m.vm.UnregisterIRQFD(efd, gsi) })
	return nil
}
