package main

// `microvm run --name NAME --docker`: Docker in a long-lived VM. The data
// disk is a sparse ext4 file in the VM's state directory (dockerDiskFile),
// made once the VM's process holds the name and removed with the
// directory (microvm rm); dockervm.Start runs as the launch's setup, once
// the agent answers and before the main process (namedvm.Launch.Setup), so
// that the main process and exec --vm find dockerd answering.

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/agentvm"
	"github.com/microvm/microvm/internal/clibase"
	"github.com/microvm/microvm/internal/dockervm"
	"github.com/microvm/microvm/internal/execvm"
	"github.com/microvm/microvm/internal/namedvm"
	"github.com/microvm/microvm/internal/vms"
)

// dockerDiskFile is run --docker's data disk, in the VM's state directory.
const dockerDiskFile = "docker.ext4"

// dockerDiskPath is where the VM name keeps its Docker data disk.
func dockerDiskPath(name string) (string, error) {
	store, err := vms.Open(vms.StateDir())
	if err != nil {
		return "", err
	}
	return filepath.Join(store.Dir(name), dockerDiskFile), nil
}

// dockerLaunch is l with run --docker's data disk, at path and already in
// l's configuration and record, made before the machine is built, and
// Docker started with env (the image's environment) as its setup.
func dockerLaunch(l namedvm.Launch, path string, d *execvm.Docker, env []string) namedvm.Launch {
	size := d.DiskSize
	if size == 0 {
		size = dockervm.DefaultDiskSize
	}
	build := l.Build
	l.Build = func(host microvm.Config) (*microvm.Machine, error) {
		// The VM's process holds the name now, and its directory.
		if _, err := dockervm.CreateDisk(context.Background(), path, size); err != nil {
			return nil, clibase.Failure{Err: fmt.Errorf("run: %w", err)}
		}
		return build(host)
	}
	start := d.Start
	l.Setup = func(ctx context.Context, c *agentapi.Client) error {
		return dockervm.Start(ctx, agentvm.AgentRunner{Client: c, Env: env}, start)
	}
	l.SetupStatus = dockervm.ExitStatus
	return l
}

// dockerEnv is the environment Docker's start runs with: the main
// process's, else the image's, else the agent's own (nil).
func dockerEnv(img imageOpts) []string {
	switch {
	case img.main != nil:
		return img.main.env
	case img.root != nil:
		return img.root.Config.Env
	}
	return nil
}
