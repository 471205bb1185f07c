// Command host is the host side of the rpcservice example: it boots a VM
// whose image holds the guest agent and the user's own gRPC service
// (greeterd), starts the service through the agent, and calls it over vsock
// through the Go API's DialVsock, with no Unix socket in between.
//
//	CGO_ENABLED=0 go build -o build/examples/greeterd ./examples/rpcservice/greeterd
//	host -kernel build/kernel/bzImage -agent bin/microvm-agent -greeterd build/examples/greeterd
//
// Like every Linux guest it needs a KVM that runs Linux (the nested-KVM box
// elsewhere).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/agentapi"
	"github.com/microvm/microvm/examples/rpcservice/greeter"
	"github.com/microvm/microvm/guest/agentimage"
)

const agentPort = 1024

func main() {
	kernel := flag.String("kernel", "build/kernel/bzImage", "guest kernel")
	agent := flag.String("agent", "bin/microvm-agent", "static guest agent")
	greeterd := flag.String("greeterd", "build/examples/greeterd", "the service, built static")
	busybox := flag.String("busybox", "/bin/busybox", "static busybox for the guest's shell tools")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r, err := run(ctx, *kernel, *agent, *greeterd, *busybox)
	if err != nil {
		fmt.Fprintf(os.Stderr, "rpcservice: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("greeter says %q (guest kernel %s)\n", r.Message, r.Kernel)
}

func run(ctx context.Context, kernel, agent, greeterd, busybox string) (*greeter.Reply, error) {
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
		Kernel: kernel, Initrd: initrd, MemoryBytes: 512 << 20,
		Cmdline: "console=ttyS0 reboot=k panic=-1 quiet",
		Vsock:   &microvm.VsockConfig{CID: 3, UDSPath: filepath.Join(dir, "v.sock")},
	})
	if err != nil {
		return nil, err
	}
	defer m.Close()
	vmCtx, stopVM := context.WithCancel(ctx)
	vmDone := make(chan error, 1)
	go func() { _, err := m.Run(vmCtx); vmDone <- err }()
	defer func() { stopVM(); <-vmDone }()

	// A gRPC connection to a guest port, through the in-process vsock API.
	dial := func(port uint32) (*grpc.ClientConn, error) {
		return grpc.NewClient("passthrough:///vsock",
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
				return m.DialVsock(ctx, port)
			}))
	}
	if err := waitPort(ctx, m, agentPort, vmDone, nil); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	agentConn, err := dial(agentPort)
	if err != nil {
		return nil, err
	}
	defer agentConn.Close()
	// Run the service through the agent for as long as we need it: the
	// Exec call stays open, its stderr comes here, and cancelling it (or
	// tearing the VM down) kills the service.
	svcCtx, stopSvc := context.WithCancel(ctx)
	defer stopSvc()
	svcDone := make(chan error, 1)
	go func() {
		st, err := agentapi.NewClient(agentConn).Exec(svcCtx, &agentapi.Cmd{
			Argv: []string{"/usr/bin/greeterd"}, Stderr: os.Stderr,
		})
		if err == nil {
			err = fmt.Errorf("greeterd ended: %v", st)
		}
		svcDone <- err
	}()
	if err := waitPort(ctx, m, greeter.Port, vmDone, svcDone); err != nil {
		return nil, fmt.Errorf("greeterd: %w", err)
	}
	svc, err := dial(greeter.Port)
	if err != nil {
		return nil, err
	}
	defer svc.Close()
	r, err := greeter.Greet(ctx, svc, "host")
	if err != nil {
		return nil, fmt.Errorf("calling greeter: %w", err)
	}
	return r, nil
}

// waitPort waits until something in the guest accepts on port.
// It gives up when the VM ends or, if given, when failed reports an error.
func waitPort(ctx context.Context, m *microvm.Machine, port uint32, vmDone, failed <-chan error) error {
	for {
		c, err := m.DialVsock(ctx, port)
		if err == nil {
			return c.Close()
		}
		if !errors.Is(err, microvm.ErrVsockRefused) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-vmDone:
			return fmt.Errorf("the VM ended: %v", err)
		case err := <-failed:
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}
