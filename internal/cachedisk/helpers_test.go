package cachedisk

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// testStore is a store in a test's temporary directory whose fresh disks
// are fakeExt4 (no mkfs needed); its log lines are in log.
func testStore(t testing.TB, limits Limits) (*Store, *bytes.Buffer) {
	t.Helper()
	var log bytes.Buffer
	s, err := Open(t.TempDir(), limits, &log)
	if err != nil {
		t.Fatal(err)
	}
	s.newDisk = fakeExt4
	return s, &log
}

// fakeExt4 is a sparse file of size bytes with an ext4 superblock magic
// and a label in its head: enough for the store's checks, and no mkfs.
func fakeExt4(_ context.Context, path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return err
	}
	var sb [1024]byte
	binary.LittleEndian.PutUint16(sb[56:], ext4Magic)
	copy(sb[120:], "fake-cache")
	_, err = f.WriteAt(sb[:], 1024)
	return err
}

// checkout is Store.Checkout that fails the test on error.
func checkout(t testing.TB, s *Store, name string, size int64) (Clone, string) {
	t.Helper()
	c, err := s.Checkout(context.Background(), name, size)
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Path(c)
	if err != nil {
		t.Fatal(err)
	}
	return c, p
}

// writeAt writes data at off in the file at path.
func writeAt(t testing.TB, path string, off int64, data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
}

// readAt reads n bytes at off from the file at path.
func readAt(t testing.TB, path string, off int64, n int) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	return b
}

// commitWith checks out name, writes data at off, and commits it.
func commitWith(t testing.TB, s *Store, name string, off int64, data []byte) int {
	t.Helper()
	c, p := checkout(t, s, name, 1<<20)
	writeAt(t, p, off, data)
	n, err := s.Commit(c)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// versionsOf is the numbers of name's versions on disk (manifests), in
// order.
func versionsOf(t testing.TB, s *Store, name string) []int {
	t.Helper()
	entries, err := os.ReadDir(s.nameDir(name))
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range entries {
		if n, ext, ok := parseVersion(e.Name()); ok && ext == manifestExt {
			out = append(out, n)
		}
	}
	return out
}

// logLines is the log's non-empty lines.
func logLines(b *bytes.Buffer) []string {
	var out []string
	for _, l := range strings.Split(b.String(), "\n") {
		if l != "" {
			out = append(out, l)
		}
	}
	return out
}

// imagePath is version n of name's image.
func (s *Store) imagePath(name string, n int) string {
	return filepath.Join(s.nameDir(name), imageName(n))
}
