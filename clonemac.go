package microvm

import (
	"context"
	"fmt"
	"net"
	"slices"
)

// A clone's own MAC addresses (docs/snapshot.md, "Clone identity").
// Restore given a MAC for a network device that differs from the
// snapshot's gives the device the new one, but the guest's driver read the
// old one when it probed and goes on using it: until the guest is told,
// two clones of one snapshot on one network would answer for one address.
// Restore records each such device (MACChanges); AdoptMACs walks them
// through a setter the caller supplies (agentapi.AdoptMACs: the guest
// agent's SetMAC), which moves the guest's interface to the new address
// and announces it. This package only keeps the list and what was applied:
// it does not speak to the agent, whose gRPC client the embedding API does
// not link.

// MACChange is a network device of a restored machine whose MAC the
// restore changed (Restore given Config.Nets[i].MAC): a clone's own
// address.
type MACChange struct {
	Net int              // the device's index in Config.Nets
	Old net.HardwareAddr // the snapshot's: the address the guest's driver still uses
	New net.HardwareAddr // the device's, which the guest should take
}

// MACChanges lists the network devices whose MAC the restore changed; nil
// for a booted machine, or one restored with the snapshot's MACs. Linux
// reads a virtio-net device's MAC only when its driver probes, so the
// guest goes on using Old until told: with the agent,
// agentapi.AdoptMACs (Machine.AdoptMACs with the agent's SetMAC), which
// moves each interface and announces it (the CLI does so for every clone
// it restores). The list stays whole once adopted.
func (m *Machine) MACChanges() []MACChange { return slices.Clone(m.macChanges) }

// AdoptMACs has the guest take each of MACChanges, in device order:
// set(ctx, c.Old, c.New) for each, which tells the guest (the agent's
// SetMAC: agentapi.AdoptMACs does that). It stops at the first error and
// returns it with the device's index and new MAC. Each change set applied
// is remembered, so a later call applies only those not yet applied: none
// once a call succeeded, the failed one onward after an error. Calls are
// serialized; nil at once for a machine without changes.
func (m *Machine) AdoptMACs(ctx context.Context, set func(ctx context.Context, old, mac net.HardwareAddr) error) error {
	m.macMu.Lock()
	defer m.macMu.Unlock()
	for ; m.macsAdopted < len(m.macChanges); m.macsAdopted++ {
		c := m.macChanges[m.macsAdopted]
		if err := set(ctx, c.Old, c.New); err != nil {
			return fmt.Errorf("network device %d: the clone's MAC %v: %w", c.Net, c.New, err)
		}
	}
	return nil
}
