//go:build microvm_lean

package microvm

import (
	"errors"

	"github.com/microvm/microvm/devices/virtionet"
)

// userNet: the lean build of the CLI (bin/microvm) does not start
// microvm-net processes; it hands runs on a user-mode network to
// microvm-full, and keeps the process-spawning code off its start-up path.
func (m *Machine) userNet(virtionet.Config, NetConfig) (*virtionet.Device, error) {
	return nil, errors.New("net: a user-mode network needs microvm-full (this is the lean build)")
}
