// Command containerd-shim-microvm-v2 is microvm's containerd runtime
// (io.containerd.microvm.v2): containerd starts it per pod, and it runs the
// pod's containers in a microVM. docs/containerd.md says how to install
// and configure it; internal/containerdshim is the shim.
package main

import (
	"context"

	"github.com/containerd/containerd/runtime/v2/shim"

	"github.com/microvm/microvm/internal/containerdshim"
)

func main() {
	containerdshim.Register()
	// No reaper: the shim waits for its own children (mkfs.ext4) with
	// os/exec, and a reaper would take their exit statuses first.
	shim.RunManager(context.Background(), containerdshim.Manager{}, func(c *shim.Config) {
		c.NoReaper = true
		c.NoSubreaper = true
	})
}
