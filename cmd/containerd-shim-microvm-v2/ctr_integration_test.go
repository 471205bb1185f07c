package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/microvm/microvm/internal/containerdshim"
	"github.com/microvm/microvm/internal/testing/testenv"
	"github.com/microvm/microvm/internal/testing/testimage"
)

// runtimeName is what ctr's --runtime and containerd's config call the shim.
const runtimeName = "io.containerd.microvm.v2"

// testImage is the busybox image the tests import.
const testImage = "microvm.test/busybox:1"

// ctrEnv is a containerd of the test's own: its root, state, sockets and
// configuration in a temporary directory, the shim's directory first in
// its PATH (containerd finds containerd-shim-microvm-v2 there), and the
// kernel and agent the shim boots in its environment, which containerd
// passes to its shims.
type ctrEnv struct {
	t          *testing.T
	dir        string
	sock       string
	config     string
	env        []string
	containerd string
	ctr        string
	shim       string
	log        string

	snapshotter string // ctr's; "" is native
	ns          string // ctr's namespace: "test", or CRI's "k8s.io"

	cmd    *exec.Cmd // the running containerd
	waited chan error
}

// startContainerd starts Debian's containerd (apt-get install containerd)
// and stops it at the end of the test; the CRI plugin is off (ctr only).
func startContainerd(t *testing.T) *ctrEnv {
	t.Helper()
	return startContainerdWith(t, func(*ctrEnv) (string, string) {
		return `disabled_plugins = ["io.containerd.grpc.v1.cri", ` + unusedSnapshotters + "]\n", ""
	})
}

// unusedSnapshotters are the snapshotters that cannot work here; turned
// off, they keep containerd's log short.
const unusedSnapshotters = `"io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"`

// startContainerdWith is startContainerd with more configuration:
// config(e) returns top-level keys (before any table) and tables for
// containerd's config.toml.
func startContainerdWith(t *testing.T, config func(*ctrEnv) (top, tables string)) *ctrEnv {
	t.Helper()
	containerd, err := exec.LookPath("containerd")
	if err != nil {
		testenv.Missing(t, "containerd: %v (apt-get install containerd)", err)
	}
	ctr, err := exec.LookPath("ctr")
	if err != nil {
		testenv.Missing(t, "ctr: %v (apt-get install containerd)", err)
	}
	e := &ctrEnv{t: t, dir: t.TempDir(), ctr: ctr, containerd: containerd, shim: testenv.Shim(t), ns: "test"}
	e.sock = filepath.Join(e.dir, "containerd.sock")
	e.log = filepath.Join(e.dir, "containerd.log")
	top, tables := config(e)
	cfg := fmt.Sprintf(`version = 2
root = %q
state = %q
%s[grpc]
  address = %q
[ttrpc]
  address = %q
%s`, filepath.Join(e.dir, "root"), filepath.Join(e.dir, "state"), top, e.sock, e.sock+".ttrpc", tables)
	e.config = filepath.Join(e.dir, "config.toml")
	if err := os.WriteFile(e.config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	e.env = append(os.Environ(),
		"PATH="+filepath.Dir(e.shim)+":"+os.Getenv("PATH"),
		"MICROVM_KERNEL="+testenv.BzImage(t),
		"MICROVM_AGENT="+testenv.Agent(t),
		"MICROVM_SHIM_MEMORY=256M")
	e.start()
	t.Cleanup(func() {
		e.stop()
		if t.Failed() {
			b, _ := os.ReadFile(e.log)
			t.Logf("containerd log:\n%s", tail(string(b), 30000))
		}
	})
	return e
}

// start starts containerd and waits until it answers.
func (e *ctrEnv) start() {
	t := e.t
	t.Helper()
	logf, err := os.OpenFile(e.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(e.containerd, "--config", e.config, "--log-level", "debug")
	cmd.Stdout, cmd.Stderr, cmd.Env = logf, logf, e.env
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	e.cmd, e.waited = cmd, make(chan error, 1)
	go func(w chan error) { w <- cmd.Wait() }(e.waited)
	deadline := time.Now().Add(90 * time.Second)
	for {
		if _, _, code := e.run("version"); code == 0 {
			return
		}
		select {
		case err := <-e.waited:
			b, _ := os.ReadFile(e.log)
			e.cmd = nil
			t.Fatalf("containerd exited: %v\n%s", err, tail(string(b), 30000))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("containerd did not answer within 90s")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// stop stops containerd (SIGTERM; its shims keep running, as under
// systemd's KillMode=process).
func (e *ctrEnv) stop() {
	if e.cmd == nil {
		return
	}
	e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.waited:
	case <-time.After(30 * time.Second):
		e.cmd.Process.Kill()
		<-e.waited
	}
	e.cmd = nil
}

// run runs ctr against the test's containerd in namespace "test", with
// e.snapshotter, by default the native one (a directory per snapshot:
// works on any file system, the box's tmpfs included).
func (e *ctrEnv) run(args ...string) (stdout, stderr string, code int) {
	sn := e.snapshotter
	if sn == "" {
		sn = "native"
	}
	return e.tool([]string{"CONTAINERD_SNAPSHOTTER=" + sn}, e.ctr,
		append([]string{"--address", e.sock, "--namespace", e.ns}, args...)...)
}

// tool runs a command-line client (ctr, crictl) with env added to the
// test's environment, for at most 5 minutes, and returns its output and
// exit status; a client that cannot run at all fails the test.
func (e *ctrEnv) tool(env []string, bin string, args ...string) (stdout, stderr string, code int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var o, s bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &s
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		e.t.Fatalf("%s %s: %v", filepath.Base(bin), strings.Join(args, " "), err)
	}
	return o.String(), s.String(), code
}

// must runs ctr and fails the test unless it succeeds.
func (e *ctrEnv) must(args ...string) string {
	e.t.Helper()
	out, errOut, code := e.run(args...)
	if code != 0 {
		e.t.Fatalf("ctr %s: status %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// importBusybox imports a one-layer image of Debian's static busybox.
func (e *ctrEnv) importBusybox() {
	e.t.Helper()
	e.importImage(testImage, []string{"sh"})
}

// importImage imports the busybox image as ref, with cmd as its command.
func (e *ctrEnv) importImage(ref string, cmd []string) {
	e.t.Helper()
	e.importImageWith(ref, cmd, nil)
}

// importImageWith is importImage with more entries in the image's layer.
func (e *ctrEnv) importImageWith(ref string, cmd []string, more []testimage.Entry) {
	t := e.t
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		testenv.Missing(t, "static busybox: %v (apt-get install busybox-static)", err)
	}
	dir := func(n string) testimage.Entry {
		return testimage.Entry{Hdr: tar.Header{Typeflag: tar.TypeDir, Name: n, Mode: 0o755}}
	}
	entries := []testimage.Entry{dir("bin/"), dir("etc/"), dir("tmp/"), dir("proc/"), dir("sys/"), dir("dev/"),
		{Hdr: tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755}, Body: bb},
		{Hdr: tar.Header{Typeflag: tar.TypeReg, Name: "etc/passwd", Mode: 0o644}, Body: []byte("root:x:0:0:root:/:/bin/sh\n")},
	}
	for _, a := range []string{"sh", "echo", "cat", "uname", "sleep", "id", "hostname", "ls", "mount", "true", "nc", "grep", "touch", "wc"} {
		entries = append(entries, testimage.Entry{Hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777}})
	}
	img := testimage.Of(t, v1.Config{Env: []string{"PATH=/bin"}, Cmd: cmd}, "amd64", testimage.Layer(t, append(entries, more...)))
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(e.dir, "image.tar")
	if err := tarball.WriteToFile(path, tag, img); err != nil {
		t.Fatal(err)
	}
	e.must("images", "import", path)
}

// shimPids lists the running processes of the shim binary.
func (e *ctrEnv) shimPids() []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, d := range ents {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if exe, err := os.Readlink(filepath.Join("/proc", d.Name(), "exe")); err == nil && exe == e.shim {
			pids = append(pids, pid)
		}
	}
	return pids
}

// leftovers fails the test when a shim process, a mount under the test's
// directory, a root file system image or another file of the shim's is
// left once every container is gone. containerd removes a bundle after the
// delete action of a killed shim returns, in its own goroutine, so files
// in the state directory get the same grace as the processes.
func (e *ctrEnv) leftovers() {
	t := e.t
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for (len(e.shimPids()) > 0 || len(e.stateFiles()) > 0) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if p := e.shimPids(); len(p) > 0 {
		t.Errorf("shim processes left running: %v", p)
	}
	if e.mounted() {
		t.Errorf("mounts left:\n%s", e.mounts())
	}
	if left, _ := filepath.Glob(filepath.Join(shimVolumes, "*")); len(left) > 0 {
		t.Errorf("shared directories left: %v", left)
	}
	for _, p := range e.stateFiles() {
		t.Errorf("file left: %s", p)
	}
}

// stateFiles are the shim's files (microvm-*) under containerd's state
// directory.
func (e *ctrEnv) stateFiles() []string {
	var left []string
	filepath.WalkDir(filepath.Join(e.dir, "state"), func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), "microvm-") {
			left = append(left, p)
		}
		return nil
	})
	return left
}

// shimVolumes is where the shim binds volumes for the VM's shared
// directory (internal/containerdshim volumesRoot).
const shimVolumes = "/run/microvm-shim"

// mounts are the mount table's lines under the test's directory or the
// shim's volumes.
func (e *ctrEnv) mounts() string {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		e.t.Fatal(err)
	}
	var b strings.Builder
	for _, l := range strings.Split(string(mi), "\n") {
		if strings.Contains(l, e.dir) || strings.Contains(l, " "+shimVolumes+"/") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func (e *ctrEnv) mounted() bool { return e.mounts() != "" }

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// TestCtrRun: containerd (Debian's, with ctr) runs containers in microVMs
// through the shim. ctr run --rm: the container's stdout and stderr reach
// ctr apart, its exit status is ctr's, and nothing is left behind. Then a
// detached container (on the overlayfs snapshotter where it works): ctr
// task exec runs a second process in its VM; pause and resume reach the
// VM; containerd restarted meanwhile finds the container running and
// reaches it again; a shim killed with SIGKILL takes its VM with it, and
// containerd sees the task stop with nothing left running or mounted.
func TestCtrRun(t *testing.T) {
	testenv.RequireKVM(t, testenv.NeedLinux)
	e := startContainerd(t)
	e.importBusybox()

	out, errOut, code := e.run("run", "--runtime", runtimeName, "--rm", testImage, "c1",
		"sh", "-c", "echo hello from $(uname -s) as $(id -u); echo to-stderr >&2; exit 3")
	t.Logf("ctr run: status %d, stdout %q, stderr %q", code, out, errOut)
	if code != 3 || !strings.Contains(out, "hello from Linux as 0") || !strings.Contains(errOut, "to-stderr") ||
		strings.Contains(out, "to-stderr") {
		t.Fatalf("ctr run: status %d (want 3)\nstdout: %q\nstderr: %q", code, out, errOut)
	}
	if l := e.must("containers", "ls", "-q"); strings.TrimSpace(l) != "" {
		t.Errorf("containers left after --rm: %q", l)
	}
	e.leftovers()

	// The overlayfs snapshotter where this file system takes it: its
	// snapshot is mounted in the bundle, which the shim must undo.
	if plugins := e.must("plugins", "ls"); regexp.MustCompile(`overlayfs\s+\S+\s+ok`).MatchString(plugins) {
		e.snapshotter = "overlayfs"
	} else {
		t.Log("the overlayfs snapshotter is not available here; native it is")
	}
	e.must("run", "-d", "--runtime", runtimeName, testImage, "c2", "sleep", "600")
	if e.snapshotter == "overlayfs" && !e.mounted() {
		t.Error("overlayfs snapshot of a running container: not mounted in its bundle")
	}
	if got := e.must("task", "exec", "--exec-id", "e1", "c2", "sh", "-c", "echo exec in $(uname -s)"); !strings.Contains(got, "exec in Linux") {
		t.Errorf("ctr task exec: stdout %q", got)
	}
	// Pause and resume stop and restart the VM's vCPUs.
	e.must("task", "pause", "c2")
	if l := e.must("task", "ls"); !strings.Contains(l, "PAUSED") {
		t.Errorf("after ctr task pause, task ls:\n%s", l)
	}
	e.must("task", "resume", "c2")
	if got := e.must("task", "exec", "--exec-id", "e-resumed", "c2", "echo", "resumed"); !strings.Contains(got, "resumed") {
		t.Errorf("ctr task exec after resume: stdout %q", got)
	}
	// containerd restarts while the container runs: the shim keeps it,
	// and the new containerd reconnects to the shim's socket.
	e.stop()
	e.start()
	if l := e.must("task", "ls"); !strings.Contains(l, "RUNNING") {
		t.Errorf("after containerd restarted, task ls:\n%s", l)
	}
	if got := e.must("task", "exec", "--exec-id", "e2", "c2", "echo", "after restart"); !strings.Contains(got, "after restart") {
		t.Errorf("ctr task exec after containerd restarted: stdout %q", got)
	}
	pids := e.shimPids()
	if len(pids) != 1 {
		t.Fatalf("shim processes for one container: %v", pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		l := e.must("task", "ls")
		if !strings.Contains(l, "RUNNING") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("task still running a minute after its shim was killed:\n%s", l)
		}
		time.Sleep(200 * time.Millisecond)
	}
	e.run("task", "delete", "c2")
	e.must("containers", "delete", "c2")
	e.leftovers()
}

// sandboxAnnotation is CRI's annotation that groups a pod's containers;
// Manager.Start puts the containers that carry the same value in one shim,
// so one VM. ctr sets it here as kubelet's CRI would.
const sandboxAnnotation = "io.kubernetes.cri.sandbox-id"

// TestCtrPod: two containers of one pod (grouped by CRI's sandbox
// annotation) run in one VM, each in its own namespaces: the second has a
// read-only root, a tmpfs and a bind-mounted volume, talks to the first
// over localhost, and is PID 1 of its own PID namespace; it ends and is
// removed while the first runs on; deleting the first ends the VM with
// nothing left.
func TestCtrPod(t *testing.T) {
	testenv.RequireKVM(t, testenv.NeedLinux)
	e := startContainerd(t)
	e.importBusybox()
	vol := filepath.Join(e.dir, "volume")
	if err := os.MkdirAll(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vol, "greeting"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	e.must("run", "-d", "--runtime", runtimeName, "--annotation", sandboxAnnotation+"=pod1", testImage, "pod1",
		"sh", "-c", "echo pong | nc -l -p 8080; sleep 600")
	out, errOut, code := e.run("run", "--rm", "--runtime", runtimeName, "--annotation", sandboxAnnotation+"=pod1",
		"--read-only", "--mount", "type=tmpfs,src=tmpfs,dst=/scratch,options=nosuid:nodev",
		"--mount", "type=bind,src="+vol+",dst=/data,options=rbind:ro",
		testImage, "app1", "sh", "-c",
		"for i in 1 2 3 4 5 6 7 8 9 10; do nc 127.0.0.1 8080 && break; sleep 1; done; "+
			"touch /x 2>/dev/null && echo root=rw || echo root=ro; echo t > /scratch/f && echo scratch=$(cat /scratch/f); "+
			"cat /data/greeting; echo pid=$$; echo procs=$(ls /proc | grep -c '^[0-9]')")
	t.Logf("app1: status %d, stdout %q, stderr %q", code, out, errOut)
	for _, want := range []string{"pong\n", "root=ro\n", "scratch=t\n", "from the host\n", "pid=1\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("app1 output lacks %q", want)
		}
	}
	if m := regexp.MustCompile(`procs=(\d+)`).FindStringSubmatch(out); m == nil || m[1] == "0" || len(m[1]) > 1 {
		t.Errorf("app1 sees %v processes: want those of its own PID namespace (a few)", m)
	}
	if code != 0 {
		t.Errorf("app1: status %d", code)
	}
	if p := e.shimPids(); len(p) != 1 {
		t.Errorf("shim processes for one pod: %v, want 1", p)
	}
	// The pod's first container runs on after the second is gone.
	if got := e.must("task", "exec", "--exec-id", "e1", "pod1", "sh", "-c", "echo pid=$$; ls /scratch 2>&1; true"); !strings.Contains(got, "No such file") {
		t.Errorf("an exec in pod1 sees app1's tmpfs, or failed: %q", got)
	}
	e.must("task", "kill", "-s", "SIGKILL", "pod1")
	deadline := time.Now().Add(60 * time.Second)
	for strings.Contains(e.must("task", "ls"), "RUNNING") {
		if time.Now().After(deadline) {
			t.Fatal("pod1 still running a minute after SIGKILL")
		}
		time.Sleep(200 * time.Millisecond)
	}
	e.must("task", "delete", "pod1")
	e.must("containers", "delete", "pod1")
	e.leftovers()
}

// TestCtrRootfs9p: a pod whose roots reach its VM over virtio-9p (the
// annotation io.microvm.shim.rootfs=9p): each container's / is a 9p mount,
// nothing is copied, what a container writes lands in its snapshot on the
// host and what the host writes there shows in the guest; a second
// container takes the pod's method, its read-only root refusing writes;
// deleting the pod leaves nothing mounted.
func TestCtrRootfs9p(t *testing.T) {
	testenv.RequireKVM(t, testenv.NeedLinux)
	e := startContainerd(t)
	e.importBusybox()
	pod := []string{"--runtime", runtimeName, "--annotation", sandboxAnnotation + "=p9"}
	e.must(append(append([]string{"run", "-d"}, pod...), "--annotation", containerdshim.RootfsAnnotation+"=9p",
		testImage, "p9", "sh", "-c", "echo from the guest > /written-by-p9; sleep 600")...)

	// The file the container wrote is in its snapshot on the host.
	var hostFile string
	for deadline := time.Now().Add(time.Minute); hostFile == "" && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		filepath.WalkDir(filepath.Join(e.dir, "root"), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.Name() == "written-by-p9" {
				hostFile = p
			}
			return nil
		})
	}
	if hostFile == "" {
		t.Fatal("the container's write is not in any snapshot on the host")
	}
	if b, err := os.ReadFile(hostFile); err != nil || string(b) != "from the guest\n" {
		t.Errorf("%s: %q, %v", hostFile, b, err)
	}
	if err := os.WriteFile(filepath.Join(filepath.Dir(hostFile), "written-by-host"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got := e.must("task", "exec", "--exec-id", "e1", "p9", "sh", "-c", "cat /written-by-host; cat /proc/mounts")
	t.Logf("exec in p9: %q", got)
	root9p := regexp.MustCompile(`(?m)^\S+ / 9p (\S+)`)
	if !strings.Contains(got, "from the host\n") {
		t.Errorf("the host's write does not show in the container: %q", got)
	}
	if m := root9p.FindStringSubmatch(got); m == nil || !strings.HasPrefix(m[1], "rw") {
		t.Errorf("p9's root is not a writable 9p mount: %v", m)
	}

	out, errOut, code := e.run(append(append([]string{"run", "--rm"}, pod...), "--read-only", testImage, "p9b", "sh", "-c",
		"touch /x 2>/dev/null && echo root=rw || echo root=ro; cat /etc/passwd; cat /proc/mounts; ls /written-by-p9 2>&1; true")...)
	t.Logf("p9b: status %d, stdout %q, stderr %q", code, out, errOut)
	if code != 0 || !strings.Contains(out, "root=ro\n") || !strings.Contains(out, "root:x:0:0") {
		t.Errorf("p9b: status %d, output %q", code, out)
	}
	if m := root9p.FindStringSubmatch(out); m == nil || !strings.HasPrefix(m[1], "ro") {
		t.Errorf("p9b's root is not a read-only 9p mount: %v", m)
	}
	if !strings.Contains(out, "No such file") {
		t.Errorf("p9b sees p9's file: its root is not its own snapshot")
	}

	e.must("task", "kill", "-s", "SIGKILL", "p9")
	e.waitStopped("p9")
	e.must("task", "delete", "p9")
	e.must("containers", "delete", "p9")
	e.leftovers()
}
