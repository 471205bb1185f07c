package image

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func writeDockerSave(t testing.TB, path, tag string, img v1.Image) {
	t.Helper()
	ref, err := name.NewTag(tag)
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(path, ref, img); err != nil {
		t.Fatal(err)
	}
}

func writeLayout(t testing.TB, dir string, img v1.Image, annotations map[string]string) {
	t.Helper()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	var opts []layout.Option
	if annotations != nil {
		opts = append(opts, layout.WithAnnotations(annotations))
	}
	if err := p.AppendImage(img, opts...); err != nil {
		t.Fatal(err)
	}
}

// tarDir writes a tar of dir's contents, gzipped when zip is set.
func tarDir(t testing.TB, dir, out string, zip bool) {
	t.Helper()
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var w io.Writer = f
	var zw *gzip.Writer
	if zip {
		zw = gzip.NewWriter(f)
		w = zw
	}
	tw := tar.NewWriter(w)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			_, err = tw.Write(b)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if zw != nil {
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestImportDockerSave(t *testing.T) {
	for _, zip := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "gzip"}[zip], func(t *testing.T) {
			img := sampleImage(t, "app:nogroup")
			dir := t.TempDir()
			archive := filepath.Join(dir, "save.tar")
			writeDockerSave(t, archive, "example.com/test/saved:v2", img)
			if zip {
				b, _ := os.ReadFile(archive)
				f, _ := os.Create(archive)
				zw := gzip.NewWriter(f)
				zw.Write(b)
				zw.Close()
				f.Close()
			}
			s := openStore(t)
			var pl progressLog
			o := testOptions()
			o.Progress = pl.add
			im, err := s.Import(context.Background(), archive, "", o)
			if err != nil {
				t.Fatal(err)
			}
			id, _ := img.ConfigName()
			if im.ID != id.Hex || len(im.Refs) != 1 || im.Refs[0] != "example.com/test/saved:v2" || im.Digest != "" {
				t.Errorf("imported %s %v %q", im.ID, im.Refs, im.Digest)
			}
			if im.Config.UID != 1000 || im.Config.GID != 65534 {
				t.Errorf("user app:nogroup = %d:%d, want 1000:65534", im.Config.UID, im.Config.GID)
			}
			checkSample(t, im.Rootfs)
			fsck(t, im.Rootfs)
			if len(pl.phase(PhaseRead)) == 0 || len(pl.phase(PhaseConvert)) == 0 {
				t.Errorf("progress = %+v", pl.events())
			}
			tmpEmpty(t, s)

			// Another name for the same archive picks its only image.
			im2, err := s.Import(context.Background(), archive, "mine:1", testOptions())
			if err != nil {
				t.Fatal(err)
			}
			if im2.ID != im.ID || len(im2.Refs) != 2 {
				t.Errorf("second import: %s %v", im2.ID, im2.Refs)
			}
		})
	}
}

func TestImportOCILayoutAndArchive(t *testing.T) {
	img := sampleImage(t, "")
	id, _ := img.ConfigName()
	digest, _ := img.Digest()
	dir := filepath.Join(t.TempDir(), "layout")
	writeLayout(t, dir, img, map[string]string{annotationRefName: "example.com/test/oci:v1"})

	s := openStore(t)
	im, err := s.Import(context.Background(), dir, "", testOptions())
	if err != nil {
		t.Fatal(err)
	}
	if im.ID != id.Hex || im.Digest != digest.String() || len(im.Refs) != 1 || im.Refs[0] != "example.com/test/oci:v1" {
		t.Errorf("layout import: %s %s %v", im.ID, im.Digest, im.Refs)
	}
	checkSample(t, im.Rootfs)

	for _, zip := range []bool{false, true} {
		archive := filepath.Join(t.TempDir(), "oci.tar")
		tarDir(t, dir, archive, zip)
		s2 := openStore(t)
		im, err := s2.Import(context.Background(), archive, "", testOptions())
		if err != nil {
			t.Fatalf("archive (gzip %v): %v", zip, err)
		}
		if im.ID != id.Hex || im.Digest != digest.String() || im.Refs[0] != "example.com/test/oci:v1" {
			t.Errorf("archive import: %s %s %v", im.ID, im.Digest, im.Refs)
		}
		checkSample(t, im.Rootfs)
		tmpEmpty(t, s2)
	}
}

func TestImportNeedsName(t *testing.T) {
	img := imageOf(t, v1.Config{}, "amd64", layer(t, file("x", "x")))
	dir := filepath.Join(t.TempDir(), "layout")
	// A ref.name that is only a tag is no name.
	writeLayout(t, dir, img, map[string]string{annotationRefName: "latest"})
	s := openStore(t)
	_, err := s.Import(context.Background(), dir, "", testOptions())
	if err == nil || !strings.Contains(err.Error(), "--name") {
		t.Fatalf("err = %v, want one asking for --name", err)
	}
	im, err := s.Import(context.Background(), dir, "local/x", testOptions())
	if err != nil {
		t.Fatal(err)
	}
	if im.Refs[0] != "index.docker.io/local/x:latest" {
		t.Errorf("Refs = %v", im.Refs)
	}

	if _, err := s.Import(context.Background(), t.TempDir(), "x", testOptions()); err == nil || !strings.Contains(err.Error(), "index.json") {
		t.Errorf("import of an empty directory: %v", err)
	}
	if _, err := s.Import(context.Background(), filepath.Join(t.TempDir(), "missing.tar"), "x", testOptions()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("import of a missing file: %v", err)
	}
	notArchive := filepath.Join(t.TempDir(), "junk.tar")
	tarDir(t, t.TempDir(), notArchive, false)
	if _, err := s.Import(context.Background(), notArchive, "x", testOptions()); err == nil {
		t.Error("import of an empty tar succeeded")
	}
	tmpEmpty(t, s)
}

func TestImportChoosesByName(t *testing.T) {
	a := imageOf(t, v1.Config{}, "amd64", layer(t, file("which", "a")))
	b := imageOf(t, v1.Config{}, "amd64", layer(t, file("which", "b")))
	ta, _ := name.NewTag("example.com/a:1")
	tb, _ := name.NewTag("example.com/b:1")
	archive := filepath.Join(t.TempDir(), "two.tar")
	if err := tarball.MultiWriteToFile(archive, map[name.Tag]v1.Image{ta: a, tb: b}); err != nil {
		t.Fatal(err)
	}
	s := openStore(t)
	if _, err := s.Import(context.Background(), archive, "", testOptions()); err == nil || !strings.Contains(err.Error(), "--name") {
		t.Fatalf("err = %v, want one asking for --name", err)
	}
	if _, err := s.Import(context.Background(), archive, "example.com/c:1", testOptions()); err == nil {
		t.Fatal("import of a name the archive lacks succeeded")
	}
	im, err := s.Import(context.Background(), archive, "example.com/b:1", testOptions())
	if err != nil {
		t.Fatal(err)
	}
	if got := catPath(t, im.Rootfs, "/which"); got != "b" {
		t.Errorf("imported %q, want b", got)
	}
	tmpEmpty(t, s)
}

func TestStoreGetListRemove(t *testing.T) {
	img := sampleImage(t, "")
	other := imageOf(t, v1.Config{}, "amd64", layer(t, file("other", "o")))
	dir := t.TempDir()
	writeDockerSave(t, filepath.Join(dir, "a.tar"), "example.com/test/a:1", img)
	writeDockerSave(t, filepath.Join(dir, "b.tar"), "debian:12", other)

	s := openStore(t)
	ctx := context.Background()
	a, err := s.Import(ctx, filepath.Join(dir, "a.tar"), "", testOptions())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Import(ctx, filepath.Join(dir, "a.tar"), "alias:latest", testOptions()); err != nil {
		t.Fatal(err)
	}
	b, err := s.Import(ctx, filepath.Join(dir, "b.tar"), "", testOptions())
	if err != nil {
		t.Fatal(err)
	}
	if b.Refs[0] != "index.docker.io/library/debian:12" {
		t.Errorf("docker hub name not normalized: %v", b.Refs)
	}

	for _, ref := range []string{"debian:12", "docker.io/library/debian:12", "index.docker.io/library/debian:12", b.ID[:4], b.ID[:12], "sha256:" + b.ID, b.ID} {
		im, err := s.Get(ref)
		if err != nil {
			t.Errorf("Get(%q): %v", ref, err)
			continue
		}
		if im.ID != b.ID {
			t.Errorf("Get(%q) = %s, want %s", ref, im.ID, b.ID)
		}
	}
	for _, ref := range []string{"debian:11", "abc", "ffffffff"} {
		if _, err := s.Get(ref); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), ref) {
			t.Errorf("Get(%q) = %v, want ErrNotFound naming it", ref, err)
		}
	}

	list, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].ID != a.ID || list[1].ID != b.ID {
		t.Fatalf("List = %+v", list)
	}
	if got := list[0].Refs; len(got) != 2 || got[0] != "example.com/test/a:1" || got[1] != "index.docker.io/library/alias:latest" {
		t.Errorf("List[0].Refs = %v", got)
	}

	// Removing one of two names keeps the image.
	if err := s.Remove("alias"); err != nil {
		t.Fatal(err)
	}
	if im, err := s.Get(a.ID); err != nil || len(im.Refs) != 1 {
		t.Fatalf("after removing a name: %v %v", im, err)
	}
	// Removing the last name deletes it; a VM holding the file keeps it.
	held, err := os.Open(a.Rootfs)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := s.Remove("example.com/test/a:1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(a.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after removal: %v", err)
	}
	if _, err := os.Stat(filepath.Dir(a.Rootfs)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("image directory still there: %v", err)
	}
	if _, err := held.ReadAt(make([]byte, 4096), 1024); err != nil {
		t.Errorf("open rootfs unreadable after removal: %v", err)
	}

	// Removing by ID drops every name.
	if _, err := s.Import(ctx, filepath.Join(dir, "b.tar"), "second:1", testOptions()); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(b.ID[:8]); err != nil {
		t.Fatal(err)
	}
	noImages(t, s)
	if err := s.Remove("debian:12"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Remove of a removed name: %v", err)
	}

	// A new Store on the same directory sees the same (empty) state.
	s2, err := Open(s.Dir())
	if err != nil {
		t.Fatal(err)
	}
	noImages(t, s2)
}

func TestNameMovesToNewImage(t *testing.T) {
	v1img := imageOf(t, v1.Config{}, "amd64", layer(t, file("v", "1")))
	v2img := imageOf(t, v1.Config{}, "amd64", layer(t, file("v", "2")))
	dir := t.TempDir()
	writeDockerSave(t, filepath.Join(dir, "1.tar"), "app:latest", v1img)
	writeDockerSave(t, filepath.Join(dir, "2.tar"), "app:latest", v2img)
	s := openStore(t)
	first, err := s.Import(context.Background(), filepath.Join(dir, "1.tar"), "", testOptions())
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.Import(context.Background(), filepath.Join(dir, "2.tar"), "", testOptions())
	if err != nil {
		t.Fatal(err)
	}
	if first.ID == second.ID {
		t.Fatal("same ID for different images")
	}
	// The old image lost its only name, so it is gone.
	if _, err := s.Get(first.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("old image: %v", err)
	}
	if im, err := s.Get("app"); err != nil || im.ID != second.ID {
		t.Errorf("app = %v %v, want %s", im, err, second.ID)
	}
}

func TestNameDebugfsCannotTake(t *testing.T) {
	nl := file("odd/new\nline", "x")
	nl.uid, nl.gid = 5, 5
	img := imageOf(t, v1.Config{}, "amd64", layer(t, dir("odd", 0o755), nl, file("odd/plain", "p")))
	archive := filepath.Join(t.TempDir(), "save.tar")
	writeDockerSave(t, archive, "example.com/odd:1", img)
	s := openStore(t)
	var warned []string
	o := testOptions()
	o.Logf = func(f string, a ...any) { warned = append(warned, fmt.Sprintf(f, a...)) }
	im, err := s.Import(context.Background(), archive, "", o)
	if err != nil {
		t.Fatal(err)
	}
	if im.MetaSkipped != 1 || len(warned) != 1 || !strings.Contains(warned[0], `new\nline`) {
		t.Errorf("MetaSkipped %d, warnings %q", im.MetaSkipped, warned)
	}
	if got := catPath(t, im.Rootfs, "/odd/plain"); got != "p" {
		t.Errorf("/odd/plain = %q", got)
	}
	fsck(t, im.Rootfs)
}

func TestConcurrentPullsOfOneImage(t *testing.T) {
	reg := fakeRegistry(t, nil)
	img := sampleImage(t, "")
	push(t, reg+"/test/c:1", img)
	push(t, reg+"/test/d:1", img)
	s := openStore(t)
	s2, err := Open(s.Dir()) // as another process would
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, ref := s, reg+"/test/c:1"
			if i%2 == 1 {
				st, ref = s2, reg+"/test/d:1"
			}
			_, errs[i] = st.Pull(context.Background(), ref, testOptions())
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	list, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || len(list[0].Refs) != 2 {
		t.Errorf("List = %+v", list)
	}
	tmpEmpty(t, s)
}
