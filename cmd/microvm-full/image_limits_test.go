package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/clibase"
)

// TestImageLimitRefused: an image that unpacks past a limit is refused in
// one line that names the flag and the variable raising it, with status
// 125, and nothing is stored; --max-size takes a SIZE or off.
func TestImageLimitRefused(t *testing.T) {
	t.Setenv("MICROVM_STATE_DIR", t.TempDir())
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	tw.WriteHeader(&tar.Header{Name: "zeros", Typeflag: tar.TypeReg, Mode: 0o644, Size: 16 << 20})
	tw.Write(make([]byte, 16<<20))
	tw.Close()
	zw.Close()
	bomb := filepath.Join(t.TempDir(), "bomb.tar.gz")
	if err := os.WriteFile(bomb, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}

	wantError(t, clibase.StatusFailure, []string{"image", "import", "--rootfs", "--name", "bomb:1", "--max-size", "4M", bomb},
		"go past 4 MiB (MaxBytes); nothing was stored: --max-size or $MICROVM_IMAGE_MAX_SIZE raises the limit")
	t.Setenv("MICROVM_IMAGE_MAX_ENTRIES", "0")
	wantError(t, microvm.StatusUsage, []string{"image", "import", "--rootfs", "--name", "bomb:1", bomb},
		`--max-entries (or $MICROVM_IMAGE_MAX_ENTRIES) "0": want a positive number, or off`)
	t.Setenv("MICROVM_IMAGE_MAX_ENTRIES", "")
	t.Setenv("MICROVM_IMAGE_MAX_SIZE", "2M")
	wantError(t, clibase.StatusFailure, []string{"image", "import", "--rootfs", "--name", "bomb:1", bomb}, "--max-size or $MICROVM_IMAGE_MAX_SIZE raises")
	if got, stdout, _ := runMain(t, "image", "ls"); got != 0 || strings.Count(stdout, "\n") != 1 {
		t.Errorf("image ls after refusals: status %d, %q", got, stdout)
	}
	entries, _ := os.ReadDir(filepath.Join(os.Getenv("MICROVM_STATE_DIR"), "images", "tmp"))
	for _, e := range entries {
		t.Errorf("left in the store's tmp/: %s", e.Name())
	}
}
