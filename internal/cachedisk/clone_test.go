package cachedisk

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestSparseCopy: the fallback copy keeps the data at its offsets, the
// length, and the holes (it allocates about what the source does).
func TestSparseCopy(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(16 << 20); err != nil {
		t.Fatal(err)
	}
	chunks := map[int64][]byte{0: []byte("start"), 4 << 20: bytes.Repeat([]byte("x"), 1<<20), 16<<20 - 3: []byte("end")}
	for off, b := range chunks {
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	for _, method := range []string{"cloneFile", "sparseCopy"} {
		t.Run(method, func(t *testing.T) {
			dst := filepath.Join(dir, method)
			in, err := os.Open(src)
			if err != nil {
				t.Fatal(err)
			}
			defer in.Close()
			if method == "cloneFile" {
				if _, err := cloneFile(dst, in); err != nil {
					t.Fatal(err)
				}
			} else {
				out, err := os.Create(dst)
				if err != nil {
					t.Fatal(err)
				}
				defer out.Close()
				if err := sparseCopy(out, in); err != nil {
					t.Fatal(err)
				}
			}
			a, _ := os.ReadFile(src)
			b, err := os.ReadFile(dst)
			if err != nil || !bytes.Equal(a, b) {
				t.Fatalf("the copy differs from its source (%v)", err)
			}
			fi, _ := os.Stat(dst)
			if alloc := fi.Sys().(*syscall.Stat_t).Blocks * 512; alloc > 4<<20 {
				t.Errorf("the copy allocates %d bytes of a 16 MiB file with 1 MiB of data: holes filled", alloc)
			}
		})
	}
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if _, err := cloneFile(filepath.Join(dir, "cloneFile"), in); err == nil {
		t.Error("cloneFile over an existing file succeeded")
	}
}
