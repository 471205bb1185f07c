// Package agentguest is what the benchmarks that boot the image `microvm
// exec` boots (bench/exec, bench/snapshot) share: writing that image (the
// agent as /init, busybox; package guest/agentimage), the vsock port the
// agent listens on, the kernel command line, and telling whether a
// machine's Run goroutine has returned.
package agentguest

import (
	"fmt"
	"os"

	"github.com/microvm/microvm/guest/agentimage"
)

const (
	// AgentPort is the vsock port microvm-agent listens on by default.
	AgentPort = 1024
	// Cmdline is `microvm exec`'s: quiet, so that the serial console, an
	// exit per byte, does not dominate the boot.
	Cmdline = "console=ttyS0 reboot=k panic=-1 quiet"
)

// WriteImage writes the guest image (the agent as /init, busybox) to path.
func WriteImage(path, agentBin, busybox string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	err = agentimage.Build(f, agentimage.Options{Agent: agentBin, Busybox: busybox})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("guest image: %w", err)
	}
	return nil
}

// Ended reports whether done, which the goroutine that runs a machine
// closes when Machine.Run returns, is closed. It does not block.
func Ended(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}
