package images

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/microvm/microvm"
)

// TestUse: the image is the first disk, read-only, and the kernel
// command line names it and the overlay's size.
func TestUse(t *testing.T) {
	cfg := microvm.Config{Cmdline: "console=ttyS0", Disks: []microvm.DiskConfig{{Path: "/data.img"}}}
	Use(&cfg, &Image{Rootfs: "/state/images/abc/rootfs.ext4"}, 64<<20)
	if len(cfg.Disks) != 2 || cfg.Disks[0] != (microvm.DiskConfig{Path: "/state/images/abc/rootfs.ext4", ReadOnly: true}) ||
		cfg.Disks[1].Path != "/data.img" {
		t.Errorf("disks %+v: want the image first, read-only, then /data.img", cfg.Disks)
	}
	if want := "console=ttyS0 microvm.root=/dev/vda microvm.rootsize=65536k"; cfg.Cmdline != want {
		t.Errorf("cmdline %q, want %q", cfg.Cmdline, want)
	}
}

// TestImageStore: the Go API stores a root file system tarball, finds it
// by name, lists and removes it.
func TestImageStore(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "etc/hostname", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3})
	tw.Write([]byte("vm\n"))
	tw.Close()
	tarball := filepath.Join(t.TempDir(), "rootfs.tar")
	if err := os.WriteFile(tarball, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	img, err := s.ImportRootfs(context.Background(), tarball, "example/tiny:1", Config{Cmd: []string{"/bin/sh"}})
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(img.Rootfs); err != nil || fi.Mode().Perm() != 0o444 {
		t.Errorf("rootfs %s: %v, %v; want a read-only file", img.Rootfs, fi, err)
	}
	if got, err := s.Get("example/tiny:1"); err != nil || got.ID != img.ID {
		t.Errorf("Get = %v, %v", got, err)
	}
	if list, err := s.List(); err != nil || len(list) != 1 {
		t.Errorf("List = %v, %v", list, err)
	}
	if err := s.Remove("example/tiny:1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get("example/tiny:1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("after Remove: %v, want ErrNotFound", err)
	}
}
