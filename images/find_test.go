package images

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/microvm/microvm/internal/image"
)

// tinyRootfs writes a root file system tarball of n files and returns
// its path.
func tinyRootfs(t *testing.T, n int) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755})
	for i := range n {
		tw.WriteHeader(&tar.Header{Name: "etc/f" + string(rune('a'+i)), Typeflag: tar.TypeReg, Mode: 0o644, Size: 3})
		tw.Write([]byte("vm\n"))
	}
	tw.Close()
	path := filepath.Join(t.TempDir(), "rootfs.tar")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestFind: a stored image is found without a pull; a missing one is
// what the puller returns, for the ref asked, errors included.
func TestFind(t *testing.T) {
	ctx := context.Background()
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	stored, err := s.ImportRootfs(ctx, tinyRootfs(t, 1), "example/tiny:1", Config{})
	if err != nil {
		t.Fatal(err)
	}
	noPull := func(context.Context, string) (*Image, error) {
		t.Error("pulled an image that is stored")
		return nil, nil
	}
	if img, err := s.Find(ctx, "example/tiny:1", noPull); err != nil || img.ID != stored.ID {
		t.Errorf("stored: %v, %v; want %s", img, err, stored.ID)
	}

	pulled := &Image{ID: "pulled"}
	var asked string
	img, err := s.Find(ctx, "example/other:2", func(_ context.Context, ref string) (*Image, error) {
		asked = ref
		return pulled, nil
	})
	if err != nil || img != pulled || asked != "example/other:2" {
		t.Errorf("missing: %v, %v, pulled %q; want the puller's image for example/other:2", img, err, asked)
	}

	errPull := errors.New("registry down")
	if _, err := s.Find(ctx, "example/other:2", func(context.Context, string) (*Image, error) { return nil, errPull }); err != errPull {
		t.Errorf("pull failed: %v, want the puller's error as it is", err)
	}
}

// TestFindBrokenStore: a store that cannot answer is not a missing image:
// its error comes back and nothing is pulled.
func TestFindBrokenStore(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "refs.json"), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = s.Find(context.Background(), "example/tiny:1", func(context.Context, string) (*Image, error) {
		t.Error("pulled over a broken store")
		return nil, nil
	})
	if err == nil || errors.Is(err, ErrNotFound) {
		t.Errorf("broken store: %v, want its error", err)
	}
}

// TestImportWithOptions: the With methods hand their options to the
// store: progress is reported, and a limit refuses an image past it with
// nothing stored.
func TestImportWithOptions(t *testing.T) {
	ctx := context.Background()
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var reports int
	if _, err := s.ImportRootfsWith(ctx, tinyRootfs(t, 1), "example/tiny:1", Config{},
		Options{Progress: func(Progress) { reports++ }}); err != nil {
		t.Fatal(err)
	}
	if reports == 0 {
		t.Error("no progress reported")
	}
	_, err = s.ImportRootfsWith(ctx, tinyRootfs(t, 4), "example/big:1", Config{}, Options{MaxEntries: 2})
	var le *image.LimitError
	if !errors.As(err, &le) || le.Limit != image.LimitEntries {
		t.Errorf("past MaxEntries: %v, want a *image.LimitError for %s", err, image.LimitEntries)
	}
	if _, err := s.Get("example/big:1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("refused image: Get = %v, want ErrNotFound", err)
	}
}
