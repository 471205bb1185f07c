package image

import (
	"bytes"
	"compress/gzip"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestImportRootfs: a root file system tarball, plain or gzipped, becomes
// a one-layer image (docker import): its files and owners in the ext4, the
// given configuration kept and its user resolved from the tarball's
// /etc/passwd; the same tarball twice is one image; a tarball with a
// "../" path is refused and nothing is stored.
func TestImportRootfs(t *testing.T) {
	s := openStore(t)
	td := t.TempDir()
	tarb := tarBytes(t, []entry{
		dir("etc/", 0o755),
		file("etc/passwd", "root:x:0:0:root:/root:/bin/sh\nbuild:x:1500:1600::/home/build:/bin/sh\n"),
		file("etc/group", "root:x:0:\nbuild:x:1600:\n"),
		{name: "home/build/", typ: '5', mode: 0o750, uid: 1500, gid: 1600},
		file("etc/os-release", "ID=test\n"),
	})
	plain := filepath.Join(td, "rootfs.tar")
	if err := os.WriteFile(plain, tarb, 0o644); err != nil {
		t.Fatal(err)
	}
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	zw.Write(tarb)
	zw.Close()
	zipped := filepath.Join(td, "rootfs.tar.gz")
	if err := os.WriteFile(zipped, zb.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	// The image's Created is the file's mtime: the same for both, or a
	// second boundary between the two writes (a loaded host) makes two
	// images of one content.
	mtime := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, f := range []string{plain, zipped} {
		if err := os.Chtimes(f, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}

	cfg := Config{Env: []string{"PATH=/usr/bin:/bin"}, WorkingDir: "/home/build", User: "build", Cmd: []string{"/bin/sh"}}
	im, err := s.ImportRootfs(context.Background(), plain, "test/rootfs:1", cfg, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	if got := catPath(t, im.Rootfs, "/etc/os-release"); got != "ID=test\n" {
		t.Errorf("/etc/os-release = %q", got)
	}
	if st := statPath(t, im.Rootfs, "/home/build"); st.uid != 1500 || st.gid != 1600 || st.mode&0o7777 != 0o750 {
		t.Errorf("/home/build: uid %d gid %d mode %o, want 1500 1600 750", st.uid, st.gid, st.mode&0o7777)
	}
	if im.Config.UID != 1500 || im.Config.GID != 1600 || im.Config.WorkingDir != "/home/build" ||
		!slices.Equal(im.Config.Cmd, []string{"/bin/sh"}) || !slices.Equal(im.Config.Env, cfg.Env) {
		t.Errorf("config %+v", im.Config)
	}
	fsck(t, im.Rootfs)

	im2, err := s.ImportRootfs(context.Background(), zipped, "test/rootfs:gz", cfg, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	if im2.ID != im.ID {
		t.Errorf("the gzipped tarball gave image %s, the plain one %s: want one image", im2.ID, im.ID)
	}
	if got, err := s.Get("test/rootfs:gz"); err != nil || got.ID != im.ID {
		t.Errorf("Get(test/rootfs:gz) = %v, %v", got, err)
	}

	evil := filepath.Join(td, "evil.tar")
	if err := os.WriteFile(evil, tarBytes(t, []entry{file("../escape", "x")}), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ImportRootfs(context.Background(), evil, "test/evil:1", Config{}, testOptions()); err == nil {
		t.Error("a tarball with ../escape was imported")
	}
	if _, err := s.Get("test/evil:1"); err == nil {
		t.Error("the refused tarball is stored")
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(s.Dir()), "escape")); err == nil {
		t.Error("../escape was written")
	}
	tmpEmpty(t, s)
	if _, err := s.ImportRootfs(context.Background(), filepath.Join(td, "missing.tar"), "test/x:1", Config{}, testOptions()); err == nil {
		t.Error("a missing tarball was imported")
	}
}
