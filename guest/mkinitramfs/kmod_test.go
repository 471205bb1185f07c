package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// fakeModule compiles an object file whose .modinfo says depends=deps, as
// a kernel module's does.
func fakeModule(t *testing.T, dir, rel, deps string) {
	t.Helper()
	src := filepath.Join(t.TempDir(), "m.c")
	c := `__attribute__((section(".modinfo"), used)) static const char info[] = "license=GPL\0depends=` + deps + `\0vermagic=6.1";` + "\n"
	if err := os.WriteFile(src, []byte(c), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command("gcc", "-c", "-o", out, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, b)
	}
}

func TestModuleLoadOrder(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc to build fake modules")
	}
	dir := t.TempDir()
	fakeModule(t, dir, "kernel/drivers/virtio/virtio.ko", "")
	fakeModule(t, dir, "kernel/drivers/virtio/virtio_ring.ko", "")
	fakeModule(t, dir, "kernel/drivers/virtio/virtio_mmio.ko", "virtio_ring,virtio")
	fakeModule(t, dir, "kernel/net/vmw_vsock/vsock.ko", "")
	fakeModule(t, dir, "kernel/net/vmw_vsock/vmw_vsock_virtio_transport_common.ko", "vsock,virtio")
	fakeModule(t, dir, "kernel/net/vmw_vsock/vmw_vsock_virtio_transport.ko", "vmw_vsock_virtio_transport_common,virtio,vsock,virtio_ring")
	fakeModule(t, dir, "kernel/x/loop-a.ko", "loop_b")
	fakeModule(t, dir, "kernel/x/loop-b.ko", "loop_a")
	idx, err := indexModules(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := idx.loadOrder([]string{"virtio-mmio", "vmw_vsock_virtio_transport"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range got {
		got[i] = strings.TrimSuffix(filepath.Base(got[i]), ".ko")
	}
	want := []string{"virtio_ring", "virtio", "virtio_mmio", "vsock", "vmw_vsock_virtio_transport_common", "vmw_vsock_virtio_transport"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("load order (-want +got):\n%s", diff)
	}
	for _, tc := range []struct{ name, want string }{
		{"nosuch", "module nosuch not found"},
		{"loop_a", "dependency cycle"},
	} {
		if _, err := idx.loadOrder([]string{tc.name}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("loadOrder(%s): %v, want %q", tc.name, err, tc.want)
		}
	}
}
