package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/microvm/microvm/guest/initramfs"
)

func TestLayout(t *testing.T) {
	if _, err := exec.LookPath("cpio"); err != nil {
		t.Skip("GNU cpio not installed")
	}
	host := filepath.Join(t.TempDir(), "busybox")
	if err := os.WriteFile(host, []byte("bb"), 0o755); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	w := initramfs.NewWriter(&buf)
	if err := writeEntries(w, []byte("init"), []string{"/bin/busybox=" + host, "usr/lib/x/bb=" + host}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("cpio", "-it", "--quiet")
	cmd.Stdin = &buf
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cpio -it: %v\n%s", err, out)
	}
	want := []string{"dev", "dev/console", "dev/null", "proc", "sys", "tmp", "init",
		"bin", "bin/busybox", "usr", "usr/lib", "usr/lib/x", "usr/lib/x/bb"}
	if diff := cmp.Diff(want, strings.Fields(string(out))); diff != "" {
		t.Errorf("archive listing (-want +got):\n%s", diff)
	}
}

func TestBadFileFlag(t *testing.T) {
	for _, spec := range []string{"nohost", "=x", "x=", "../x=/bin/sh"} {
		w := initramfs.NewWriter(new(bytes.Buffer))
		if err := writeEntries(w, nil, []string{spec}); err == nil {
			t.Errorf("-file %q accepted", spec)
		}
	}
}

func TestCheckStaticELF(t *testing.T) {
	notELF := filepath.Join(t.TempDir(), "script")
	os.WriteFile(notELF, []byte("#!/bin/sh\n"), 0o755)
	if err := initramfs.CheckStaticELF(notELF); err == nil || !strings.Contains(err.Error(), "not an ELF") {
		t.Errorf("script: %v", err)
	}
	switch err := initramfs.CheckStaticELF("/bin/sh"); {
	case err == nil:
		t.Skip("/bin/sh is statically linked here: no dynamic binary to refuse")
	case !strings.Contains(err.Error(), "dynamically linked"):
		t.Errorf("/bin/sh: %v, want a dynamically linked error", err)
	}
}
