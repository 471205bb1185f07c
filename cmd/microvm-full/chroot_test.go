package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/microvm/microvm/internal/testing/testenv"
)

// jailDir makes a short directory for --chroot (socket paths must fit in
// sun_path) with a run/ directory for the sockets, removed at the end.
func jailDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "mvmjail")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Mkdir(filepath.Join(dir, "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestChrootRun: `microvm run --chroot DIR` makes DIR the process's root
// once the machine is set up (/proc/PID/root), and what microvm does with
// paths afterwards still reaches the right files: the guest's connection
// to <uds>_<port> (dialled at run time, under the filter) is echoed by a
// host listener inside DIR, the metrics socket answers, and the socket
// files are removed at exit.
func TestChrootRun(t *testing.T) {
	testenv.RequireKVM(t)
	if os.Geteuid() != 0 {
		t.Skip("chroot needs CAP_SYS_CHROOT: run as root")
	}
	guest := testenv.TestGuest(t)
	dir := jailDir(t)
	uds := filepath.Join(dir, "run", "v.sock")
	msock := filepath.Join(dir, "run", "m.sock")
	ln, err := net.Listen("unix", uds+"_5001")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	const size = 256 << 10
	c := startCLI(t, "--kernel", guest, "--memory", "64M", "--vsock-cid", "3", "--vsock-uds", uds,
		"--metrics-socket", msock, "--chroot", dir,
		"--cmdline", fmt.Sprintf("testguest.mode=connect testguest.port=5001 testguest.bytes=%d", size))

	// The guest connects at once; microvm entered DIR before Run.
	_ = ln.(*net.UnixListener).SetDeadline(time.Now().Add(30 * time.Second))
	conn, err := ln.Accept()
	if err != nil {
		t.Fatalf("the guest's connection to %s_5001: %v; stdout: %v; stderr:\n%s", uds, err, drain(c.lines), c.stderr.String())
	}
	root, err := os.Readlink(fmt.Sprintf("/proc/%d/root", c.cmd.Process.Pid))
	if err != nil || root != dir {
		t.Errorf("/proc/PID/root = %q, %v; want %q", root, err, dir)
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", msock)
		}}}
	if resp, err := client.Get("http://localhost/metrics"); err != nil {
		t.Errorf("GET /metrics: %v", err)
	} else {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), "microvm_vsock_") {
			t.Errorf("GET /metrics: %s, no vsock counters in:\n%s", resp.Status, body)
		}
	}
	client.CloseIdleConnections()
	echoed := make(chan error, 1)
	go func() {
		defer conn.Close()
		_, err := io.Copy(conn, conn)
		echoed <- err
	}()
	c.waitConnectEchoed(t, size, echoed)
	for _, p := range []string{uds, uds + ".seqpacket", msock} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after exit: %v, want it removed", p, err)
		}
	}
	if c.stderr.Len() != 0 {
		t.Errorf("stderr %q, want nothing", c.stderr.String())
	}
}

// TestChrootNoPrivilege: without CAP_SYS_CHROOT (dropped from the
// bounding set by setpriv) --chroot fails with one line that says what it
// needs, status 1.
func TestChrootNoPrivilege(t *testing.T) {
	testenv.RequireKVM(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root, to drop CAP_SYS_CHROOT from an otherwise privileged child")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("no setpriv (util-linux) to drop CAP_SYS_CHROOT")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	guest := testenv.TestGuest(t)
	dir := jailDir(t)
	cmd := exec.Command(setpriv, "--bounding-set=-sys_chroot", "--inh-caps=-sys_chroot", "--",
		exe, "run", "--kernel", guest, "--memory", "64M", "--chroot", dir, "--cmdline", "testguest.mode=hello")
	cmd.Env = append(os.Environ(), envAsCLI+"=1", "GORACE=atexit_sleep_ms=50")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit: %v, want status 1; stderr:\n%s", err, stderr.String())
	}
	oneLine(t, "stderr", stderr.String(), "--chroot "+dir+": chroot: operation not permitted (needs CAP_SYS_CHROOT")
	if strings.Contains(stdout.String(), "testguest:") {
		t.Errorf("the guest ran: %q", stdout.String())
	}
}

// TestChrootErrors: a --chroot that is no directory, and run-time socket
// paths outside it, are refused before anything is set up.
func TestChrootErrors(t *testing.T) {
	dir := jailDir(t)
	kernel := filepath.Join(dir, "k")
	if err := os.WriteFile(kernel, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"missing", []string{"run", "--kernel", kernel, "--chroot", dir + "/nope"}, "--chroot " + dir + "/nope: no such file or directory"},
		{"a file", []string{"run", "--kernel", kernel, "--chroot", kernel}, "--chroot " + kernel + ": not a directory"},
		{"empty", []string{"run", "--kernel", kernel, "--chroot="}, "--chroot: empty directory"},
		{"vsock outside", []string{"run", "--kernel", kernel, "--vsock-cid", "3", "--vsock-uds", out + "/v.sock", "--chroot", dir},
			"--vsock-uds " + out + "/v.sock is outside --chroot " + dir},
		{"metrics outside", []string{"run", "--kernel", kernel, "--metrics-socket", out + "/m.sock", "--chroot", dir},
			"--metrics-socket " + out + "/m.sock is outside --chroot " + dir},
		{"symlink out", []string{"run", "--kernel", kernel, "--metrics-socket", dir + "/out/m.sock", "--chroot", dir},
			"--metrics-socket " + dir + "/out/m.sock is outside --chroot " + dir},
		{"exec metrics outside", []string{"exec", "--kernel", kernel, "--metrics-socket", out + "/m.sock", "--chroot", dir, "--", "true"},
			"--metrics-socket " + out + "/m.sock is outside --chroot " + dir},
		{"vhost-user socket outside", []string{"vhost-user-vsock", "--socket", out + "/vhu.sock", "--uds-path", dir + "/run/v.sock", "--chroot", dir},
			"--socket " + out + "/vhu.sock is outside --chroot " + dir},
		{"vhost-user no /proc", []string{"vhost-user-vsock", "--socket", dir + "/run/vhu.sock", "--uds-path", dir + "/run/v.sock", "--chroot", dir},
			"--chroot " + dir + ": vhost-user-vsock needs /proc mounted inside it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "symlink out" {
				if err := os.Symlink(out, filepath.Join(dir, "out")); err != nil {
					t.Fatal(err)
				}
			}
			wantError(t, 2, tc.args, tc.want)
		})
	}
}

// drain returns the lines waiting in lines.
func drain(lines chan string) []string {
	var got []string
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				return got
			}
			got = append(got, l)
		default:
			return got
		}
	}
}
