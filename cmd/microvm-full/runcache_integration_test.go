package main

import (
	"archive/tar"
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/internal/cachedisk"
	"github.com/microvm/microvm/internal/testing/testenv"
	"github.com/microvm/microvm/internal/vms"
)

// TestRunCache: run --image --cache, short boots of a busybox image
// whose main process runs as uid 1000. The first writes under the cache
// and exits 0: its clone becomes version 1. The second finds that file,
// writes another and exits 1: nothing is kept and a line says so. The
// third finds the first's file and not the second's, and exits 0:
// version 2. No clone is left checked out. Then the ends that leave a
// clone or not (runCacheKilled, runCacheStopped): a run whose process is
// killed with SIGKILL, and a detached one that `stop` ends.
func TestRunCache(t *testing.T) {
	testenv.RequireKVM(t, testenv.NeedLinux)
	link := func(applet string) tarEntry {
		return tarEntry{Hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + applet, Linkname: "busybox", Mode: 0o777}}
	}
	oci := writeBusyboxImage(t, link("mkdir"), link("umount"), link("sync"), link("chown"), link("sleep"))
	state, store := t.TempDir(), t.TempDir()
	bin, kernel, agent := testenv.Binary(t), testenv.BzImage(t), testenv.Agent(t)
	microvm := func(args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "MICROVM_STATE_DIR="+state)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return string(out), 0
		case errors.As(err, &ee):
			return string(out), ee.ExitCode()
		}
		t.Fatal(err)
		return "", 0
	}
	if out, code := microvm("image", "import", "--name", "bb:1", oci); code != 0 {
		t.Fatalf("image import: status %d\n%s", code, out)
	}
	run := func(name, script string) (string, int) {
		t.Helper()
		out, code := microvm("run", "--name", name, "--kernel", kernel, "--agent", agent, "--memory", "256M",
			"--image", "bb:1", "--cache", "c=/cache,size=64M", "--cache-dir", store, "--", "sh", "-c", script)
		microvm("rm", "-f", name)
		return out, code
	}
	newest := func() cachedisk.Info {
		t.Helper()
		out, code := microvm("cache", "ls", "--dir", store, "--json")
		var list []cachedisk.Info
		if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 {
			t.Fatalf("cache ls: status %d\n%s", code, out)
		}
		return list[0]
	}

	if out, code := run("rc1", "echo kept-$(id -u) > /cache/f"); code != 0 {
		t.Fatalf("first run: status %d\n%s", code, out)
	}
	if in := newest(); in.Newest != 1 || in.Clones != 0 {
		t.Errorf("after a run that exited 0: %+v, want version 1 and no clone", in)
	}
	out, code := run("rc2", "cat /cache/f; echo lost > /cache/g; exit 1")
	if code != 1 || !strings.Contains(out, "kept-1000") || !strings.Contains(out, "caches c not kept") {
		t.Errorf("second run: status %d, want 1, the first run's file and the discard line\n%s", code, out)
	}
	if in := newest(); in.Newest != 1 || in.Clones != 0 {
		t.Errorf("after a run that exited 1: %+v, want version 1 still and no clone", in)
	}
	out, code = run("rc3", "cat /cache/f; ls /cache/g 2>/dev/null || echo no-g")
	if code != 0 || !strings.Contains(out, "kept-1000") || !strings.Contains(out, "no-g") {
		t.Errorf("third run: status %d, want 0, the first run's file and not the failed run's\n%s", code, out)
	}
	if in := newest(); in.Newest != 2 || in.Clones != 0 {
		t.Errorf("after the third run: %+v, want version 2 and no clone", in)
	}
	vmArgs := []string{"--kernel", kernel, "--agent", agent, "--memory", "256M",
		"--image", "bb:1", "--cache", "c=/cache,size=64M", "--cache-dir", store}
	rc := runCacheEnv{bin: bin, state: state, store: store, vmArgs: vmArgs, microvm: microvm, run: run, newest: newest}
	// In the test's own goroutine (no subtests): rc's helpers fail t.
	runCacheKilled(t, rc)
	runCacheStopped(t, rc)
}

// runCacheEnv is what TestRunCache's parts share: its microvm binary,
// state directory and cache store (version 2 committed), the flags that
// boot its image with the cache, and its helpers.
type runCacheEnv struct {
	bin, state, store string
	vmArgs            []string
	microvm           func(args ...string) (string, int)
	run               func(name, script string) (string, int)
	newest            func() cachedisk.Info
}

// clones lists the store's clone files of cache c.
func (rc runCacheEnv) clones(t *testing.T) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(rc.store, "c", "clones", "*.ext4"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// flocked says whether some process holds a flock on the file at path,
// probing as the store does: a non-blocking exclusive lock on a fresh
// descriptor, let go at once.
func flocked(t *testing.T, path string) bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if err == unix.EWOULDBLOCK {
		return true
	}
	if err != nil {
		t.Fatal(err)
	}
	return false
}

// runCacheKilled: a foreground run --cache whose main process sleeps is
// killed with SIGKILL once its main process runs (its marker on the
// console). It commits nothing, and leaves its clone, which no one holds
// any more. Aged past cachedisk.CloneGrace it counts as abandoned, and
// the next run's checkout removes it (one line says so); that run's own
// clone is committed, so none is left.
func runCacheKilled(t *testing.T, rc runCacheEnv) {
	cmd := exec.Command(rc.bin, append(append([]string{"run", "--name", "rc4"}, rc.vmArgs...),
		"--", "sh", "-c", "echo rc4-$((40+2)) > /cache/k; echo rc4-$((40+2)); sleep 600")...)
	cmd.Env = append(os.Environ(), "MICROVM_STATE_DIR="+rc.state)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer rc.microvm("rm", "-f", "rc4")
	var console strings.Builder // written by the reader until scanned closes
	running, scanned := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(scanned)
		// The marker is the shell's sum, so that the command line shown
		// anywhere on the console does not match it.
		sc, seen := bufio.NewScanner(pr), false
		for sc.Scan() {
			console.WriteString(sc.Text() + "\n")
			if !seen && strings.Contains(sc.Text(), "rc4-42") {
				seen = true
				close(running)
			}
		}
		io.Copy(io.Discard, pr)
	}()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); pw.Close() }()
	select {
	case <-running:
	case err := <-exited:
		<-scanned
		t.Fatalf("run ended before its main process ran: %v\n%s", err, console.String())
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		<-exited
		<-scanned
		t.Fatalf("the main process did not run within 2m; console:\n%s", console.String())
	}
	live := rc.clones(t)
	if len(live) != 1 || !flocked(t, live[0]) {
		t.Fatalf("while the VM runs: clones %v, want one that its VM holds", live)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := <-exited; err == nil {
		t.Fatal("run killed with SIGKILL exited 0")
	}
	in := rc.newest()
	left := rc.clones(t)
	if in.Newest != 2 || in.Clones != 1 || in.Abandoned != 0 || len(left) != 1 || left[0] != live[0] {
		t.Fatalf("after SIGKILL: %+v, clones %v; want version 2 still and the killed run's young clone %s", in, left, live[0])
	}
	if flocked(t, left[0]) {
		t.Errorf("the killed run's clone %s is still flocked", left[0])
	}
	old := time.Now().Add(-2 * cachedisk.CloneGrace)
	if err := os.Chtimes(left[0], old, old); err != nil {
		t.Fatal(err)
	}
	if in := rc.newest(); in.Clones != 1 || in.Abandoned != 1 {
		t.Errorf("the clone aged past the grace: %+v; want it abandoned", in)
	}
	out, code := rc.run("rc5", "cat /cache/f; ls /cache/k 2>/dev/null || echo no-k")
	if code != 0 || !strings.Contains(out, "kept-1000") || !strings.Contains(out, "no-k") || !strings.Contains(out, "removed 1 abandoned clone") {
		t.Errorf("the run after: status %d, want 0, version 2's file, not the killed run's, and the abandoned clone removed\n%s", code, out)
	}
	if in, left := rc.newest(), rc.clones(t); in.Newest != 3 || in.Clones != 0 || len(left) != 0 {
		t.Errorf("after the run after the kill: %+v, clones %v; want version 3 and no clone", in, left)
	}
	if <-scanned; t.Failed() {
		t.Logf("the killed run's console:\n%s", console.String())
	}
}

// runCacheStopped: a detached run --cache that `stop` ends commits
// nothing and discards its clone (docs/cli.md: any end but its main
// process's status 0 keeps no cache), with the line that says so in its
// log. While it runs its clone counts as in use, however old its mtime:
// the VM holds it.
func runCacheStopped(t *testing.T, rc runCacheEnv) {
	args := append(append([]string{"run", "--name", "rc6", "--detach"}, rc.vmArgs...), "--", "sh", "-c", "echo x > /cache/s; sleep 600")
	if out, code := rc.microvm(args...); code != 0 {
		t.Fatalf("run --detach: status %d\n%s", code, out)
	}
	defer rc.microvm("rm", "-f", "rc6")
	live := rc.clones(t)
	if len(live) != 1 || !flocked(t, live[0]) {
		t.Fatalf("while the VM runs: clones %v, want one that its VM holds", live)
	}
	old := time.Now().Add(-2 * cachedisk.CloneGrace)
	if err := os.Chtimes(live[0], old, old); err != nil {
		t.Fatal(err)
	}
	if in := rc.newest(); in.Clones != 1 || in.Abandoned != 0 {
		t.Errorf("a held clone aged past the grace: %+v; want it in use", in)
	}
	if out, code := rc.microvm("stop", "rc6"); code != 0 {
		t.Fatalf("stop: status %d\n%s", code, out)
	}
	// The VM's process discards the clone once the VM is gone, then says
	// so in its log: wait for that line.
	logPath := filepath.Join(rc.state, "vms", "rc6", vms.LogFile)
	deadline := time.Now().Add(time.Minute)
	for {
		b, _ := os.ReadFile(logPath)
		if strings.Contains(string(b), "caches c not kept") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no discard line in %s within 1m:\n%s", logPath, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if in, left := rc.newest(), rc.clones(t); in.Newest != 3 || in.Clones != 0 || len(left) != 0 {
		t.Errorf("after stop: %+v, clones %v; want version 3 still and no clone", in, left)
	}
}
