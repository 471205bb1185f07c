package containerdshim

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/microvm/microvm/guest/agentapi"
)

// container is one container of the VM: its bundle, its root file system
// and its processes (the init process and the execs). The Service's mu
// guards the execs map; each process guards its own state.
type container struct {
	id     string
	bundle string
	rootfs *rootfs
	init   *process
	execs  map[string]*process
	// seccomp is the spec's profile compiled (nil: none), for the init
	// and every exec.
	seccomp *agentapi.SeccompFilter
}

// process finds the container's init process ("") or one of its execs.
func (c *container) process(execID string) (*process, error) {
	if execID == "" {
		return c.init, nil
	}
	p := c.execs[execID]
	if p == nil {
		return nil, fmt.Errorf("%w: exec %q of container %q", errdefs.ErrNotFound, execID, c.id)
	}
	return p, nil
}

// all is every process of the container, init first.
func (c *container) all() []*process {
	ps := []*process{c.init}
	for _, p := range c.execs {
		ps = append(ps, p)
	}
	return ps
}

// readSpec reads BUNDLE/config.json.
func readSpec(bundle string) (*specs.Spec, error) {
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("%w: bundle: %w", errdefs.ErrInvalidArgument, err)
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("%w: bundle: config.json: %w", errdefs.ErrInvalidArgument, err)
	}
	return &s, nil
}
