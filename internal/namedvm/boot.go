package namedvm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/guest/agentimage"
	"github.com/microvm/microvm/images"
	"github.com/microvm/microvm/internal/agentvm"
	"github.com/microvm/microvm/internal/cachedisk"
	"github.com/microvm/microvm/internal/dockervm"
	"github.com/microvm/microvm/internal/execvm"
	"github.com/microvm/microvm/internal/image"
	"github.com/microvm/microvm/internal/unixsock"
	"github.com/microvm/microvm/internal/vms"
)

// DockerDiskFile is run --docker's data disk, in the VM's state directory.
const DockerDiskFile = "docker.ext4"

// BootRequest is a VM that `microvm run --name` boots, as plain data: what
// the command line chose, checked.
type BootRequest struct {
	// Name is the VM's name (vms.CheckName).
	Name string
	// Config is the VM's checked configuration; its vsock socket, console
	// and log are the VM's process's (Launch.Build), and Boot adds the
	// Docker data disk, the caches and the image's disks.
	Config microvm.Config
	// Agent: the guest's /init is microvm's agent (exec --vm, cp).
	Agent bool
	// AgentImage, when set, is the agent image built as the initrd (in a
	// temporary file, gone once the machine holds it), Config.Initrd
	// unused.
	AgentImage *agentimage.Options
	// Image is --image's image (ImageRef as the user named it), Overlay
	// the size of its copy-on-write layer (0: the default).
	Image    *image.Image
	ImageRef string
	Overlay  uint64
	// Main is the image's main process, nil for an idle VM.
	Main *Process
	// Docker, when set, starts Docker in the guest once the agent answers
	// (run --docker), its data on a disk in the VM's state directory.
	Docker *execvm.Docker
	// Caches are checked out of the store in CacheDir ("" for the default
	// one) with CacheLimits, mounted for the main process and committed
	// when it ends 0 (run --cache).
	Caches      []execvm.Cache
	CacheDir    string
	CacheLimits cachedisk.Limits
}

// Boot is the process of the VM req (run --name): the Docker data disk
// and the caches added to its configuration, its Launch made (bootLaunch,
// dockerLaunch, WithCaches), Run with o, and its caches committed or
// discarded (FinishCaches). Its errors are Run's, a FailedError for caches
// that could not be checked out or committed (told to a detached start on
// o.Ready), and a state directory that holds no sockets said as such.
// o.FailureStatus is also the VM's status when its caches do not mount.
func Boot(req BootRequest, o Options) error {
	l, caches, err := prepareBoot(req, o.FailureStatus)
	if err != nil {
		var fe FailedError // the caches' checkout: a detached start hears why
		if errors.As(err, &fe) && o.Ready != nil {
			fmt.Fprintln(o.Ready, ReadyError(err))
			o.Ready.Close()
		}
		return err
	}
	err = Run(l, o)
	if ferr := FinishCaches(caches, err, o.Log); ferr != nil && err == nil {
		err = FailedError{ferr}
	}
	var se SetupError
	if errors.Is(err, unixsock.ErrNoSockets) && !errors.As(err, &se) {
		// The VM's sockets live in the state directory, which the
		// user may not know they chose.
		err = fmt.Errorf("%w; the state directory is %s: set $MICROVM_STATE_DIR to one on a local file system", err, vms.StateDir())
	}
	return err
}

// prepareBoot is req's Launch, in this order: the Docker data disk added
// to the configuration, the caches checked out into it (by the process
// that owns the VM, which commits them), the launch made from it, Docker's
// start as its setup and the caches' mounts before that. setupStatus is
// the VM's status when the mounts fail. The caches are nil without any.
func prepareBoot(req BootRequest, setupStatus int) (Launch, *execvm.VMCaches, error) {
	cfg := req.Config
	cfg.Disks = append([]microvm.DiskConfig(nil), cfg.Disks...)
	var dockerDisk string
	if req.Docker != nil {
		var err error
		if dockerDisk, err = DockerDiskPath(req.Name); err != nil {
			return Launch{}, nil, err
		}
		cfg.Disks = append(cfg.Disks, microvm.DiskConfig{Path: dockerDisk, Serial: dockervm.DiskSerial})
	}
	var caches *execvm.VMCaches
	if len(req.Caches) > 0 {
		var err error
		if caches, err = CheckoutCaches(context.Background(), &cfg, req.CacheDir, req.CacheLimits, req.Caches); err != nil {
			return Launch{}, nil, FailedError{err}
		}
	}
	l := bootLaunch(req, cfg)
	env := bootEnv(req)
	if req.Docker != nil {
		l = dockerLaunch(l, dockerDisk, req.Docker, env)
	}
	if caches != nil {
		l = WithCaches(l, caches, env, setupStatus)
	}
	return l, caches, nil
}

// bootLaunch is the launch of req with cfg, its configuration with the
// Docker disk and the caches: its record, and its machine booted from the
// agent image when req has one.
func bootLaunch(req BootRequest, cfg microvm.Config) Launch {
	rec := vms.Record{Name: req.Name, CPUs: cfg.CPUs, MemoryBytes: cfg.MemoryBytes, Kernel: cfg.Kernel,
		Initrd: cfg.Initrd, Agent: req.Agent, AgentPort: agentvm.Port}
	if cfg.Vsock != nil {
		rec.VsockCID = cfg.Vsock.CID
	}
	if req.Image != nil {
		images.Use(&cfg, req.Image, req.Overlay)
		rec.Image, rec.Process = req.ImageRef, ImageDefaults(req.Image.Config)
	}
	if req.AgentImage != nil {
		rec.Initrd = "(the agent image)"
	}
	for _, d := range cfg.Disks {
		rec.Disks = append(rec.Disks, d.Path)
	}
	agentImage := req.AgentImage
	build := func(host microvm.Config) (*microvm.Machine, error) {
		cfg := cfg
		if cfg.Vsock != nil {
			v := *cfg.Vsock
			v.UDSPath = host.Vsock.UDSPath
			cfg.Vsock = &v
		}
		cfg.Log, cfg.Console, cfg.ConsoleInput = host.Log, host.Console, host.ConsoleInput
		if agentImage == nil {
			return microvm.New(cfg)
		}
		f, err := os.CreateTemp("", "microvm-run-*.cpio")
		if err != nil {
			return nil, err
		}
		f.Close()
		defer os.Remove(f.Name()) // in guest memory once New returns
		if err := agentimage.WriteFile(f.Name(), *agentImage); err != nil {
			return nil, FailedError{fmt.Errorf("run: guest image: %w", err)}
		}
		cfg.Initrd = f.Name()
		return microvm.New(cfg)
	}
	return Launch{Record: rec, Build: build, Main: req.Main}
}

// bootEnv is the environment Docker's start and the caches' mounts run
// with: the main process's, else the image's, else the agent's own (nil).
func bootEnv(req BootRequest) []string {
	switch {
	case req.Main != nil:
		return req.Main.Env
	case req.Image != nil:
		return req.Image.Config.Env
	}
	return nil
}

// DockerDiskPath is where the VM name keeps its Docker data disk (run
// --docker), in its state directory, removed with it (microvm rm).
func DockerDiskPath(name string) (string, error) {
	store, err := vms.Open(vms.StateDir())
	if err != nil {
		return "", err
	}
	return filepath.Join(store.Dir(name), DockerDiskFile), nil
}

// dockerLaunch is l with run --docker's data disk, at path and already in
// l's configuration and record, made before the machine is built (the
// VM's process holds the name and its directory then), and Docker started
// with env as its setup, with Docker's exit status when it fails.
func dockerLaunch(l Launch, path string, d *execvm.Docker, env []string) Launch {
	size := d.DiskSize
	if size == 0 {
		size = dockervm.DefaultDiskSize
	}
	build := l.Build
	l.Build = func(host microvm.Config) (*microvm.Machine, error) {
		if _, err := dockervm.CreateDisk(context.Background(), path, size); err != nil {
			return nil, FailedError{fmt.Errorf("run: %w", err)}
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
