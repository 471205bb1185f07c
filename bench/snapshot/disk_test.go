package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestMeasureDisk: a sparse memory file counts its allocated blocks, not
// its length; the state files count in the total only.
func TestMeasureDisk(t *testing.T) {
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "ram"+memorySuffix))
	if err != nil {
		t.Fatal(err)
	}
	const length = 64 << 20
	if err := f.Truncate(length); err != nil {
		t.Fatal(err)
	}
	page := make([]byte, 4096)
	for i := range page {
		page[i] = 1
	}
	if _, err := f.WriteAt(page, 1<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	u, err := measureDisk(dir)
	if err != nil {
		t.Fatal(err)
	}
	if u.MemoryLength != length {
		t.Errorf("memory length %d, want %d", u.MemoryLength, length)
	}
	if u.MemoryBytes < 4096 || u.MemoryBytes >= length/2 {
		t.Errorf("memory allocated %d bytes for one page written in %d; want it sparse", u.MemoryBytes, length)
	}
	if u.TotalBytes <= u.MemoryBytes {
		t.Errorf("total %d, not above the memory's %d: the manifest is not counted", u.TotalBytes, u.MemoryBytes)
	}

	if _, err := measureDisk(t.TempDir()); err == nil {
		t.Error("a directory without a memory part: no error")
	}
}

// TestDropCache: evicting a snapshot's memory file is harmless to call
// (on a tmpfs it evicts nothing, and canDropCache says so).
func TestDropCache(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ram"+memorySuffix), make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := dropCache(dir); err != nil {
		t.Errorf("dropCache: %v", err)
	}
	if err := dropCache(filepath.Join(dir, "missing")); err == nil {
		t.Error("dropCache of a missing directory: no error")
	}
	if canDropCache("/dev/shm") {
		t.Log("/dev/shm is not a tmpfs here")
	}
}
