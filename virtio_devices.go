package microvm

import (
	"fmt"

	"github.com/microvm/microvm/devices/blk"
	"github.com/microvm/microvm/devices/rng"
	"github.com/microvm/microvm/kvm"
	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/vsock"
)

// virtio-mmio slots (docs/machine.md): 4 KiB windows from 0xd0000000, each
// with its own edge-triggered IRQ.
const (
	virtioMMIOBase = 0xd000_0000
	virtioFirstIRQ = 5
	virtioMaxSlots = 8
)

// virtioSlot is one virtio-mmio device on the bus.
type virtioSlot struct {
	base uint64
	irq  uint32
}

// addVirtio puts dev in the next virtio-mmio slot: register window on the
// MMIO bus, an irqfd for its interrupt, and one ioeventfd per queue on
// QueueNotify (datamatch = queue index) so a kick never exits to a vCPU
// goroutine. It returns the device's transport (for its counters).
func (m *Machine) addVirtio(dev virtio.Device) (*virtio.MMIO, error) {
	n := len(m.virtio)
	if n >= virtioMaxSlots {
		return nil, fmt.Errorf("too many virtio devices (at most %d)", virtioMaxSlots)
	}
	slot := &virtioSlot{base: virtioMMIOBase + uint64(n)*virtio.MMIOSize, irq: uint32(virtioFirstIRQ + n)}
	irq, err := eventfd.New()
	if err != nil {
		return nil, err
	}
	m.closers = append(m.closers, irq.Close)
	if err := m.vm.RegisterIRQFD(irq.FD(), slot.irq); err != nil {
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
	for i, k := range t.KickFDs() {
		dm := uint64(i)
		e := kvm.IOEventFD{FD: k.FD(), Addr: slot.base + virtio.RegQueueNotify, Len: 4, Datamatch: &dm}
		if err := m.vm.RegisterIOEventFD(e); err != nil {
			return nil, err
		}
	}
	if err := m.mmio.Register(slot.base, virtio.MMIOSize, "virtio-mmio", t); err != nil {
		return nil, err
	}
	m.virtio = append(m.virtio, slot)
	return t, nil
}

// setupVirtio creates the configured virtio devices, in slot order: vsock,
// rng, the disks, then the network devices (docs/machine.md).
func (m *Machine) setupVirtio() error {
	if err := m.setupVsock(); err != nil {
		return err
	}
	if rc := m.cfg.RNG; rc != nil {
		dev, err := rng.New(rng.Config{Rate: rc.Rate, Log: m.log.WithField("device", "rng")})
		if err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
		m.rng = dev
		m.closers = append(m.closers, func() error { dev.Close(); return nil })
		if m.rngMMIO, err = m.addVirtio(dev); err != nil {
			return err
		}
	}
	for i, dc := range m.cfg.Disks {
		dev, err := blk.Open(blk.Config{Path: dc.Path, ReadOnly: dc.ReadOnly, Serial: dc.Serial,
			Log: m.log.WithField("device", diskName(i))})
		if err != nil {
			return err
		}
		m.disks = append(m.disks, dev)
		m.closers = append(m.closers, dev.Close)
		t, err := m.addVirtio(dev)
		if err != nil {
			return err
		}
		m.diskMMIO = append(m.diskMMIO, t)
	}
	return m.setupNets()
}

// setupVsock creates the vsock device and its host socket, if configured.
func (m *Machine) setupVsock() error {
	vc := m.cfg.Vsock
	if vc == nil {
		return nil
	}
	if err := vsock.CheckUDSPath(vc.UDSPath); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	// Guest connections go to ListenVsock listeners, else to UDSPath_<port>.
	// Registered before the device, the router is closed after it.
	router := newVsockRouter(vc.CID, vsock.UDSDialer{Path: vc.UDSPath})
	m.vsockRouter = router
	m.closers = append(m.closers, func() error { router.closeAll(); return nil })
	dev, err := vsock.New(vsock.Config{
		CID:            vc.CID,
		MaxConns:       vc.MaxConnections,
		ConnBuffer:     uint32(vc.ConnBuffer),
		MaxBuffered:    vc.BufferTotal,
		ConnectTimeout: vc.ConnectTimeout,
		Dialer:         router,
		Options:        vc.Options,
		Dgram:          vc.Dgram,
		DgramUDS:       vc.UDSPath,
		Log:            m.log.WithField("device", "vsock"),
	})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	m.vsock = dev
	m.closers = append(m.closers, func() error { dev.Close(); return nil })
	if m.vsockMMIO, err = m.addVirtio(dev); err != nil {
		return err
	}
	uds, err := vsock.ListenUDS(vc.UDSPath, dev, vc.ConnectTimeout, m.log.WithField("device", "vsock-uds"))
	if err != nil {
		return err
	}
	m.uds = uds
	m.closers = append(m.closers, func() error {
		// The device first: host clients still waiting for the guest
		// driver are released at once instead of at their deadline.
		dev.Close()
		return uds.Close()
	})
	return nil
}

// virtioCmdline returns the virtio_mmio.device= entries for the kernel
// command line, in the syntax of Linux's virtio_mmio.device parameter.
func (m *Machine) virtioCmdline() []string {
	var out []string
	for _, s := range m.virtio {
		out = append(out, fmt.Sprintf("virtio_mmio.device=%dK@%#x:%d", virtio.MMIOSize>>10, s.base, s.irq))
	}
	return out
}

// startDevices starts device goroutines that serve the host side.
func (m *Machine) startDevices() {
	if m.uds != nil {
		go m.uds.Serve()
	}
}

// VsockStats returns the vsock device's counters (zero without one).
func (m *Machine) VsockStats() vsock.Stats {
	if m.vsock == nil {
		return vsock.Stats{}
	}
	return m.vsock.Stats()
}

// DiskStats returns the counters of disk i (Config.Disks[i]); zero when
// there is no such disk.
func (m *Machine) DiskStats(i int) blk.Stats {
	if i < 0 || i >= len(m.disks) {
		return blk.Stats{}
	}
	return m.disks[i].Stats()
}

// RNGStats returns the rng device's counters (zero without one).
func (m *Machine) RNGStats() rng.Stats {
	if m.rng == nil {
		return rng.Stats{}
	}
	return m.rng.Stats()
}
