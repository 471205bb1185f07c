//go:build linux

package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/microvm/microvm/bench/internal/ioproto"
	"github.com/microvm/microvm/guest/initramfs"
)

// vmmKind is one of the two VMMs compared.
type vmmKind string

const (
	kindMicrovm vmmKind = "microvm"
	kindQEMU    vmmKind = "qemu"
)

// The guest's end of the net link, and the host's, on the TAP in the
// program's own network namespace.
const (
	tapName   = "mvbench0"
	hostAddr  = "10.99.1.1"
	guestAddr = "10.99.1.2/24"
	guestMAC  = "02:00:00:99:01:02"
	sendPort  = 5001 // the guest sends here
	recvPort  = 5002 // the guest receives from here
)

// writeInitrd writes an initramfs holding just the guest program as /init
// (and what the kernel needs to give it a console) to path.
func writeInitrd(path, guest string) error {
	if err := initramfs.CheckStaticELF(guest); err != nil {
		return fmt.Errorf("guest program: %w", err)
	}
	bin, err := os.ReadFile(guest)
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := initramfs.NewWriter(f)
	for _, d := range []string{"dev", "proc", "sys"} {
		if err == nil {
			err = w.Dir(d, 0o755)
		}
	}
	if err == nil {
		err = w.CharDev("dev/console", 0o600, 5, 1)
	}
	if err == nil {
		err = w.File("init", 0o755, bin)
	}
	if err == nil {
		err = w.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	return nil
}

// writeImage makes the raw disk image: size bytes of a pattern (not a
// sparse file, so that reads of it are reads of data on the host too).
func writeImage(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i*13 + i>>9)
	}
	for off := int64(0); off < size && err == nil; off += int64(len(chunk)) {
		_, err = f.Write(chunk[:min(int64(len(chunk)), size-off)])
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("disk image: %w", err)
	}
	return nil
}

// params is what the guest is asked to do.
func (cfg *config) params() ioproto.Params {
	p := ioproto.Params{Mode: cfg.mode, Duration: time.Duration(cfg.seconds * float64(time.Second))}
	if cfg.mode == ioproto.ModeBlk {
		p.Dev = "/dev/vda"
	} else {
		p.GuestAddr, p.HostAddr, p.Iface = guestAddr, hostAddr, "eth0"
		p.SendPort, p.RecvPort = sendPort, recvPort
	}
	return p
}

// cmdline is the kernel command line of kind. Both end the machine the
// same way (pid1.End) but for the reboot method: reboot=k ends microvm,
// while QEMU's microvm machine has no i8042, so its guest resets with a
// triple fault (reboot=t) that -no-reboot turns into an exit.
func (cfg *config) cmdline(kind vmmKind) string {
	reboot := "reboot=k"
	if kind == kindQEMU {
		reboot = "reboot=t"
	}
	return "console=ttyS0 " + reboot + " panic=-1 quiet " + cfg.params().Cmdline()
}

// argv is the command line of kind running initrd with image (blk) or on
// the TAP (net).
func (cfg *config) argv(kind vmmKind, initrd, image string) []string {
	if kind == kindMicrovm {
		a := []string{cfg.microvm, "run", "--kernel", cfg.kernel, "--initrd", initrd,
			"--cpus", fmt.Sprint(cfg.cpus), "--memory", cfg.memory, "--acpi", cfg.acpi, "--rng=off",
			"--cmdline", cfg.cmdline(kind)}
		if cfg.mode == ioproto.ModeBlk {
			return append(a, "--disk", "path="+image)
		}
		return append(a, "--net", "tap="+tapName+",mac="+guestMAC)
	}
	a := []string{cfg.qemu, "-M", "microvm,acpi=off", "-accel", "kvm", "-cpu", "host",
		"-m", cfg.memory, "-smp", fmt.Sprint(cfg.cpus), "-nodefaults", "-no-user-config",
		"-display", "none", "-serial", "stdio", "-no-reboot",
		"-kernel", cfg.kernel, "-initrd", initrd, "-append", cfg.cmdline(kind)}
	if cfg.mode == ioproto.ModeBlk {
		return append(a, "-drive", "file="+image+",if=none,id=d0,format=raw", "-device", "virtio-blk-device,drive=d0")
	}
	return append(a, "-netdev", "tap,id=n0,ifname="+tapName+",script=no,downscript=no",
		"-device", "virtio-net-device,netdev=n0,mac="+guestMAC)
}

// console collects what a VMM writes to its stdout (the guest's serial
// console) line by line: the guest's results, how it ended, and a kernel
// panic. exec.Cmd's copying goroutine writes it; it is read after Wait.
type console struct {
	mu      sync.Mutex
	all     bytes.Buffer
	partial []byte

	results  []ioproto.Result
	bad      []string // result lines that did not parse
	done     bool     // ioproto.DoneLine seen
	guestErr string   // what followed ioproto.ErrorPrefix
	panicked string   // the kernel's panic line
}

// Write records p and looks at every line it completes.
func (c *console) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.all.Write(p)
	rest := p
	for {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			c.partial = append(c.partial, rest...)
			return len(p), nil
		}
		line := string(append(c.partial, rest[:i]...))
		c.partial = c.partial[:0]
		c.observe(strings.TrimRight(line, "\r"))
		rest = rest[i+1:]
	}
}

func (c *console) observe(line string) {
	if r, ok, err := ioproto.ParseResult(line); ok {
		if err != nil {
			c.bad = append(c.bad, err.Error())
		} else {
			c.results = append(c.results, r)
		}
		return
	}
	switch {
	case strings.Contains(line, ioproto.DoneLine):
		c.done = true
	case strings.Contains(line, ioproto.ErrorPrefix):
		c.guestErr = line[strings.Index(line, ioproto.ErrorPrefix)+len(ioproto.ErrorPrefix):]
	case strings.Contains(line, "Kernel panic") && c.panicked == "":
		c.panicked = strings.TrimSpace(line)
	}
}

// tail is the last n bytes of the console.
func (c *console) tail(n int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.all.Bytes()
	if len(b) > n {
		return "..." + string(b[len(b)-n:])
	}
	return string(b)
}

// runOnce runs one VMM to its exit and returns what the guest measured,
// once the VMM exited 0 after the guest said it was done.
func runOnce(argv []string, timeout time.Duration) ([]ioproto.Result, time.Duration, error) {
	var stderr bytes.Buffer
	con := &console{}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = con, &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, 0, fmt.Errorf("start %s: %w", argv[0], err)
	}
	timer := time.AfterFunc(timeout, func() { _ = cmd.Process.Kill() })
	err := cmd.Wait()
	wall := time.Since(start)
	timer.Stop()
	st := cmd.ProcessState
	if st == nil {
		return nil, wall, fmt.Errorf("wait: %v", err)
	}
	ws := st.Sys().(syscall.WaitStatus)
	errTail := func() string { return strings.TrimSpace(tailString(stderr.String(), 300)) }
	switch {
	case ws.Signaled():
		return nil, wall, fmt.Errorf("killed by %v after %v; console %q", ws.Signal(), wall.Round(time.Millisecond), con.tail(400))
	case con.panicked != "":
		return nil, wall, fmt.Errorf("guest kernel panic: %q", con.panicked)
	case con.guestErr != "":
		return nil, wall, fmt.Errorf("guest: %s", con.guestErr)
	case ws.ExitStatus() != 0:
		return nil, wall, fmt.Errorf("exit status %d; stderr %q; console %q", ws.ExitStatus(), errTail(), con.tail(400))
	case len(con.bad) > 0:
		return nil, wall, fmt.Errorf("%s", con.bad[0])
	case !con.done:
		return nil, wall, fmt.Errorf("exited 0 without %q; console %q", ioproto.DoneLine, con.tail(400))
	}
	return con.results, wall, nil
}

func tailString(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
