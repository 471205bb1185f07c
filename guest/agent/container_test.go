package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/seccomp"
)

// busyboxApplets are linked in the test root.
var busyboxApplets = []string{"sh", "cat", "echo", "hostname", "ls", "sleep", "grep", "touch", "id", "readlink", "mkdir", "seq", "setsid"}

// containerRoot makes a root file system of the host's static busybox, or
// skips the test where containers cannot be made (not root, no busybox).
func containerRoot(t *testing.T) string {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("containers need root (mount, pivot_root, new namespaces)")
	}
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("no busybox on this host (scripts/deps test installs busybox-static)")
	}
	if out, err := exec.Command("ldd", bb).CombinedOutput(); err == nil && !strings.Contains(string(out), "not a dynamic") {
		t.Skipf("%s is not static: %s", bb, out)
	}
	root := t.TempDir()
	for _, d := range []string{"bin", "proc", "tmp", "dev", "sys"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, a := range busyboxApplets {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
	// A link that points out of the root: a mount below it must stay
	// inside (at /escape/below of the container).
	if err := os.Symlink("/../../../escape", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	return root
}

// ociMounts are the mounts containerd's default spec gives a container.
func ociMounts() []*agentapi.Mount {
	return []*agentapi.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"ro", "nosuid", "noexec", "nodev"}},
		{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev"}},
		{Destination: "/link/below", Type: "tmpfs", Source: "tmpfs"},
	}
}

func TestContainerCreate(t *testing.T) {
	root := containerRoot(t)
	host, _ := os.Hostname()
	h := newHarness(t, Options{}, false)
	uid, gid := uint32(0), uint32(0)
	r := run(testCtx(t), h.client, &agentapi.Cmd{
		Argv: sh(`echo pid=$$; echo host=$(hostname); grep ^CapEff /proc/self/status; ` +
			`touch /x 2>/dev/null && echo rw || echo ro; echo t > /tmp/t && echo tmp=$(cat /tmp/t); ` +
			`ls /dev/null /dev/zero /dev/urandom /dev/pts/ptmx >/dev/null && echo dev; echo nofile=$(ulimit -n); ` +
			`ls -d /escape/below`),
		Env:       []string{"PATH=/bin"},
		Dir:       "/tmp",
		UID:       &uid,
		GID:       &gid,
		Container: &agentapi.Container{Id: "c1", Create: &agentapi.ContainerRoot{Root: root, Readonly: true, Hostname: "pod-a", Mounts: ociMounts()}},
		Rlimits:   []*agentapi.Rlimit{{Resource: 7 /* RLIMIT_NOFILE */, Soft: 123, Hard: 123}},
		// CAP_CHOWN (0) and CAP_KILL (5).
		Capabilities:    &agentapi.Capabilities{Bounding: []uint32{0, 5}, Effective: []uint32{0, 5}, Permitted: []uint32{0, 5}},
		NoNewPrivileges: true,
	})
	if r.err != nil || r.exit.Code != 0 {
		t.Fatalf("exec: %v, %v; stderr %q", r.exit, r.err, r.stderr.String())
	}
	want := "pid=1\nhost=pod-a\nCapEff:\t0000000000000021\nro\ntmp=t\ndev\nnofile=123\n/escape/below\n"
	if r.stdout.String() != want {
		t.Errorf("output\n%s\nwant\n%s\nstderr %q", r.stdout.String(), want, r.stderr.String())
	}
	if now, _ := os.Hostname(); now != host {
		t.Errorf("the host's name changed from %q to %q", host, now)
	}
	if _, err := os.Stat("/escape"); err == nil {
		t.Error("a mount below a link out of the root was made outside it")
	}
	if _, err := os.Stat(filepath.Join(root, "x")); err == nil {
		t.Error("the read-only root was written")
	}
	if _, err := os.Stat(filepath.Join(root, "tmp", "t")); err == nil {
		t.Error("/tmp was not a tmpfs of the container's")
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mi), root) {
		t.Errorf("mounts of the container are left in the agent's namespace:\n%s", mi)
	}
	if _, err := os.Stat(filepath.Join(containerDirBase, "c1")); err == nil {
		t.Errorf("%s/c1 is left behind", containerDirBase)
	}
}

func TestContainerJoin(t *testing.T) {
	root := containerRoot(t)
	h := newHarness(t, Options{}, false)
	ctx := testCtx(t)
	stdinR, stdinW := io.Pipe()
	ready := make(chan struct{})
	initOut := &notifyWriter{want: "ready", ready: ready}
	initDone := make(chan *result, 1)
	go func() {
		r := &result{}
		cmd := &agentapi.Cmd{
			Argv:      sh(`echo mark > /tmp/mark; echo ready; read x; echo bye`),
			Env:       []string{"PATH=/bin"},
			Container: &agentapi.Container{Id: "pod", Create: &agentapi.ContainerRoot{Root: root, Hostname: "pod-b", Mounts: ociMounts()}},
			Stdin:     stdinR,
			Stdout:    initOut,
			Stderr:    &r.stderr,
		}
		r.exit, r.err = h.client.Exec(ctx, cmd)
		initDone <- r
	}()
	select {
	case <-ready:
	case r := <-initDone:
		t.Fatalf("the container's init ended early: %v, %v; stderr %q", r.exit, r.err, r.stderr.String())
	case <-ctx.Done():
		t.Fatal("the container's init never got ready")
	}

	// A second container with the same id is refused.
	r := run(ctx, h.client, &agentapi.Cmd{Argv: []string{"true"},
		Container: &agentapi.Container{Id: "pod", Create: &agentapi.ContainerRoot{Root: root}}})
	if status.Code(r.err) != codes.AlreadyExists {
		t.Errorf("second create of the same id: %v, want AlreadyExists", r.err)
	}

	// A joining process sees the init's tmpfs, hostname and PID namespace,
	// and is in its mount namespace: its mount table is the container's.
	h.srv.ctrs.mu.Lock()
	initPid := h.srv.ctrs.ids["pod"].pid
	h.srv.ctrs.mu.Unlock()
	initMnt, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", initPid))
	if err != nil {
		t.Fatal(err)
	}
	r = run(ctx, h.client, &agentapi.Cmd{
		Argv:      sh(`readlink /proc/self/ns/mnt; grep -c ' /tmp tmpfs ' /proc/self/mounts`),
		Env:       []string{"PATH=/bin"},
		Container: &agentapi.Container{Id: "pod"},
	})
	if got := strings.Fields(r.stdout.String()); r.err != nil || len(got) != 2 || got[0] != initMnt || got[1] != "1" {
		t.Errorf("join: mount namespace and its /tmp in /proc/self/mounts: %q (want %s and 1), %v; stderr %q",
			r.stdout.String(), initMnt, r.err, r.stderr.String())
	}
	r = run(ctx, h.client, &agentapi.Cmd{
		Argv:      sh(`cat /tmp/mark; hostname; echo pid=$$; ls /proc | grep -c '^[0-9]'`),
		Env:       []string{"PATH=/bin"},
		Container: &agentapi.Container{Id: "pod"},
	})
	if r.err != nil || r.exit.Code != 0 {
		t.Fatalf("join: %v, %v; stderr %q", r.exit, r.err, r.stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(r.stdout.String()), "\n")
	if len(lines) != 4 || lines[0] != "mark" || lines[1] != "pod-b" || lines[2] == "pid=1" {
		t.Errorf("join output %q: want mark, pod-b, a pid other than 1, a count", lines)
	}
	// Processes of the container: its init, this shell, ls and grep (a
	// view of the host's PID namespace would show many more).
	if len(lines) == 4 && lines[3] != "4" && lines[3] != "3" {
		t.Errorf("the joining process sees %s processes, want those of the container", lines[3])
	}

	// A program that is not in the container is 127, with a message.
	r = run(ctx, h.client, &agentapi.Cmd{Argv: []string{"no-such-program"}, Env: []string{"PATH=/bin"},
		Container: &agentapi.Container{Id: "pod"}})
	if r.err != nil || r.exit.Code != 127 || !strings.Contains(r.stderr.String(), "no-such-program") {
		t.Errorf("missing program: %v, %v; stderr %q: want 127 naming it", r.exit, r.err, r.stderr.String())
	}

	stdinW.Close()
	select {
	case r := <-initDone:
		if r.err != nil || r.exit.Code != 0 {
			t.Fatalf("init: %v, %v; stderr %q", r.exit, r.err, r.stderr.String())
		}
	case <-ctx.Done():
		t.Fatal("the init did not end after its stdin closed")
	}
	// The container ended with its init: joining it fails.
	deadline := time.Now().Add(5 * time.Second)
	for {
		r = run(ctx, h.client, &agentapi.Cmd{Argv: []string{"true"}, Container: &agentapi.Container{Id: "pod"}})
		if status.Code(r.err) == codes.FailedPrecondition || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if status.Code(r.err) != codes.FailedPrecondition {
		t.Errorf("join after the init ended: %v, %v; want FailedPrecondition", r.exit, r.err)
	}
}

func TestContainerBadRequests(t *testing.T) {
	h := newHarness(t, Options{}, false)
	ctx := testCtx(t)
	for name, cmd := range map[string]*agentapi.Cmd{
		"bad id":        {Argv: []string{"true"}, Container: &agentapi.Container{Id: "../x", Create: &agentapi.ContainerRoot{Root: "/"}}},
		"relative root": {Argv: []string{"true"}, Container: &agentapi.Container{Id: "x", Create: &agentapi.ContainerRoot{Root: "rel"}}},
		"rlimits without a container": {Argv: []string{"true"},
			Rlimits: []*agentapi.Rlimit{{Resource: 7, Soft: 1, Hard: 1}}},
	} {
		if r := run(ctx, h.client, cmd); status.Code(r.err) != codes.InvalidArgument {
			t.Errorf("%s: %v, %v; want InvalidArgument", name, r.exit, r.err)
		}
	}
	r := run(ctx, h.client, &agentapi.Cmd{Argv: []string{"true"}, Container: &agentapi.Container{Id: "nobody"}})
	if status.Code(r.err) != codes.FailedPrecondition {
		t.Errorf("join of a container that does not exist: %v; want FailedPrecondition", r.err)
	}
}

func TestResolveIn(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "a", "b"), 0o755)
	os.Symlink("/a", filepath.Join(root, "abs"))
	os.Symlink("../../..", filepath.Join(root, "a", "up"))
	os.Symlink("loop", filepath.Join(root, "loop"))
	for _, c := range []struct{ in, want string }{
		{"/a/b", "/a/b"},
		{"/abs/b", "/a/b"},
		{"/a/up/c", "/c"},
		{"/../../d", "/d"},
		{"/abs/new/deeper", "/a/new/deeper"},
	} {
		got, err := resolveIn(root, c.in, false)
		if err != nil || got != filepath.Join(root, c.want) {
			t.Errorf("resolveIn(%q) = %q, %v; want %q", c.in, got, err, filepath.Join(root, c.want))
		}
		if fi, err := os.Stat(got); err != nil || !fi.IsDir() {
			t.Errorf("resolveIn(%q) did not make the directory: %v", c.in, err)
		}
	}
	if got, err := resolveIn(root, "/abs/file", true); err != nil {
		t.Errorf("file: %v", err)
	} else if fi, err := os.Stat(got); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("resolveIn with file did not make a file: %v", err)
	}
	if _, err := resolveIn(root, "/loop/x", false); err == nil {
		t.Error("a symlink loop resolved")
	}
}

func TestMountOptions(t *testing.T) {
	flags, data := mountOptions([]string{"nosuid", "ro", "rw", "mode=755", "rprivate", "size=1k", "rbind"})
	if want := uintptr(0x2 | 0x1000 | 0x4000); flags != want || data != "mode=755,size=1k" {
		t.Errorf("flags %#x data %q; want %#x and mode=755,size=1k", flags, data, want)
	}
}

// notifyWriter closes ready once it has seen want.
type notifyWriter struct {
	want  string
	ready chan struct{}
	buf   strings.Builder
	done  bool
}

func (w *notifyWriter) Write(p []byte) (int, error) {
	w.buf.Write(p)
	if !w.done && strings.Contains(w.buf.String(), w.want) {
		w.done = true
		close(w.ready)
	}
	return len(p), nil
}

// cgroupTests numbers the tests' cgroups.
var cgroupTests atomic.Int32

// cgroup2Base returns a cgroup v2 directory this test may make cgroups
// in (the unified hierarchy, mounted on its own on hybrid hosts), or skips.
func cgroup2Base(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		var st unix.Statfs_t
		if unix.Statfs(p, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			dir := filepath.Join(p, fmt.Sprintf("microvm-agent-test-%d-%d", os.Getpid(), cgroupTests.Add(1)))
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Skipf("cannot make a cgroup: %v", err)
			}
			t.Cleanup(func() {
				// The agent removes a container's cgroup once its
				// processes are gone, which may be after the test.
				for deadline := time.Now().Add(5 * time.Second); unix.Rmdir(dir) == unix.EBUSY && time.Now().Before(deadline); {
					time.Sleep(20 * time.Millisecond)
				}
			})
			return dir
		}
	}
	t.Skip("no cgroup v2 hierarchy on this host")
	return ""
}

func TestContainerCgroupAndStats(t *testing.T) {
	root := containerRoot(t)
	base := cgroup2Base(t)
	h := newHarness(t, Options{CgroupRoot: base}, false)
	ctx := testCtx(t)
	stdinR, stdinW := io.Pipe()
	ready := make(chan struct{})
	out := &notifyWriter{want: "ready", ready: ready}
	done := make(chan *result, 1)
	go func() {
		r := &result{}
		r.exit, r.err = h.client.Exec(ctx, &agentapi.Cmd{
			Argv:      sh(`i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; cat /proc/self/cgroup; echo ready; read x || true`),
			Env:       []string{"PATH=/bin"},
			Container: &agentapi.Container{Id: "stats", Create: &agentapi.ContainerRoot{Root: root, Mounts: ociMounts()}},
			Stdin:     stdinR, Stdout: out, Stderr: &r.stderr,
		})
		done <- r
	}()
	select {
	case <-ready:
	case r := <-done:
		t.Fatalf("container ended early: %v, %v; stderr %q", r.exit, r.err, r.stderr.String())
	}
	if want := "0::/" + filepath.Base(base) + "/stats"; !strings.Contains(out.buf.String(), want) {
		t.Errorf("/proc/self/cgroup of the container: %q, want a line %q", out.buf.String(), want)
	}
	st, err := agentapi.NewAgentClient(h.conn).ContainerStats(ctx, &agentapi.ContainerStatsRequest{Id: "stats"})
	if err != nil {
		t.Fatal(err)
	}
	if st.CpuUsageUsec == 0 || st.CpuUsageUsec < st.CpuUserUsec {
		t.Errorf("stats %v: want CPU time counted", st)
	}
	if _, err := agentapi.NewAgentClient(h.conn).ContainerStats(ctx, &agentapi.ContainerStatsRequest{Id: "other"}); status.Code(err) != codes.NotFound {
		t.Errorf("stats of a container that does not run: %v, want NotFound", err)
	}
	stdinW.Close()
	if r := <-done; r.err != nil || r.exit.Code != 0 {
		t.Fatalf("container: %v, %v", r.exit, r.err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(base, "stats")); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the container's cgroup is left after it ended")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Limits go to the container's cgroup where the hierarchy has the
// controllers (a cgroup v2 host, the guest), and are refused with
// FailedPrecondition, naming the file, where it does not (a hybrid host).
func TestContainerResources(t *testing.T) {
	root := containerRoot(t)
	base := cgroup2Base(t)
	ctrls, _ := os.ReadFile(filepath.Join(filepath.Dir(base), "cgroup.controllers"))
	haveMemory := strings.Contains(string(ctrls), "memory") && strings.Contains(string(ctrls), "pids")
	h := newHarness(t, Options{CgroupRoot: base}, false)
	r := run(testCtx(t), h.client, &agentapi.Cmd{
		Argv: sh(`cat /sys/fs/cgroup/$0/memory.max /sys/fs/cgroup/$0/pids.max`, filepath.Base(base)+"/limits"),
		Env:  []string{"PATH=/bin"},
		Container: &agentapi.Container{Id: "limits", Create: &agentapi.ContainerRoot{Root: root, Mounts: []*agentapi.Mount{
			{Destination: "/sys/fs/cgroup", Type: "cgroup2", Source: "cgroup2"}},
			Resources: &agentapi.Resources{MemoryMaxBytes: 64 << 20, PidsMax: 0}}},
	})
	if !haveMemory {
		if status.Code(r.err) != codes.FailedPrecondition || !strings.Contains(r.err.Error(), "memory.max") {
			t.Errorf("limits without a memory controller: %v, want FailedPrecondition naming memory.max", r.err)
		}
		return
	}
	if r.err != nil || r.stdout.String() != "67108864\nmax\n" {
		t.Errorf("limits: %v, %v, %q; want 67108864 and max", r.exit, r.err, r.stdout.String())
	}
}

func TestUpdateContainerErrors(t *testing.T) {
	h := newHarness(t, Options{}, false)
	c := agentapi.NewAgentClient(h.conn)
	if _, err := c.UpdateContainer(testCtx(t), &agentapi.UpdateContainerRequest{Id: "none"}); status.Code(err) != codes.NotFound {
		t.Errorf("update of a container that does not run: %v, want NotFound", err)
	}
	if _, err := c.UpdateContainer(testCtx(t), &agentapi.UpdateContainerRequest{Id: "../x"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("update with a bad id: %v, want InvalidArgument", err)
	}
}

// Started comes once the container's set-up is done: a process that joins
// right after it finds the container's mounts and hostname (before, it
// could land in the init's root before pivot_root).
func TestContainerJoinRightAfterStarted(t *testing.T) {
	root := containerRoot(t)
	h := newHarness(t, Options{}, false)
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	for i := 0; i < 5; i++ {
		id := fmt.Sprintf("quick%d", i)
		stream, err := h.client.Agent.Exec(ctx)
		if err != nil {
			t.Fatal(err)
		}
		start := &agentapi.ExecStart{Argv: []string{"sleep", "100"}, Env: []string{"PATH=/bin"},
			Container: &agentapi.Container{Id: id, Create: &agentapi.ContainerRoot{Root: root, Hostname: "quick", Mounts: ociMounts()}}}
		if err := stream.Send(&agentapi.ExecRequest{Msg: &agentapi.ExecRequest_Start{Start: start}}); err != nil {
			t.Fatal(err)
		}
		if resp, err := stream.Recv(); err != nil || resp.GetStarted() == nil {
			t.Fatalf("first message %v, %v; want started", resp, err)
		}
		r := run(ctx, h.client, &agentapi.Cmd{Argv: sh(`hostname; ls /proc/self/fd >/dev/null && echo proc`), Env: []string{"PATH=/bin"},
			Container: &agentapi.Container{Id: id}})
		if r.err != nil || r.stdout.String() != "quick\nproc\n" {
			t.Errorf("join right after started: %v, %v, %q; stderr %q", r.exit, r.err, r.stdout.String(), r.stderr.String())
		}
		stream.Send(&agentapi.ExecRequest{Msg: &agentapi.ExecRequest_Signal{Signal: int32(unix.SIGKILL)}})
		for {
			if resp, err := stream.Recv(); err != nil || resp.GetExit() != nil {
				break
			}
		}
	}
}

// Every limit is written each time, 0 as "max"; the CPU files only when a
// CPU limit is asked for, with the kernel's defaults for what is not given.
func TestCgroupLimits(t *testing.T) {
	for _, tc := range []struct {
		r    *agentapi.Resources
		want string
	}{
		{&agentapi.Resources{MemoryMaxBytes: 1 << 20}, "memory.max=1048576 pids.max=max"},
		{&agentapi.Resources{PidsMax: 7, CpuQuotaUsec: 50000}, "memory.max=max pids.max=7 cpu.max=50000 100000 cpu.weight=100"},
		{&agentapi.Resources{CpuQuotaUsec: 20000, CpuPeriodUsec: 40000, CpuWeight: 39}, "memory.max=max pids.max=max cpu.max=20000 40000 cpu.weight=39"},
		{&agentapi.Resources{CpuWeight: 1000}, "memory.max=max pids.max=max cpu.max=max 100000 cpu.weight=1000"},
	} {
		var got []string
		for _, l := range cgroupLimits(tc.r) {
			got = append(got, l.file+"="+l.value)
		}
		if g := strings.Join(got, " "); g != tc.want {
			t.Errorf("cgroupLimits(%v) = %q, want %q", tc.r, g, tc.want)
		}
	}
}

// A container's seccomp filter holds for its init and for processes that
// join it, with and without no_new_privs (installed before or after the
// capabilities drop), and a filter outside a container is refused.
func TestContainerSeccomp(t *testing.T) {
	root := containerRoot(t)
	h := newHarness(t, Options{}, false)
	ctx := testCtx(t)
	errno := uint(unix.EACCES)
	f, err := seccomp.CompileOCI(&specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{
		{Names: []string{"mkdir", "mkdirat"}, Action: specs.ActErrno, ErrnoRet: &errno}}})
	if err != nil {
		t.Fatal(err)
	}
	filter := &agentapi.SeccompFilter{Program: f.Program, Flags: f.Flags}
	script := sh(`grep ^Seccomp: /proc/self/status; mkdir /tmp/d 2>&1 || true; touch /tmp/f && echo touched`)
	for _, nnp := range []bool{false, true} {
		id := fmt.Sprintf("sc%v", nnp)
		r := run(ctx, h.client, &agentapi.Cmd{Argv: script, Env: []string{"PATH=/bin"}, NoNewPrivileges: nnp, Seccomp: filter,
			Capabilities: &agentapi.Capabilities{Bounding: []uint32{0}, Effective: []uint32{0}, Permitted: []uint32{0}},
			Container:    &agentapi.Container{Id: id, Create: &agentapi.ContainerRoot{Root: root, Mounts: ociMounts()}}})
		out := r.stdout.String()
		if r.err != nil || !strings.Contains(out, "Seccomp:\t2") || !strings.Contains(out, "Permission denied") || !strings.Contains(out, "touched") {
			t.Errorf("no_new_privs %v: %v, %v; output %q, stderr %q: want filter mode 2, mkdir refused, touch run", nnp, r.exit, r.err, out, r.stderr.String())
		}
	}

	// A joining process gets the filter it is given.
	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	ready := make(chan struct{})
	go h.client.Exec(ctx, &agentapi.Cmd{Argv: sh(`echo ready; read x`), Env: []string{"PATH=/bin"}, Stdin: stdinR,
		Stdout:    &notifyWriter{want: "ready", ready: ready},
		Container: &agentapi.Container{Id: "scjoin", Create: &agentapi.ContainerRoot{Root: root, Mounts: ociMounts()}}})
	select {
	case <-ready:
	case <-ctx.Done():
		t.Fatal("the container's init never got ready")
	}
	r := run(ctx, h.client, &agentapi.Cmd{Argv: script, Env: []string{"PATH=/bin"}, Seccomp: filter,
		Container: &agentapi.Container{Id: "scjoin"}})
	if out := r.stdout.String(); r.err != nil || !strings.Contains(out, "Seccomp:\t2") || !strings.Contains(out, "Permission denied") {
		t.Errorf("join: %v, %v; output %q: want filter mode 2 and mkdir refused", r.exit, r.err, out)
	}

	r = run(ctx, h.client, &agentapi.Cmd{Argv: []string{"true"}, Seccomp: filter})
	if status.Code(r.err) != codes.InvalidArgument {
		t.Errorf("a filter without a container: %v, want InvalidArgument", r.err)
	}
	r = run(ctx, h.client, &agentapi.Cmd{Argv: []string{"true"}, Seccomp: &agentapi.SeccompFilter{Program: []byte{1, 2, 3}},
		Container: &agentapi.Container{Id: "scjoin"}})
	if status.Code(r.err) != codes.InvalidArgument {
		t.Errorf("a program of 3 bytes: %v, want InvalidArgument", r.err)
	}
}

// Masked paths are hidden (a file reads empty, a directory lists empty) and
// read-only paths refuse writes, inside the container only; paths that do
// not exist are skipped.
func TestContainerMaskedAndReadonlyPaths(t *testing.T) {
	root := containerRoot(t)
	for _, d := range []string{"secret", "ro"} {
		if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"secret/key", "hidden"} {
		if err := os.WriteFile(filepath.Join(root, f), []byte("sensitive\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	h := newHarness(t, Options{}, false)
	r := run(testCtx(t), h.client, &agentapi.Cmd{
		Argv: sh(`echo hidden=$(cat /hidden); echo secret=$(ls /secret); touch /ro/x 2>/dev/null && echo ro=rw || echo ro=ro; ` +
			`touch /tmp/x && echo tmp=rw`),
		Env: []string{"PATH=/bin"},
		Container: &agentapi.Container{Id: "masked", Create: &agentapi.ContainerRoot{Root: root, Mounts: ociMounts(),
			MaskedPaths:   []string{"/hidden", "/secret", "/proc/no-such-file"},
			ReadonlyPaths: []string{"/ro", "/no-such-dir"}}},
	})
	if want := "hidden=\nsecret=\nro=ro\ntmp=rw\n"; r.err != nil || r.stdout.String() != want {
		t.Errorf("masked and read-only paths: %v, %v, %q (stderr %q); want %q", r.exit, r.err, r.stdout.String(), r.stderr.String(), want)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "hidden")); string(b) != "sensitive\n" {
		t.Errorf("the masked file changed outside the container: %q", b)
	}
}

// A container can take its PID, UTS and IPC namespaces from another (a
// pod's containers share the sandbox's) or keep the guest's own (hostPID,
// hostIPC): it is then not PID 1, keeps the owner's hostname, and when its
// init exits what it left behind in the shared PID namespace is killed
// through its cgroup.
func TestContainerSharedNamespaces(t *testing.T) {
	root := containerRoot(t)
	base := cgroup2Base(t)
	h := newHarness(t, Options{CgroupRoot: base}, false)
	ctx := testCtx(t)
	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	ready := make(chan struct{})
	go h.client.Exec(ctx, &agentapi.Cmd{Argv: sh(`echo ready; read x`), Env: []string{"PATH=/bin"}, Stdin: stdinR,
		Stdout:    &notifyWriter{want: "ready", ready: ready},
		Container: &agentapi.Container{Id: "owner", Create: &agentapi.ContainerRoot{Root: root, Hostname: "pod-c", Mounts: ociMounts()}}})
	select {
	case <-ready:
	case <-ctx.Done():
		t.Fatal("the owner never got ready")
	}
	ids := `for n in pid uts ipc; do readlink /proc/self/ns/$n; done; hostname`
	owner := run(ctx, h.client, &agentapi.Cmd{Argv: sh(ids), Env: []string{"PATH=/bin"}, Container: &agentapi.Container{Id: "owner"}})
	if owner.err != nil || owner.exit.Code != 0 {
		t.Fatalf("join the owner: %v, %v; stderr %q", owner.exit, owner.err, owner.stderr.String())
	}

	join := agentapi.NamespaceMode_NAMESPACE_JOIN
	r := run(ctx, h.client, &agentapi.Cmd{Argv: sh(ids + `; echo pid=$$; setsid sleep 1000 </dev/null >/dev/null 2>&1 & sleep 0.2; [ -d /proc/$! ] && echo bg=$!`), Env: []string{"PATH=/bin"},
		Container: &agentapi.Container{Id: "sharer", Create: &agentapi.ContainerRoot{Root: root, Hostname: "ignored", Mounts: ociMounts(),
			Namespaces: &agentapi.ContainerNamespaces{Of: "owner", Pid: join, Uts: join, Ipc: join}}}})
	lines := strings.Split(r.stdout.String(), "\n")
	if r.err != nil || len(lines) < 6 || strings.Join(lines[:4], "\n")+"\n" != owner.stdout.String() || lines[4] == "pid=1" {
		t.Fatalf("sharer: %v, %v, %q (stderr %q); want the owner's namespaces and hostname %q, not PID 1",
			r.exit, r.err, r.stdout.String(), r.stderr.String(), owner.stdout.String())
	}
	// The sharer's init has exited: its background sleep, in a session of
	// its own (out of reach of the agent's process-group kill), goes too.
	bg := strings.TrimPrefix(lines[5], "bg=")
	// Killed, it is a zombie of the owner's init (a shell that does not
	// reap while it reads) or gone.
	gone := `for i in $(seq 100); do case "$(grep ^State: /proc/$1/status 2>/dev/null)" in ""|*zombie*) echo gone; exit 0;; esac; sleep 0.1; done; echo alive`
	if r := run(ctx, h.client, &agentapi.Cmd{Argv: sh(gone, bg), Env: []string{"PATH=/bin"}, Container: &agentapi.Container{Id: "owner"}}); r.stdout.String() != "gone\n" {
		t.Errorf("the sharer's background process %s after its init ended: %q (stderr %q), want gone", bg, r.stdout.String(), r.stderr.String())
	}

	// The guest's own namespaces are those of a process outside any
	// container (not this test's /proc/self: its main thread may be one
	// the runtime parked after a setns).
	nsOf := `readlink /proc/self/ns/uts; readlink /proc/self/ns/ipc`
	agentNS := run(ctx, h.client, &agentapi.Cmd{Argv: sh(nsOf)})
	guest := agentapi.NamespaceMode_NAMESPACE_GUEST
	r = run(ctx, h.client, &agentapi.Cmd{Argv: sh(nsOf), Env: []string{"PATH=/bin"},
		Container: &agentapi.Container{Id: "hostns", Create: &agentapi.ContainerRoot{Root: root, Mounts: ociMounts(),
			Namespaces: &agentapi.ContainerNamespaces{Uts: guest, Ipc: guest}}}})
	if want := agentNS.stdout.String(); r.err != nil || want == "" || r.stdout.String() != want {
		t.Errorf("guest namespaces: %v, %v, %q; want the agent's %q", r.exit, r.err, r.stdout.String(), want)
	}

	for _, bad := range []*agentapi.ContainerNamespaces{{Of: "none", Ipc: join}, {Of: "self", Ipc: join}, {Of: "../x", Ipc: join}} {
		r := run(ctx, h.client, &agentapi.Cmd{Argv: []string{"true"},
			Container: &agentapi.Container{Id: "self", Create: &agentapi.ContainerRoot{Root: root, Namespaces: bad}}})
		if c := status.Code(r.err); c != codes.FailedPrecondition && c != codes.InvalidArgument {
			t.Errorf("namespaces %v: %v, want FailedPrecondition or InvalidArgument", bad, r.err)
		}
	}
}

// TestContainerCgroupNamespace: a container with a cgroup namespace sees
// its own cgroup as the root, in /proc/self/cgroup and in a cgroup2 mount,
// and so does a process that joins it; one without sees the hierarchy.
func TestContainerCgroupNamespace(t *testing.T) {
	root := containerRoot(t)
	base := cgroup2Base(t)
	h := newHarness(t, Options{CgroupRoot: base}, false)
	ctx := testCtx(t)
	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	ready := make(chan struct{})
	out := &notifyWriter{want: "ready", ready: ready}
	cgMount := &agentapi.Mount{Destination: "/sys/fs/cgroup", Type: "cgroup2", Source: "cgroup2", Options: []string{"nosuid", "noexec", "nodev"}}
	done := make(chan *result, 1)
	go func() {
		r := &result{}
		r.exit, r.err = h.client.Exec(ctx, &agentapi.Cmd{
			Argv: sh(`cat /proc/self/cgroup; cat /sys/fs/cgroup/cgroup.procs | wc -l; echo ready; read x || true`), Env: []string{"PATH=/bin"},
			Container: &agentapi.Container{Id: "cgns", Create: &agentapi.ContainerRoot{Root: root, Mounts: append(ociMounts(), cgMount),
				Namespaces: &agentapi.ContainerNamespaces{Cgroup: true}}},
			Stdin: stdinR, Stdout: out, Stderr: &r.stderr,
		})
		done <- r
	}()
	select {
	case <-ready:
	case r := <-done:
		t.Fatalf("container ended early: %v, %v; stderr %q", r.exit, r.err, r.stderr.String())
	}
	// Its init and the cat and wc of the pipeline are the cgroup's only
	// processes: the mount shows the container's cgroup, not the guest's.
	// (A hybrid host lists its v1 hierarchies first: the unified one is
	// the "0::" line.)
	if got := out.buf.String(); !strings.Contains("\n"+got, "\n0::/\n") || !strings.Contains(got, "\n3\n") {
		t.Errorf("in the container: %q; want 0::/ and 3 processes in the mount's cgroup.procs", got)
	}
	r := run(ctx, h.client, &agentapi.Cmd{Argv: sh(`cat /proc/self/cgroup`), Env: []string{"PATH=/bin"}, Container: &agentapi.Container{Id: "cgns"}})
	if r.err != nil || !strings.Contains("\n"+r.stdout.String(), "\n0::/\n") {
		t.Errorf("a process joining it: %q, %v (stderr %q); want 0::/", r.stdout.String(), r.err, r.stderr.String())
	}
	stdinW.Close()
	<-done
	r = run(ctx, h.client, &agentapi.Cmd{Argv: sh(`cat /proc/self/cgroup`), Env: []string{"PATH=/bin"},
		Container: &agentapi.Container{Id: "plain", Create: &agentapi.ContainerRoot{Root: root, Mounts: ociMounts()}}})
	if want := "0::/" + filepath.Base(base) + "/plain"; r.err != nil || !strings.Contains(r.stdout.String(), want) {
		t.Errorf("a container without one: %q, %v; want %q", r.stdout.String(), r.err, want)
	}
}
