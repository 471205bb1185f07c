package dockervm

import (
	"context"
	"encoding/binary"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/microvm/microvm/internal/testing/testenv"
)

func TestCreateDisk(t *testing.T) {
	testenv.NeedMkfs(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "docker.img")
	const size = 256 << 20
	d, err := CreateDisk(context.Background(), path, size)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != size {
		t.Errorf("size %d, want %d", fi.Size(), size)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Blocks*512 >= size/2 {
		t.Errorf("%d bytes allocated of %d: the disk is not sparse", st.Blocks*512, size)
	}
	// The ext4 superblock, 1024 bytes in: its magic and the label the
	// guest's tools show.
	sb := make([]byte, 1024)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadAt(sb, 1024); err != nil {
		t.Fatal(err)
	}
	if magic := binary.LittleEndian.Uint16(sb[0x38:]); magic != 0xef53 {
		t.Errorf("superblock magic %#x, want ext4's 0xef53", magic)
	}
	if label := strings.TrimRight(string(sb[0x78:0x88]), "\x00"); label != DiskSerial {
		t.Errorf("label %q, want %q", label, DiskSerial)
	}
	if c := d.Config(); c.Path != path || c.Serial != DiskSerial || c.ReadOnly || c.CopyOnWrite {
		t.Errorf("Config() = %+v, want a writable disk at %s with serial %s", c, path, DiskSerial)
	}
	if got, want := d.Arg(), "path="+path+",serial="+DiskSerial; got != want {
		t.Errorf("Arg() = %q, want %q", got, want)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("the directory holds %d entries, want the disk alone (no temporary left)", len(entries))
	}

	// A second disk at the same path is refused: a data root is one VM's.
	if _, err := CreateDisk(context.Background(), path, size); !errors.Is(err, fs.ErrExist) {
		t.Errorf("CreateDisk over an existing file: %v, want fs.ErrExist", err)
	}
	if err := d.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("after Remove: %v", err)
	}
	if err := d.Remove(); err != nil {
		t.Errorf("Remove of a disk already gone: %v", err)
	}
}
