package containerdshim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/pkg/shutdown"
	"github.com/containerd/containerd/plugin"
	"github.com/containerd/containerd/runtime/v2/shim"
)

// RuntimeName is the runtime type containerd knows the shim by; its binary
// is containerd-shim-microvm-v2.
const RuntimeName = "io.containerd.microvm.v2"

// sandboxAnnotation groups a pod's containers: CRI puts the pod sandbox's
// id on each of them, and they all go to the sandbox's shim.
const sandboxAnnotation = "io.kubernetes.cri.sandbox-id"

// Manager is the shim binary's start and delete actions (containerd's
// shim v2 protocol, as containerd 1.7's runtime/v2/shim serves it).
type Manager struct{}

// Name is the runtime's name.
func (Manager) Name() string { return RuntimeName }

// Start runs in the bundle directory: it starts the shim daemon for the
// container's group (its pod, or itself), or finds the running one, and
// returns the address of its socket.
func (Manager) Start(ctx context.Context, id string, opts shim.StartOpts) (_ string, err error) {
	grouping := id
	if spec, err := readSpec("."); err == nil && spec.Annotations[sandboxAnnotation] != "" {
		grouping = spec.Annotations[sandboxAnnotation]
	}
	address, err := shim.SocketAddress(ctx, opts.Address, grouping)
	if err != nil {
		return "", err
	}
	l, err := shim.NewSocket(address)
	if err != nil {
		if !shim.SocketEaddrinuse(err) {
			return "", fmt.Errorf("shim socket: %w", err)
		}
		if shim.CanConnect(address) {
			return address, shim.WriteAddress("address", address)
		}
		// A socket left by a shim that died: take its place.
		if err := shim.RemoveSocket(address); err != nil {
			return "", fmt.Errorf("shim socket: %w", err)
		}
		if l, err = shim.NewSocket(address); err != nil {
			return "", fmt.Errorf("shim socket: %w", err)
		}
	}
	defer func() {
		if err != nil {
			l.Close()
			shim.RemoveSocket(address)
		}
	}()
	f, err := l.File()
	if err != nil {
		return "", err
	}
	defer f.Close()
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return "", err
	}
	cwd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	args := []string{"-namespace", ns, "-id", id, "-address", opts.Address}
	if opts.Debug {
		args = append(args, "-debug")
	}
	cmd := exec.Command(self, args...)
	cmd.Dir = cwd
	cmd.Env = append(os.Environ(), "GOMAXPROCS=4")
	// Its own process group: a signal to containerd's group does not
	// reach it. The listening socket is its fd 3.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.ExtraFiles = []*os.File{f}
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("start the shim daemon: %w", err)
	}
	go cmd.Wait() //nolint:errcheck // reaped; the daemon outlives this process
	if err := shim.WriteAddress("address", address); err != nil {
		cmd.Process.Kill()
		return "", err
	}
	return address, nil
}

// Stop is the delete action: containerd runs it in the bundle directory
// after the shim daemon died (or to clean up a container that never
// started). The VM lived inside the daemon and is gone with it; what is
// left is the container's binds in the pod's shared directory (its root
// under Rootfs9p, its volumes; for the pod's sandbox, the directory
// itself), and the root file system's mount and image.
func (Manager) Stop(ctx context.Context, id string) (shim.StopStatus, error) {
	if err := errors.Join(unbindVolumes(id), removeShareDir(id)); err != nil {
		return shim.StopStatus{}, err
	}
	if err := cleanupBundle(".", true); err != nil {
		return shim.StopStatus{}, err
	}
	if a, err := shim.ReadAddress("address"); err == nil {
		shim.RemoveSocket(a)
	}
	return shim.StopStatus{Pid: 0, ExitStatus: 128 + int(syscall.SIGKILL), ExitedAt: time.Now()}, nil
}

// Register adds the task service to the shim daemon's plugins; call it
// before shim.RunManager.
func Register() {
	plugin.Register(&plugin.Registration{
		Type:     plugin.TTRPCPlugin,
		ID:       "task",
		Requires: []plugin.Type{plugin.EventPlugin, plugin.InternalPlugin},
		InitFn: func(ic *plugin.InitContext) (interface{}, error) {
			pp, err := ic.GetByID(plugin.EventPlugin, "publisher")
			if err != nil {
				return nil, err
			}
			ss, err := ic.GetByID(plugin.InternalPlugin, "shutdown")
			if err != nil {
				return nil, err
			}
			self, err := os.Executable()
			if err != nil {
				return nil, err
			}
			cfg, cfgErr := ConfigFromEnv(os.Getenv, self)
			sd := ss.(shutdown.Service)
			sd.RegisterCallback(func(context.Context) error {
				if a, err := shim.ReadAddress("address"); err == nil {
					shim.RemoveSocket(a)
				}
				return nil
			})
			return NewService(ic.Context, cfg, cfgErr, pp.(shim.Publisher), sd), nil
		},
	})
}
