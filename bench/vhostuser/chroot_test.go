package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/microvm/microvm/bench/internal/vhufront"
	"github.com/microvm/microvm/internal/testing/testenv"
)

// TestVhostUserChroot: `microvm vhost-user-vsock --chroot DIR` (bin/microvm,
// under its filter) enters DIR once its sockets listen (/proc/PID/root),
// and still serves a front-end: the kick and call eventfds are checked
// through the /proc mounted inside DIR, the guest's connection to
// <uds>_<port> is dialled by its name inside DIR, data moves both ways,
// the metrics socket answers, and every socket file is removed at exit.
func TestVhostUserChroot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chroot and mounting /proc need root")
	}
	bin := testenv.Binary(t)
	dir, err := os.MkdirTemp("", "vhuj")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	for _, d := range []string{"proc", "run"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mount("proc", filepath.Join(dir, "proc"), "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		t.Skipf("mount proc: %v", err)
	}
	defer func() {
		if err := syscall.Unmount(filepath.Join(dir, "proc"), syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s/proc: %v", dir, err)
		}
	}()
	run := filepath.Join(dir, "run")
	sock, uds, msock := filepath.Join(run, "vhu.sock"), filepath.Join(run, "v.sock"), filepath.Join(run, "m.sock")
	cmd := exec.Command(bin, "vhost-user-vsock", "--socket", sock, "--guest-cid", "3", "--uds-path", uds,
		"--metrics-socket", msock, "--chroot", dir)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := false
	defer func() {
		if !exited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	errOut := bufio.NewReader(stderr)
	line, err := errOut.ReadString('\n')
	if err != nil || !strings.Contains(line, "vhost-user-vsock listening on") {
		t.Fatalf("first line %q, %v", line, err)
	}
	// The line comes after the filter went in, which is after the chroot.
	if root, err := os.Readlink(fmt.Sprintf("/proc/%d/root", cmd.Process.Pid)); err != nil || root != dir {
		t.Errorf("/proc/PID/root = %q, %v; want %q", root, err, dir)
	}
	g, err := vhufront.Start(sock, vhufront.Config{CID: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	const timeout = 30 * time.Second

	// Guest to host: the back-end dials <uds>_5000 from inside DIR.
	ln, err := vhufront.ListenUnix(uds + "_5000")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	sunk := hostSinkAsync(ln, timeout)
	sent, err := g.Source(5000, 16<<10, 100*time.Millisecond, time.Now().Add(timeout))
	host := <-sunk
	if err != nil || host.err != nil || sent.Bytes == 0 || sent.Bytes != host.tr.Bytes {
		t.Fatalf("guest to host: sent %d, %v; host got %d, %v", sent.Bytes, err, host.tr.Bytes, host.err)
	}

	// Host to guest, through the CONNECT socket bound before the chroot.
	sourced := hostSourceAsync(uds, 5001, 16<<10, 100*time.Millisecond, timeout)
	got, err := g.Sink(5001, time.Now().Add(timeout))
	hs := <-sourced
	if err != nil || hs.err != nil || got.Bytes == 0 || got.Bytes != hs.tr.Bytes {
		t.Fatalf("host to guest: host sent %d, %v; guest got %d, %v", hs.tr.Bytes, hs.err, got.Bytes, err)
	}

	client := metricsClient(msock)
	if n, err := scrapeCounter(client, `microvm_vsock_tx_bytes_total{device="vsock0"}`); err != nil || n != uint64(host.tr.Bytes) {
		t.Errorf("microvm_vsock_tx_bytes_total = %d, %v; want %d", n, err, host.tr.Bytes)
	}
	client.CloseIdleConnections()
	if err := g.Close(); err != nil {
		t.Errorf("front-end close: %v", err)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	rest, _ := io.ReadAll(errOut)
	exited = true
	if err := cmd.Wait(); err != nil {
		t.Errorf("after SIGTERM: %v; stderr:\n%s", err, rest)
	}
	for _, p := range []string{sock, uds, uds + ".seqpacket", msock} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after exit: %v, want it removed", p, err)
		}
	}
}
