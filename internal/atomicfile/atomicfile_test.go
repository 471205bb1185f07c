package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// TestWrite: the file holds the new contents with the mode asked for, an
// old file is replaced, and no temporary file is left; a write into a
// missing directory fails and leaves nothing.
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f.json")
	for _, data := range []string{"first", "second"} {
		if err := Write(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		if err != nil || string(b) != data {
			t.Fatalf("read %q, %v; want %q", b, err, data)
		}
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, %v; want 0600", fi.Mode(), err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("%d entries in the directory, want the file alone", len(ents))
	}
	if err := Write(filepath.Join(dir, "missing", "f"), []byte("x"), 0o600); err == nil {
		t.Error("write into a missing directory succeeded")
	}
}

// TestCreate: the first Create writes the file whole; a second finds it
// there and fails with fs.ErrExist, leaving the first's contents and no
// temporary file.
func TestCreate(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "r.json")
	if err := Create(p, []byte("first"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Create(p, []byte("second"), 0o600); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second Create: %v; want fs.ErrExist", err)
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != "first" {
		t.Fatalf("read %q, %v; want the first contents", b, err)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, %v; want 0600", fi.Mode(), err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("%d entries in the directory, want the file alone", len(ents))
	}
}
