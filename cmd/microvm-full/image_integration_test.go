package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/internal/testing/testenv"
	"github.com/microvm/microvm/internal/testing/testimage"
)

// tarEntry is one entry of a test layer.
type tarEntry = testimage.Entry

// writeBusyboxImage writes, as an OCI layout directory, a two-layer image
// of Debian's static busybox: the second layer deletes a file of the first
// (a whiteout) and adds one; the configuration sets Env, WorkingDir, User
// (a name, resolved from the image's /etc/passwd) and Cmd.
// extra entries go into the top layer.
func writeBusyboxImage(t *testing.T, extra ...tarEntry) string {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		testenv.Missing(t, "static busybox: %v (apt-get install busybox-static)", err)
	}
	dir := func(name string, mode int64, uid int) tarEntry {
		return tarEntry{Hdr: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, Uid: uid, Gid: uid}}
	}
	file := func(name string, mode int64, uid int, body string) tarEntry {
		return tarEntry{Hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Uid: uid, Gid: uid}, Body: []byte(body)}
	}
	base := []tarEntry{
		dir("bin/", 0o755, 0), dir("etc/", 0o755, 0), dir("data/", 0o755, 1000), dir("tmp/", 0o1777, 0),
		{Hdr: tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755}, Body: bb},
		file("etc/passwd", 0o644, 0, "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/data:/bin/sh\n"),
		file("etc/group", 0o644, 0, "root:x:0:\napp:x:1000:\n"),
		file("data/old.txt", 0o644, 1000, "old\n"),
		file("data/keep.txt", 0o644, 1000, "keep\n"),
	}
	for _, applet := range []string{"sh", "id", "pwd", "ls", "cat", "echo", "mount", "grep", "touch", "rm", "stat", "tr"} {
		base = append(base, tarEntry{Hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + applet, Linkname: "busybox", Mode: 0o777}})
	}
	top := append([]tarEntry{
		file("data/.wh.old.txt", 0o644, 0, ""),
		file("data/new.txt", 0o644, 1000, "new\n"),
	}, extra...)
	img := testimage.Of(t, v1.Config{
		Env:        []string{"PATH=/bin", "FOO=from-image"},
		WorkingDir: "/data",
		User:       "app",
		Cmd:        []string{"sh", "-c", "echo default-cmd as $(id -u)"},
	}, "amd64", testimage.Layer(t, base), testimage.Layer(t, top))
	out := filepath.Join(t.TempDir(), "oci")
	p, err := layout.Write(out, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestExecImage: OCI images as root file systems under Linux. A two-layer
// busybox image, imported from an OCI layout: exec --image applies its
// Env, WorkingDir, User and Cmd as docker run does, shows the whiteout's
// effect and the image's owners, writes go to the VM's own layer (a second
// VM does not see them) and the image's file is untouched; a named VM from
// the image gives exec --vm the same defaults. Then Debian 12, built from
// Debian's archive, imported as a root file system tarball (on the host,
// before the box: hostImport): dpkg and apt run in it.
func TestExecImage(t *testing.T) {
	debian := hostImport(t, "debian", "debian:12", testenv.DebianImage(t))
	oci := writeBusyboxImage(t)
	state := t.TempDir()
	bin, kernel, agent := testenv.Binary(t), testenv.BzImage(t), testenv.Agent(t)
	microvmCmd := func(args ...string) (stdout, stderr string, code int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "MICROVM_STATE_DIR="+state)
		var o, e strings.Builder
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			code = ee.ExitCode()
		default:
			t.Fatal(err)
		}
		return o.String(), e.String(), code
	}
	must := func(args ...string) string {
		t.Helper()
		out, errOut, code := microvmCmd(args...)
		if code != 0 {
			t.Fatalf("microvm %s: status %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, out, errOut)
		}
		return out
	}
	vmFlags := []string{"--kernel", kernel, "--agent", agent, "--memory", "256M"}
	execImage := func(img string, cmd ...string) string {
		t.Helper()
		return must(append(append(append([]string{"exec"}, vmFlags...), "--image", img, "--"), cmd...)...)
	}

	must("image", "import", "--name", "bb:1", oci)
	if ls := must("image", "ls"); !strings.Contains(ls, "bb:1") {
		t.Fatalf("image ls after the import:\n%s", ls)
	}

	script := strings.Join([]string{
		"echo id=$(id -u):$(id -g) pwd=$(pwd) foo=$FOO home=$HOME",
		"ls /data | tr '\\n' ' '; echo",
		"stat -c 'owner=%u:%g' /data/keep.txt",
		"echo written > /data/w && cat /data/w",
		"grep -c ' / overlay ' /proc/mounts",
	}, "; ")
	out := execImage("bb:1", "sh", "-c", script)
	for _, want := range []string{
		"id=1000:1000 pwd=/data foo=from-image home=/",
		"keep.txt new.txt \n",
		"owner=1000:1000",
		"written",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("exec --image bb:1 output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "old.txt") {
		t.Errorf("the whiteout's file is visible:\n%s", out)
	}
	// A second VM from the same image: the first one's write is gone.
	if out := execImage("bb:1", "sh", "-c", "ls /data/w 2>&1 || echo absent"); !strings.Contains(out, "absent") {
		t.Errorf("a second VM sees the first one's write:\n%s", out)
	}
	// No command: the image's Cmd, as the image's User.
	if out := must(append(append([]string{"exec"}, vmFlags...), "--image", "bb:1")...); !strings.Contains(out, "default-cmd as 1000") {
		t.Errorf("exec --image without a command: %q, want the image's Cmd run as 1000", out)
	}
	// --user and --env override the image's.
	if out := execImage("bb:1", "sh", "-c", "echo $(id -u) $FOO"); !strings.Contains(out, "1000 from-image") {
		t.Errorf("defaults: %q", out)
	}
	if out := must(append(append([]string{"exec"}, vmFlags...), "--image", "bb:1", "--user", "0", "--env", "FOO=flag",
		"--", "sh", "-c", "echo $(id -u) $FOO")...); !strings.Contains(out, "0 flag") {
		t.Errorf("--user 0 --env FOO=flag: %q", out)
	}

	// A named VM from the image: exec --vm has the image's defaults.
	must(append(append([]string{"run", "--name", "imgvm", "--detach"}, vmFlags...), "--image", "bb:1", "--idle")...)
	defer microvmCmd("rm", "-f", "imgvm")
	if out := must("exec", "--vm", "imgvm", "--", "sh", "-c", "echo $(id -u) $(pwd) $FOO"); !strings.Contains(out, "1000 /data from-image") {
		t.Errorf("exec --vm in an image VM: %q, want the image's user, directory and environment", out)
	}
	// exec --vm -t: the command runs on a pty of the host terminal's size.
	if out := execTTY(t, bin, state, "exec", "--vm", "imgvm", "-it", "--", "sh", "-c", "tty; stty size"); !strings.Contains(out, "/dev/pts/") ||
		!strings.Contains(out, "33 77") {
		t.Errorf("exec --vm -t: terminal output %q, want a /dev/pts/N of 33 rows, 77 columns", out)
	}
	if ls := must("ls"); !strings.Contains(ls, "image bb:1") {
		t.Errorf("ls does not show the image:\n%s", ls)
	}
	must("stop", "imgvm")

	// run --image: the image's main process, its output on the console and
	// its status the run's, as docker run.
	out, errOut, code := microvmCmd(append(append([]string{"run", "--name", "mainvm"}, vmFlags...),
		"--image", "bb:1", "--", "sh", "-c", "echo main-out as $(id -u); exit 7")...)
	if code != 7 || !strings.Contains(out, "main-out as 1000") {
		t.Errorf("run --image -- CMD: status %d, want 7; stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	must("rm", "mainvm")

	// Debian 12 from Debian's archive, which hostImport imported (a store
	// of its own, as this state's VMs live in a temporary directory).
	state = t.TempDir()
	linkImages(t, state, debian)
	out = execImage("debian:12", "sh", "-c",
		"cat /etc/debian_version; dpkg-query -W -f='${Package} ${Status}\\n' dpkg; apt-get --version | head -n 1; "+
			"echo x > /usr/local/w && cat /usr/local/w")
	for _, want := range []string{"12.", "dpkg install ok installed", "apt 2.", "x"} {
		if !strings.Contains(out, want) {
			t.Errorf("Debian 12: output lacks %q:\n%s", want, out)
		}
	}
}

// execTTY runs microvm with a new pseudo-terminal of 33x77 as its stdin
// and stdout, as a user's terminal, and returns what the terminal shows.
func execTTY(t *testing.T, bin, state string, args ...string) string {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetUint32(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.IoctlSetWinsize(int(s.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 33, Col: 77}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "MICROVM_STATE_DIR="+state)
	var stderr strings.Builder
	cmd.Stdin, cmd.Stdout, cmd.Stderr = s, s, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	var out bytes.Buffer
	done := make(chan struct{})
	go func() { io.Copy(&out, m); close(done) }() // EIO once the last slave fd closes
	if err := cmd.Wait(); err != nil {
		t.Errorf("microvm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Error("the terminal did not close")
	}
	return out.String()
}
