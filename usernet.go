package microvm

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/devices/virtionet"
)

// EnvNetHelper names the microvm-net binary (cmd/microvm-net) that runs a
// machine's user-mode network. Without it microvm looks next to its own
// executable, then in $PATH.
const EnvNetHelper = "MICROVM_NET"

// netHelperWait bounds how long Close waits for microvm-net to end once
// the device's end of its socket is closed, and New for its first line.
const (
	netHelperWait  = 5 * time.Second
	netHelperStart = 30 * time.Second
)

// userNet starts the machine's user-mode network nc in a microvm-net
// process (NetConfig.User) and returns a virtio-net device on its socket.
// The process ends when the device's end closes (the machine's Close, or
// this process's death); Close then reaps it.
func (m *Machine) userNet(cfg virtionet.Config, nc NetConfig) (*virtionet.Device, error) {
	if cfg.MAC == nil {
		mac, err := virtionet.RandomMAC()
		if err != nil {
			return nil, err
		}
		cfg.MAC = mac
	}
	helper, err := findNetHelper()
	if err != nil {
		return nil, err
	}
	// SEQPACKET: one frame per record, and no datagram queue limit
	// (devices/virtionet/usernet).
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("net: socketpair: %w", err)
	}
	devEnd, netEnd := fds[0], os.NewFile(uintptr(fds[1]), "usernet-socket")
	defer netEnd.Close()
	statusR, statusW, err := os.Pipe()
	if err != nil {
		unix.Close(devEnd)
		return nil, err
	}
	defer statusR.Close()
	stderrR, stderrW, err := os.Pipe()
	if err != nil {
		unix.Close(devEnd)
		statusW.Close()
		return nil, err
	}
	args := []string{helper, "--guest-mac", cfg.MAC.String()}
	for _, p := range nc.Publish {
		args = append(args, "--publish", p.String())
	}
	if nc.HostLoopback {
		args = append(args, "--host-loopback")
	}
	args = append(args, "--egress", nc.Egress.String())
	if lv, ok := logLevel(m.log); ok {
		args = append(args, "--log-level", lv.String())
	}
	proc, err := os.StartProcess(helper, args, &os.ProcAttr{
		Files: []*os.File{nil, nil, stderrW, netEnd, statusW},
		// Its own process group: a terminal's ^C is microvm's to handle.
		Sys: &syscall.SysProcAttr{Setpgid: true},
	})
	statusW.Close()
	stderrW.Close()
	if err != nil {
		unix.Close(devEnd)
		stderrR.Close()
		return nil, fmt.Errorf("net: start %s: %w", helper, err)
	}
	go m.relayNetHelperLog(stderrR)
	reaped := make(chan error, 1)
	go func() { _, err := proc.Wait(); reaped <- err }()
	m.vm.OnClose(func() error { return endNetHelper(proc, reaped) }) // after the device's Close (last in, first out)

	line, err := readStatus(statusR, netHelperStart)
	switch {
	case err != nil:
		unix.Close(devEnd)
		return nil, fmt.Errorf("net: %s: %w", filepath.Base(helper), err)
	case line != "ready":
		unix.Close(devEnd)
		return nil, fmt.Errorf("net: %s", strings.TrimPrefix(line, "error: "))
	}
	return virtionet.NewSocket(cfg, devEnd)
}

// readStatus reads microvm-net's one status line.
func readStatus(r *os.File, limit time.Duration) (string, error) {
	_ = r.SetReadDeadline(time.Now().Add(limit))
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return "", fmt.Errorf("not ready after %v", limit)
		}
		return "", errors.New("ended before it was ready (its messages are in microvm's log)")
	}
	return strings.TrimSpace(line), nil
}

// relayNetHelperLog passes microvm-net's stderr lines (logrus text,
// `level=L msg="..."`) on to the machine's log at their level until the
// pipe closes (the process ended).
func (m *Machine) relayNetHelperLog(r *os.File) {
	defer r.Close()
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line, lvl := sc.Text(), logrus.WarnLevel
		if rest, ok := strings.CutPrefix(line, "level="); ok {
			word, msg, _ := strings.Cut(rest, " ")
			if l, err := logrus.ParseLevel(word); err == nil {
				lvl, line = l, msg
			}
			if q, ok := strings.CutPrefix(line, "msg="); ok {
				if u, err := strconv.QuotedPrefix(q); err == nil {
					q, _ = strconv.Unquote(u)
				}
				line = q
			}
		}
		m.log.WithField("from", "microvm-net").Log(lvl, line)
	}
	// A line past the scanner's 64 KiB ends the loop: read on regardless,
	// or microvm-net would block on a full pipe, or die of SIGPIPE on
	// stderr once it closed.
	_, _ = io.Copy(io.Discard, r)
}

// logLevel is l's level, for the loggers that have one.
func logLevel(l logrus.FieldLogger) (logrus.Level, bool) {
	switch v := l.(type) {
	case *logrus.Logger:
		return v.GetLevel(), true
	case *logrus.Entry:
		return v.Logger.GetLevel(), true
	}
	return 0, false
}

// endNetHelper waits for microvm-net, which ends once the device's end of
// its socket is closed, and kills it if it does not.
func endNetHelper(proc *os.Process, reaped <-chan error) error {
	select {
	case err := <-reaped:
		return err
	case <-time.After(netHelperWait):
	}
	_ = proc.Kill()
	<-reaped
	return fmt.Errorf("net: microvm-net did not end within %v of its device; killed it", netHelperWait)
}

// findNetHelper finds microvm-net: $MICROVM_NET, else next to this
// executable, else in $PATH.
func findNetHelper() (string, error) {
	if p := os.Getenv(EnvNetHelper); p != "" {
		if err := isExecutable(p); err != nil {
			return "", fmt.Errorf("net: $%s: %w", EnvNetHelper, err)
		}
		return p, nil
	}
	var tried []string
	if exe, err := os.Executable(); err == nil {
		if exe, err = filepath.EvalSymlinks(exe); err == nil {
			p := filepath.Join(filepath.Dir(exe), "microvm-net")
			if isExecutable(p) == nil {
				return p, nil
			}
			tried = append(tried, filepath.Dir(exe))
		}
	}
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if dir == "" {
			continue
		}
		if p := filepath.Join(dir, "microvm-net"); isExecutable(p) == nil {
			return p, nil
		}
	}
	tried = append(tried, "$PATH")
	return "", fmt.Errorf("net: --net user needs microvm-net, not found in %s (make bin/microvm-net, or set $%s)",
		strings.Join(tried, " or "), EnvNetHelper)
}

func isExecutable(p string) error {
	fi, err := os.Stat(p)
	switch {
	case err != nil:
		return err
	case fi.IsDir() || fi.Mode()&0o111 == 0:
		return fmt.Errorf("%s is not an executable file", p)
	}
	return nil
}
