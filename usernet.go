//go:build !microvm_lean

package microvm

import (
	"fmt"

	"github.com/microvm/microvm/devices/virtionet"
	"github.com/microvm/microvm/devices/virtionet/usernet"
)

// userNet starts the machine's user-mode network and returns a virtio-net
// device on it (NetConfig.User). Closing the machine closes the device,
// then the network.
func (m *Machine) userNet(cfg virtionet.Config, publish []virtionet.Publish) (*virtionet.Device, error) {
	if cfg.MAC == nil {
		mac, err := virtionet.RandomMAC()
		if err != nil {
			return nil, err
		}
		cfg.MAC = mac
	}
	n, err := usernet.New(usernet.Config{GuestMAC: cfg.MAC, Publish: publish, Log: cfg.Log})
	if err != nil {
		return nil, fmt.Errorf("net: %w", err)
	}
	m.vm.OnClose(n.Close) // runs after the device's Close: OnClose is last in, first out
	fd, err := n.TakeDeviceFD()
	if err != nil {
		return nil, err
	}
	return virtionet.NewSocket(cfg, fd)
}
