// Command cijob is an example of embedding microvm in a CI runner: for one
// job it boots a fresh VM through the Go API, copies the job's script in
// through the guest agent, runs it with its output streamed to this
// process, copies an artifact out, and tears the VM down. The VM exists for
// this job only.
//
//	cijob -kernel build/kernel/bzImage -agent bin/microvm-agent -out artifact.txt
//
// It needs a KVM that runs Linux (natively on hardware KVM; elsewhere run it
// inside the nested-KVM box: scripts/kvmbox -- build/examples/cijob ...).
// make test builds it; make run runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/guest/agentimage"
)

// The job: a script that does some work and leaves an artifact behind.
const script = `#!/bin/sh
set -e
echo "job: running on $(uname -sr) with $(nproc) CPUs"
mkdir -p /job/out
seq 1 1000 | awk '{s += $1} END {print "sum", s}' > /job/out/artifact.txt
echo "job: artifact written"
`

const agentPort = 1024

func main() {
	kernel := flag.String("kernel", "build/kernel/bzImage", "guest kernel")
	agent := flag.String("agent", "bin/microvm-agent", "static guest agent")
	busybox := flag.String("busybox", "/bin/busybox", "static busybox for the guest's sh")
	out := flag.String("out", "artifact.txt", "where to put the job's artifact")
	timeout := flag.Duration("timeout", 5*time.Minute, "bound on the whole job")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	status, err := runJob(ctx, *kernel, *agent, *busybox, *out)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cijob: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("cijob: job exited with status %d; artifact in %s\n", status, *out)
	os.Exit(status)
}

func runJob(ctx context.Context, kernel, agent, busybox, out string) (int, error) {
	dir, err := os.MkdirTemp("", "cijob-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)

	// 1. The guest image: the agent as /init, busybox for sh.
	initrd := filepath.Join(dir, "initramfs.cpio")
	f, err := os.Create(initrd)
	if err != nil {
		return 0, err
	}
	err = agentimage.Build(f, agentimage.Options{Agent: agent, Busybox: busybox})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("guest image: %w", err)
	}

	// 2. A fresh VM with a vsock device, running in the background.
	m, err := microvm.New(microvm.Config{
		Kernel: kernel, Initrd: initrd, CPUs: 2, MemoryBytes: 512 << 20,
		Cmdline: "console=ttyS0 reboot=k panic=-1 quiet",
		Vsock:   &microvm.VsockConfig{CID: 3}, // reached in-process (DialVsock): no Unix socket
	})
	if err != nil {
		return 0, err
	}
	defer m.Close()
	vmCtx, stopVM := context.WithCancel(ctx)
	vmDone := make(chan error, 1)
	go func() { _, err := m.Run(vmCtx); vmDone <- err }()
	defer func() { stopVM(); <-vmDone }()

	// 3. The agent answers on vsock port 1024 once the guest has booted;
	// until then the device refuses the connection and ConnectVM
	// (Machine.WaitAgent) tries again. If the VM stops first it gives up
	// at once (microvm.ErrStopped); if the agent does not answer in time,
	// its error says how far the guest got.
	cc, err := agentapi.ConnectVM(ctx, m, agentPort, 2*time.Minute)
	if err != nil {
		return 0, fmt.Errorf("waiting for the agent: %w", err)
	}
	defer cc.Close()
	agentc := agentapi.NewClient(cc)

	// 4. Copy the script in, run it, copy the artifact out.
	if _, err := agentc.PutFile(ctx, "/job/run.sh", 0o755, true, strings.NewReader(script)); err != nil {
		return 0, fmt.Errorf("copy the script in: %w", err)
	}
	st, err := agentc.Exec(ctx, &agentapi.Cmd{
		Argv: []string{"/bin/sh", "/job/run.sh"}, Env: []string{"PATH=/bin:/usr/bin"}, Dir: "/job",
		Stdout: os.Stdout, Stderr: os.Stderr,
	})
	if err != nil {
		return 0, fmt.Errorf("run the job: %w", err)
	}
	if st.Signal != 0 {
		return 128 + int(st.Signal), nil
	}
	af, err := os.Create(out)
	if err != nil {
		return 0, err
	}
	_, err = agentc.GetFile(ctx, "/job/out/artifact.txt", af)
	if cerr := af.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("copy the artifact out: %w", err)
	}
	return int(st.Code), nil
}
