package microvm_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/guest/agentimage"
)

// Run a command in a fresh Linux VM through the guest agent: the image
// holds the agent as /init and busybox; the agent listens on vsock port
// 1024, reached in-process (ConnectVM waits for it with WaitAgent while
// the guest boots). (Compiled by go test, not run: it needs a KVM that
// boots Linux and the files make builds.)
func Example_exec() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	img, err := os.CreateTemp("", "agent-*.cpio")
	if err != nil {
		log.Fatal(err)
	}
	defer os.Remove(img.Name())
	if err := agentimage.Build(img, agentimage.Options{Agent: "bin/microvm-agent", Busybox: "/bin/busybox"}); err != nil {
		log.Fatal(err)
	}
	img.Close()
	m, err := microvm.New(microvm.Config{Kernel: "build/kernel/bzImage", Initrd: img.Name(), MemoryBytes: 256 << 20,
		Cmdline: "console=ttyS0 reboot=k panic=-1 quiet", Vsock: &microvm.VsockConfig{CID: 3, UDSPath: img.Name() + ".sock"}})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx) }() // until the guest resets, or ctx ends
	defer func() { cancel(); <-done }()           // stop the VM before Close
	// Machine.WaitAgent, as a gRPC client: dials until the agent answers.
	cc, err := agentapi.ConnectVM(ctx, m, agentapi.DefaultPort, 30*time.Second)
	if err != nil {
		log.Fatal(err) // microvm.ErrStopped: the VM ended before its agent answered
	}
	defer cc.Close()
	st, err := agentapi.NewClient(cc).Exec(ctx, &agentapi.Cmd{Argv: []string{"uname", "-a"}, Stdout: os.Stdout})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit status", st.Code)
}
