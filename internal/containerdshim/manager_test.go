package containerdshim

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// The delete action, run in the bundle of a shim that died: the snapshot
// mounted at rootfs is unmounted, the root image removed, and the status
// is SIGKILL's.
func TestManagerStopCleansBundle(t *testing.T) {
	bundle := t.TempDir()
	rootfs := filepath.Join(bundle, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", rootfs, "tmpfs", 0, ""); err != nil {
		t.Skipf("mount a tmpfs (needs CAP_SYS_ADMIN): %v", err)
	}
	t.Cleanup(func() { unix.Unmount(rootfs, unix.MNT_DETACH) })
	for _, f := range []string{rootfsImage, rootfsImage + ".tmp"} {
		if err := os.WriteFile(filepath.Join(bundle, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(bundle)
	st, err := Manager{}.Stop(context.Background(), "c1")
	if err != nil {
		t.Fatal(err)
	}
	if st.ExitStatus != 137 || st.ExitedAt.IsZero() {
		t.Errorf("status %+v, want 137 with a time", st)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mi), rootfs) {
		t.Errorf("rootfs still mounted")
	}
	for _, f := range []string{rootfsImage, rootfsImage + ".tmp"} {
		if _, err := os.Stat(filepath.Join(bundle, f)); !os.IsNotExist(err) {
			t.Errorf("%s left: %v", f, err)
		}
	}
}
