package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/internal/testing/testenv"
	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/vhostuser"
	"github.com/microvm/microvm/vsock"
)

// The connection soak runs the vsock device in a process of its own, so
// that the memory, descriptors and threads measured are the device's alone:
// this program started again with envDevice set to a deviceConfig in JSON.
// The process wires the device as `microvm vhost-user-vsock` does (vsock.New
// with a UDSDialer, ListenUDS, vhostuser.Listen), prints "ready" and then
// answers each "stats" line on stdin with one deviceReport in JSON; at end
// of stdin it closes everything and exits.
const envDevice = "MICROVM_SOAK_DEVICE"

// deviceConfig is the device process's configuration.
type deviceConfig struct {
	Sock           string        `json:"sock"`            // vhost-user socket
	UDS            string        `json:"uds"`             // the host Unix socket (CONNECT; guest connections to P go to UDS_P)
	MaxConns       int           `json:"max_conns"`       // vsock.Config.MaxConns (microvm: --vsock-max-conns)
	ConnBuffer     uint32        `json:"conn_buffer"`     // vsock.Config.ConnBuffer (--vsock-conn-buffer)
	MaxBuffered    uint64        `json:"max_buffered"`    // vsock.Config.MaxBuffered (--vsock-buffer-total)
	ConnectTimeout time.Duration `json:"connect_timeout"` // vsock.Config.ConnectTimeout
}

// deviceReport is the device process's answer to "stats".
type deviceReport struct {
	Stats vsock.Stats `json:"stats"`
	Usage usage       `json:"usage"`
}

// deviceMain is the device process: see envDevice. It returns the exit
// status.
func deviceMain(cfgJSON string) int {
	var cfg deviceConfig
	if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "soak device: $%s: %v\n", envDevice, err)
		return 2
	}
	if err := serveDevice(cfg, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "soak device: %v\n", err)
		return 1
	}
	return 0
}

func serveDevice(cfg deviceConfig, in io.Reader, out io.Writer) error {
	if _, err := raiseNoFile(uint64(cfg.MaxConns) + 1024); err != nil {
		return err
	}
	log := logrus.New()
	log.SetOutput(os.Stderr)
	log.SetLevel(logrus.WarnLevel)
	dev, err := vsock.New(vsock.Config{
		CID: 3, MaxConns: cfg.MaxConns, ConnBuffer: cfg.ConnBuffer, MaxBuffered: cfg.MaxBuffered,
		ConnectTimeout: cfg.ConnectTimeout, QueueSize: virtio.MaxQueueSize,
		Dialer: vsock.UDSDialer{Path: cfg.UDS}, Log: log.WithField("device", "vsock"),
	})
	if err != nil {
		return err
	}
	defer dev.Close()
	hs, err := vsock.ListenUDS(cfg.UDS, dev, cfg.ConnectTimeout, log.WithField("device", "vsock-uds"))
	if err != nil {
		return err
	}
	defer hs.Close()
	go hs.Serve()
	be, err := vhostuser.Listen(cfg.Sock, vhostuser.Config{Device: dev, Rings: dev.BackendQueues, Log: log})
	if err != nil {
		return err
	}
	served := make(chan error, 1)
	go func() { served <- be.Serve() }()
	defer func() {
		be.Close()
		<-served
	}()
	if _, err := fmt.Fprintln(out, "ready"); err != nil {
		return err
	}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		if sc.Text() != "stats" {
			return fmt.Errorf("unknown command %q", sc.Text())
		}
		// Counters first: sockets close before the connection count
		// drops, so usage read after them never shows fewer descriptors
		// than the count says are open.
		st := dev.Stats()
		u, err := procUsage(0)
		if err != nil {
			return err
		}
		b, err := json.Marshal(deviceReport{Stats: st, Usage: u})
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(out, "%s\n", b); err != nil {
			return err
		}
	}
	return sc.Err()
}

// deviceProc is the parent's handle on the device process. One goroutine
// (the soak's) uses it.
type deviceProc struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Scanner
	stderr *testenv.SyncBuffer
}

// startDevice starts this program again as the device process and waits
// for it to be ready.
func startDevice(cfg deviceConfig) (*deviceProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	p := &deviceProc{cmd: exec.Command(exe), stderr: &testenv.SyncBuffer{}}
	p.cmd.Env = append(os.Environ(), envDevice+"="+string(b))
	p.cmd.Stderr = p.stderr
	if p.in, err = p.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p.out = bufio.NewScanner(stdout)
	p.out.Buffer(make([]byte, 64<<10), 1<<20)
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	ready := make(chan bool, 1)
	go func() { ready <- p.out.Scan() && p.out.Text() == "ready" }()
	select {
	case ok := <-ready:
		if ok {
			return p, nil
		}
	case <-time.After(20 * time.Second):
	}
	p.kill()
	return nil, fmt.Errorf("device process not ready: %s", strings.TrimSpace(p.stderr.String()))
}

// stderrTail is the end of the device process's diagnostics, for errors.
func (p *deviceProc) stderrTail() string {
	if s := strings.TrimSpace(p.stderr.String()); s != "" {
		return "\ndevice process stderr:\n" + tail(s, 4096)
	}
	return ""
}

// report asks the device process for its counters and its usage (which it
// measures itself: goroutines and heap are only visible from inside).
func (p *deviceProc) report() (deviceReport, error) {
	var r deviceReport
	if _, err := fmt.Fprintln(p.in, "stats"); err != nil {
		return r, fmt.Errorf("device process: %w (stderr: %s)", err, p.stderr.String())
	}
	if !p.out.Scan() {
		return r, fmt.Errorf("device process: no answer (%v; stderr: %s)", p.out.Err(), p.stderr.String())
	}
	if err := json.Unmarshal(p.out.Bytes(), &r); err != nil {
		return r, fmt.Errorf("device process: %w", err)
	}
	return r, nil
}

// close ends the device process (end of its stdin) and checks it exited 0.
func (p *deviceProc) close() error {
	p.in.Close()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("device process: %w (stderr: %s)", err, p.stderr.String())
		}
		return nil
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
		return errors.New("device process did not exit 20 s after its stdin closed")
	}
}

func (p *deviceProc) kill() {
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
}
