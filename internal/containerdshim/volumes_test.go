package containerdshim

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// mountedUnder lists the mount points below dir.
func mountedUnder(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}

// volumesEnv puts volumesRoot in a temporary directory for the test and
// returns a volume's source directory holding the file "data".
func volumesEnv(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for bind mounts")
	}
	old := volumesRoot
	t.Cleanup(func() { volumesRoot = old })
	volumesRoot = t.TempDir()
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "data"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	return src
}

// TestVolumesBindAndUnbind: directory volumes are bound below the pod's
// shared directory (read-only ones read-only), files and /dev/shm are
// left to copyBinds, and unbinding removes the binds and mount points but
// never what a volume holds.
func TestVolumesBindAndUnbind(t *testing.T) {
	src := volumesEnv(t)
	file := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(file, []byte("127.0.0.1 localhost\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := &specs.Spec{Mounts: []specs.Mount{
		{Destination: "/data", Type: "bind", Source: src, Options: []string{"rbind", "rw"}},
		{Destination: "/config", Type: "bind", Source: src, Options: []string{"rbind", "ro"}},
		{Destination: "/etc/hosts", Type: "bind", Source: file, Options: []string{"rbind", "rw"}},
		{Destination: "/dev/shm", Type: "bind", Source: src, Options: []string{"rbind", "rw"}},
		{Destination: "/proc", Type: "proc", Source: "proc"},
	}}
	if _, err := makeShareDir("pod"); err != nil {
		t.Fatal(err)
	}
	paths, err := bindVolumes("pod", "c1", spec)
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 2 || paths[0] != "/run/microvm-shares/microvm-volumes/c1/0" || paths[1] != "/run/microvm-shares/microvm-volumes/c1/1" {
		t.Fatalf("guest paths %v: want the two directory volumes, by index", paths)
	}
	rw := filepath.Join(shareDir("pod"), "c1", "0")
	if err := os.WriteFile(filepath.Join(rw, "new"), []byte("x"), 0o644); err != nil {
		t.Fatalf("write through the read-write bind: %v", err)
	}
	if _, err := os.Stat(filepath.Join(src, "new")); err != nil {
		t.Fatalf("the write did not reach the volume: %v", err)
	}
	err = os.WriteFile(filepath.Join(shareDir("pod"), "c1", "1", "other"), []byte("x"), 0o644)
	if !errors.Is(err, unix.EROFS) {
		t.Fatalf("write through the read-only bind: %v, want EROFS", err)
	}
	if m := mountedUnder(t, volumesRoot); len(m) != 2 {
		t.Fatalf("mounts %v, want two", m)
	}

	if err := unbindVolumes("c1"); err != nil {
		t.Fatal(err)
	}
	if m := mountedUnder(t, volumesRoot); len(m) != 0 {
		t.Fatalf("mounts left: %v", m)
	}
	for _, f := range []string{"data", "new"} {
		if _, err := os.Stat(filepath.Join(src, f)); err != nil {
			t.Errorf("the volume lost %s: %v", f, err)
		}
	}
	if err := removeShareDir("pod"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(shareDir("pod")); !os.IsNotExist(err) {
		t.Fatalf("shared directory left: %v", err)
	}
}

// TestRemoveShareDirUnbindsLeftovers: the delete action after a killed
// shim removes a pod's shared directory with binds still in it (no
// container's delete ran), without touching the volumes.
func TestRemoveShareDirUnbindsLeftovers(t *testing.T) {
	src := volumesEnv(t)
	spec := &specs.Spec{Mounts: []specs.Mount{{Destination: "/data", Type: "bind", Source: src, Options: []string{"rbind"}}}}
	if _, err := makeShareDir("pod"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		if _, err := bindVolumes("pod", id, spec); err != nil {
			t.Fatal(err)
		}
	}
	if err := removeShareDir("pod"); err != nil {
		t.Fatal(err)
	}
	if m := mountedUnder(t, volumesRoot); len(m) != 0 {
		t.Fatalf("mounts left: %v", m)
	}
	if _, err := os.Stat(filepath.Join(src, "data")); err != nil {
		t.Fatalf("the volume lost its file: %v", err)
	}
	if _, err := os.Stat(shareDir("pod")); !os.IsNotExist(err) {
		t.Fatalf("shared directory left: %v", err)
	}
}
