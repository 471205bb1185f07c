package containerdshim

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestPodRootfsMethod: the pod's annotation wins over the configured
// default, and an unknown method is the caller's error.
func TestPodRootfsMethod(t *testing.T) {
	for _, tc := range []struct {
		def  RootfsMethod
		ann  map[string]string
		want RootfsMethod
	}{
		{RootfsExt4, nil, RootfsExt4},
		{Rootfs9p, nil, Rootfs9p},
		{RootfsExt4, map[string]string{RootfsAnnotation: "9p"}, Rootfs9p},
		{Rootfs9p, map[string]string{RootfsAnnotation: "ext4"}, RootfsExt4},
	} {
		got, err := podRootfsMethod(tc.def, &specs.Spec{Annotations: tc.ann})
		if err != nil || got != tc.want {
			t.Errorf("default %s, annotations %v: %q, %v; want %q", tc.def, tc.ann, got, err, tc.want)
		}
	}
	_, err := podRootfsMethod(RootfsExt4, &specs.Spec{Annotations: map[string]string{RootfsAnnotation: "virtiofs"}})
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("unknown method: %v, want an invalid-argument error", err)
	}
}

// TestRootfsShare: a 9p root is a bind of the snapshot in the pod's shared
// directory at the path the guest sees; unbinding the container's volumes
// removes it and keeps every file of the root.
func TestRootfsShare(t *testing.T) {
	src := volumesEnv(t)
	r := &rootfs{bundle: t.TempDir(), src: src}
	got, err := r.share("pod", "c1")
	if err != nil {
		t.Fatal(err)
	}
	if want := "/run/microvm-shares/" + volumesTag + "/c1/root"; got != want {
		t.Errorf("guest path %q, want %q", got, want)
	}
	host := filepath.Join(shareDir("pod"), "c1", rootShareName)
	if b, err := os.ReadFile(filepath.Join(host, "data")); err != nil || string(b) != "kept" {
		t.Errorf("through the bind: %q, %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(host, "new"), []byte("x"), 0o644); err != nil {
		t.Error(err)
	}
	if b, err := os.ReadFile(filepath.Join(src, "new")); err != nil || string(b) != "x" {
		t.Errorf("a write through the bind is not in the root: %q, %v", b, err)
	}
	if err := unbindVolumes("c1"); err != nil {
		t.Fatal(err)
	}
	if m := mountedUnder(t, volumesRoot); len(m) != 0 {
		t.Errorf("left mounted: %v", m)
	}
	if _, err := os.Stat(filepath.Join(shareDir("pod"), "c1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("container's directory left: %v", err)
	}
	for _, f := range []string{"data", "new"} {
		if _, err := os.Stat(filepath.Join(src, f)); err != nil {
			t.Errorf("the root lost a file: %v", err)
		}
	}
}
