// Command host is the host side of the rpcservice example, and the demo
// make run shows: it boots a VM whose image holds the guest agent and the
// user's own gRPC service (greeterd), runs uname -a and a small script in
// it through the agent with their output streamed here, starts the service
// through the agent, and calls it over vsock through the Go API's
// DialVsock, with no Unix socket in between.
//
//	CGO_ENABLED=0 go build -o build/examples/greeterd ./examples/rpcservice/greeterd
//	host -kernel build/kernel/bzImage -agent bin/microvm-agent -greeterd build/examples/greeterd
//
// Like every Linux guest it needs a KVM that runs Linux (the nested-KVM box
// elsewhere).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/examples/rpcservice/greeter"
	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/guest/agentimage"
)

const agentPort = 1024

// script is the small job the demo runs in the guest.
const script = `echo "guest: $(nproc) CPUs, $(grep MemTotal /proc/meminfo | tr -s ' ')"
echo "guest: mounted: $(cut -d' ' -f2 /proc/mounts | tr '\n' ' ')"
echo "guest: up $(cut -d' ' -f1 /proc/uptime) s; pid 1 is $(cat /proc/1/comm)"
`

func main() {
	verbose := flag.Bool("v", false, "show what runs in the guest (uname -a, a script) before the call")
	kernel := flag.String("kernel", "build/kernel/bzImage", "guest kernel")
	agent := flag.String("agent", "bin/microvm-agent", "static guest agent")
	greeterd := flag.String("greeterd", "build/examples/greeterd", "the service, built static")
	busybox := flag.String("busybox", "/bin/busybox", "static busybox for the guest's shell tools")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var show io.Writer
	if *verbose {
		show = os.Stdout
	}
	r, err := run(ctx, *kernel, *agent, *greeterd, *busybox, show)
	if err != nil {
		fmt.Fprintf(os.Stderr, "rpcservice: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("greeter says %q (guest kernel %s)\n", r.Message, r.Kernel)
}

// run boots the VM, calls the service and returns its reply. With show
// not nil it first runs uname -a and script in the guest, their output
// going to show.
func run(ctx context.Context, kernel, agent, greeterd, busybox string, show io.Writer) (*greeter.Reply, error) {
	dir, err := os.MkdirTemp("", "rpcservice-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	initrd := filepath.Join(dir, "initramfs.cpio")
	f, err := os.Create(initrd)
	if err != nil {
		return nil, err
	}
	err = agentimage.Build(f, agentimage.Options{Agent: agent, Busybox: busybox,
		Files: []agentimage.File{{Src: greeterd, Dst: "/usr/bin/greeterd"}}})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("guest image: %w", err)
	}
	m, err := microvm.New(microvm.Config{
		Kernel: kernel, Initrd: initrd, MemoryBytes: 512 << 20, CPUs: 2,
		Cmdline: "console=ttyS0 reboot=k panic=-1 quiet",
		Vsock:   &microvm.VsockConfig{CID: 3}, // reached in-process (DialVsock): no Unix socket
	})
	if err != nil {
		return nil, err
	}
	defer m.Close()
	vmCtx, stopVM := context.WithCancel(ctx)
	vmDone := make(chan error, 1)
	go func() { _, err := m.Run(vmCtx); vmDone <- err }()
	defer func() { stopVM(); <-vmDone }()

	// A gRPC connection to a guest port through the in-process vsock API,
	// once something accepts there (ConnectVM, through Machine.WaitAgent,
	// dials again while the port is refused, gives up at once when the VM
	// stops, and says how far the guest got when time runs out).
	dial := func(ctx context.Context, port uint32) (*agentapi.Conn, error) {
		return agentapi.ConnectVM(ctx, m, port, 2*time.Minute)
	}
	agentConn, err := dial(ctx, agentPort)
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	defer agentConn.Close()
	if show != nil {
		for _, c := range []struct {
			what string
			argv []string
		}{{"uname -a", []string{"uname", "-a"}}, {"a small script", []string{"sh", "-c", script}}} {
			fmt.Fprintf(show, "host: runs %s in the guest\n", c.what)
			st, err := agentapi.NewClient(agentConn).Exec(ctx, &agentapi.Cmd{Argv: c.argv, Stdout: show, Stderr: os.Stderr})
			if err != nil {
				return nil, err
			}
			if st.Code != 0 || st.Signal != 0 {
				return nil, fmt.Errorf("%s: %v", c.what, st)
			}
		}
		fmt.Fprintf(show, "host: starts greeterd in the guest through the agent and calls it over vsock\n")
	}
	// Run the service through the agent for as long as we need it: the
	// Exec call stays open, its stderr comes here, and cancelling it (or
	// tearing the VM down) kills the service.
	svcCtx, stopSvc := context.WithCancel(ctx)
	defer stopSvc()
	// The wait for greeterd ends early if it exits.
	waitSvc, svcFailed := context.WithCancelCause(ctx)
	defer svcFailed(nil)
	go func() {
		st, err := agentapi.NewClient(agentConn).Exec(svcCtx, &agentapi.Cmd{
			Argv: []string{"/usr/bin/greeterd"}, Stderr: os.Stderr,
		})
		if err == nil {
			err = fmt.Errorf("greeterd ended: %v", st)
		}
		svcFailed(err)
	}()
	svc, err := dial(waitSvc, greeter.Port)
	if err != nil {
		return nil, fmt.Errorf("greeterd: %w", err)
	}
	defer svc.Close()
	r, err := greeter.Greet(ctx, svc, "host")
	if err != nil {
		return nil, fmt.Errorf("calling greeter: %w", err)
	}
	return r, nil
}
