package microvm

import (
	"fmt"
	"net"

	"github.com/microvm/microvm/devices/virtionet"
)

// MaxNets bounds Config.Nets: the virtio-mmio slots are shared with the
// other devices (docs/machine.md).
const MaxNets = 4

// NetConfig adds a virtio-net device on a host TAP interface
// (docs/net.md).
type NetConfig struct {
	// TAP is the host interface. microvm attaches to it, creating it when
	// it does not exist and microvm has CAP_NET_ADMIN; the host side's
	// address and link state are the caller's to set.
	TAP string
	// MAC is the guest's address; nil picks a random locally
	// administered one.
	MAC net.HardwareAddr
}

func (n *NetConfig) validate() error {
	if n.TAP == "" {
		return fmt.Errorf("%w: net: no TAP interface named", ErrConfig)
	}
	if len(n.TAP) >= 16 {
		return fmt.Errorf("%w: net: TAP name %q is longer than 15 bytes", ErrConfig, n.TAP)
	}
	if n.MAC != nil && (len(n.MAC) != 6 || n.MAC[0]&1 != 0) {
		return fmt.Errorf("%w: net %s: MAC %v is not a 6-byte unicast address", ErrConfig, n.TAP, n.MAC)
	}
	return nil
}

// setupNets adds one virtio-net device per Config.Nets entry, in order,
// after the vsock device.
func (m *Machine) setupNets() error {
	for i, nc := range m.cfg.Nets {
		dev, err := virtionet.New(virtionet.Config{
			TAP: nc.TAP, MAC: nc.MAC,
			Log: m.log.WithField("device", fmt.Sprintf("net%d", i)),
		})
		if err != nil {
			return err
		}
		m.nets = append(m.nets, dev)
		m.closers = append(m.closers, dev.Close)
		t, err := m.addVirtio(dev)
		if err != nil {
			return err
		}
		m.netMMIO = append(m.netMMIO, t)
	}
	return nil
}

// NetStats returns the counters of virtio-net device i (Config.Nets[i]).
func (m *Machine) NetStats(i int) virtionet.Stats {
	if i < 0 || i >= len(m.nets) {
		return virtionet.Stats{}
	}
	return m.nets[i].Stats()
}

// NetMAC returns the guest MAC address of virtio-net device i.
func (m *Machine) NetMAC(i int) net.HardwareAddr {
	if i < 0 || i >= len(m.nets) {
		return nil
	}
	return m.nets[i].MAC()
}
