package main

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/microvm/microvm/internal/cachedisk"
	"github.com/microvm/microvm/internal/testing/testenv"
)

// TestRunCache: run --image --cache, three short boots of a busybox image
// whose main process runs as uid 1000. The first writes under the cache
// and exits 0: its clone becomes version 1. The second finds that file,
// writes another and exits 1: nothing is kept and a line says so. The
// third finds the first's file and not the second's, and exits 0:
// version 2. No clone is left checked out.
func TestRunCache(t *testing.T) {
	testenv.RequireKVM(t, testenv.NeedLinux)
	link := func(applet string) tarEntry {
		return tarEntry{Hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + applet, Linkname: "busybox", Mode: 0o777}}
	}
	oci := writeBusyboxImage(t, link("mkdir"), link("umount"), link("sync"), link("chown"))
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
}
