package agentapi

import (
	"context"
	"net"
)

// MACAdopter is a restored machine whose network devices may have MAC
// addresses its guest does not use yet: a *microvm.Machine, whose
// AdoptMACs calls set for each device its restore gave a new address
// (Machine.MACChanges) that no earlier call set, in device order, and
// stops at set's first error.
type MACAdopter interface {
	AdoptMACs(ctx context.Context, set func(ctx context.Context, old, mac net.HardwareAddr) error) error
}

// AdoptMACs has the agent on cc take each MAC address vm's restore changed:
// SetMAC moves the guest's interface from the snapshot's address to the
// clone's own and announces it (docs/snapshot.md, "Clone identity"). Call
// it once the agent answers (ConnectVM) and before the clone talks on its
// network; a machine without changes, or one whose changes an earlier call
// applied, costs nothing.
func AdoptMACs(ctx context.Context, vm MACAdopter, cc *Conn) error {
	c := NewClient(cc)
	return vm.AdoptMACs(ctx, func(ctx context.Context, old, mac net.HardwareAddr) error {
		_, err := c.SetMAC(ctx, old, mac)
		return err
	})
}
