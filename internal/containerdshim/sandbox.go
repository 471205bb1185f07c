package containerdshim

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/guest/agentimage"
	"github.com/microvm/microvm/guest/pid1"
	"github.com/microvm/microvm/internal/agentvm"
	"github.com/microvm/microvm/internal/podnet"
)

// Files the sandbox keeps in the bundle.
const (
	consoleLog = "microvm-console.log" // the guest's serial console
	initrdFile = "microvm-agent.cpio"  // the agent's initramfs, removed once loaded
	guestCID   = 3
	// consoleTail is how much of the console an error quotes.
	consoleTail = 4 << 10
	// podTAP is the VM's TAP in the pod's network namespace.
	podTAP = "tap0_microvm"
)

// sandbox is one VM: the machine, run on its own goroutine inside the shim
// process (so a shim killed with SIGKILL takes its VM with it), and the
// gRPC connection to the guest agent that runs the containers' processes.
type sandbox struct {
	m       *microvm.Machine
	agent   *agentapi.Conn
	client  agentapi.AgentClient
	files   *agentapi.Client // the same connection, for PutTree
	console string           // path of the console log
	cancel  context.CancelFunc

	done chan struct{} // closed when Run returned; res and runErr are set then
	res  microvm.Result
	err  error
}

// bootSandbox boots a VM whose root file system is the ext4 at rootfs (or,
// with rootfs "", an empty tmpfs) and
// waits until its agent answers, within cfg.BootTimeout. With netns (the
// pod's network namespace, as CNI set it up) the VM is the pod on its
// network: its eth0 on a TAP in the namespace joined to the pod's
// interface (package podnet), with that interface's MAC and IPv4 address.
// On error the VM is gone.
func bootSandbox(ctx context.Context, cfg Config, dir, rootfs, share, netns string, log logrus.FieldLogger) (_ *sandbox, err error) {
	initrd := filepath.Join(dir, initrdFile)
	if err := writeInitrd(initrd, cfg.Agent); err != nil {
		return nil, err
	}
	defer os.Remove(initrd) // in guest memory once New returned
	s := &sandbox{console: filepath.Join(dir, consoleLog), done: make(chan struct{})}
	con, err := os.Create(s.console)
	if err != nil {
		return nil, fmt.Errorf("vm: console: %w", err)
	}
	mc := microvm.Config{
		Kernel: cfg.Kernel, Initrd: initrd, CPUs: cfg.CPUs, MemoryBytes: cfg.Memory,
		Cmdline: "console=ttyS0 reboot=k panic=-1 quiet",
		Console: con, Log: log,
		Vsock: &microvm.VsockConfig{CID: guestCID},
		RNG:   &microvm.RNGConfig{},
	}
	if share != "" {
		mc.Shares = []microvm.ShareConfig{{Tag: volumesTag, Path: share}}
	}
	if rootfs != "" {
		mc.UseRootfs(rootfs, 0)
	} else {
		// Every container's root is shared (Rootfs9p); the VM's own root
		// is an empty tmpfs the agent switches to.
		mc.Cmdline += " microvm.root=" + pid1.RootTmpfs
	}
	var ifc podnet.Interface
	if netns != "" {
		if ifc, err = podnet.Inspect(netns); err != nil {
			con.Close()
			return nil, fmt.Errorf("vm: pod network: %w", err)
		}
		log.WithField("netns", netns).Infof("pod network: %v", ifc)
		mc.Nets = []microvm.NetConfig{{TAP: podTAP, NetNS: netns, MAC: ifc.MAC}}
		mc.Cmdline += " " + ifc.KernelArg("eth0")
	}
	s.m, err = microvm.New(mc)
	if err != nil {
		con.Close()
		return nil, fmt.Errorf("vm: %w", err)
	}
	if netns != "" {
		if err := podnet.Redirect(netns, ifc, podTAP); err != nil {
			s.m.Close()
			con.Close()
			return nil, fmt.Errorf("vm: pod network: %w", err)
		}
	}
	runCtx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() {
		defer close(s.done)
		defer con.Close()
		s.res, s.err = s.m.Run(runCtx)
	}()
	defer func() {
		if err != nil {
			s.stop()
		}
	}()
	s.agent, err = agentvm.Wait(ctx, s.m, cfg.BootTimeout, s.done)
	if err != nil {
		select {
		case <-s.done:
			return nil, fmt.Errorf("vm: the VM ended before its agent answered (%s); console:\n%s", s.why(), s.consoleTail())
		default:
		}
		return nil, fmt.Errorf("vm: %w; console:\n%s", err, s.consoleTail())
	}
	s.client = agentapi.NewAgentClient(s.agent)
	s.files = agentapi.NewClient(s.agent)
	return s, nil
}

// writeInitrd writes the agent's initramfs (the agent as /init, which
// mounts the root file system the kernel command line names).
func writeInitrd(path, agent string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("vm: initramfs: %w", err)
	}
	err = agentimage.Build(f, agentimage.Options{Agent: agent})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("vm: initramfs: %w", err)
	}
	return nil
}

// why says how the VM ended; call it after done is closed.
func (s *sandbox) why() string {
	r := s.res.Kind.String()
	if s.err != nil {
		r += ": " + s.err.Error()
	}
	return r
}

// consoleTail is the end of the guest console, for error messages.
func (s *sandbox) consoleTail() string {
	f, err := os.Open(s.console)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > consoleTail {
		if _, err := f.Seek(st.Size()-consoleTail, io.SeekStart); err != nil {
			return "(" + err.Error() + ")"
		}
	}
	b, _ := io.ReadAll(f)
	return strings.TrimRight(string(b), "\n")
}

// stop powers the VM off (the agent's Shutdown, so the guest syncs and
// powers off; after grace, or without an agent, by ending Run) and
// releases it. Service.stopVM calls it once per VM (bootSandbox on its
// own failure path).
func (s *sandbox) stop() {
	const grace = 5 * time.Second
	if s.client != nil {
		ctx, cancel := context.WithTimeout(context.Background(), grace)
		if _, err := s.client.Shutdown(ctx, &agentapi.ShutdownRequest{}); err == nil {
			select {
			case <-s.done:
			case <-ctx.Done():
			}
		}
		cancel()
	}
	s.cancel()
	<-s.done
	if s.agent != nil {
		s.agent.Close()
	}
	s.m.Close()
}
