package agentvm

import (
	"fmt"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/devices/virtionet"
)

// A clone's own MAC addresses (docs/snapshot.md, "Clone identity"). A
// restore that runs a clone of an agent VM (exec --snapshot, restore
// --name of a snapshot whose VM ran the agent) gives each network device
// a new random address (CloneNets); once the clone's agent answers, the
// agent moves the guest's interface to it and announces it
// (agentapi.AdoptMACs, the embedders' call too), before the clone is
// handed to a command or reported ready.

// CloneNets returns the network devices of a clone: given (restore's
// --net) or else one entry per saved device holding only a MAC, which
// Restore takes as the snapshot's device with that address (and refuses
// where the device names a host resource: a TAP, a namespace, a port
// published beyond loopback); each without a MAC of its own given gets a
// new random locally administered one; nil when there are none.
func CloneNets(given, saved []microvm.NetConfig) ([]microvm.NetConfig, error) {
	nets := append([]microvm.NetConfig(nil), given...)
	if given == nil {
		nets = make([]microvm.NetConfig, len(saved))
	}
	for i := range nets {
		if nets[i].MAC != nil {
			continue
		}
		mac, err := virtionet.RandomMAC()
		if err != nil {
			return nil, fmt.Errorf("a new MAC for the clone: %w", err)
		}
		nets[i].MAC = mac
	}
	if len(nets) == 0 {
		return nil, nil
	}
	return nets, nil
}
