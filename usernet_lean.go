//go:build microvm_lean

package microvm

import (
	"errors"

	"github.com/microvm/microvm/devices/virtionet"
)

// userNet: the lean build of the CLI does not link the user-mode network
// (gVisor's netstack); it hands runs that ask for one to microvm-full.
func (m *Machine) userNet(virtionet.Config, []virtionet.Publish) (*virtionet.Device, error) {
	return nil, errors.New("net: a user-mode network needs microvm-full (this is the lean build)")
}
