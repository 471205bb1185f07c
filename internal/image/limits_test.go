package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
)

// sparseTar is a tar of one PAX sparse file (GNU sparse format 0.1) that
// holds one byte of data and says it is size bytes long. archive/tar's
// writer does not write sparse files, so the records are written under
// another name of the same length and renamed in the output.
func sparseTar(t testing.TB, name string, size int64) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := tw.WriteHeader(&tar.Header{
		Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: 1, ModTime: testTime, Format: tar.FormatPAX,
		PAXRecords: map[string]string{
			"XXX.sparse.numblocks": "1",
			"XXX.sparse.map":       "0,1",
			"XXX.sparse.size":      fmt.Sprint(size),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	tw.Write([]byte("x"))
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return bytes.ReplaceAll(buf.Bytes(), []byte("XXX.sparse."), []byte("GNU.sparse."))
}

func gzipBytes(b []byte) []byte {
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	zw.Write(b)
	zw.Close()
	return zb.Bytes()
}

// wantLimit fails unless err is a *LimitError for limit.
func wantLimit(t *testing.T, err error, limit string) {
	t.Helper()
	var le *LimitError
	if !errors.As(err, &le) || !errors.Is(err, ErrLimit) || le.Limit != limit {
		t.Fatalf("err = %v, want a %s LimitError", err, limit)
	}
}

// stagedBytes is what the files under dir take on disk and claim to be.
func stagedBytes(t *testing.T, dir string) (apparent, onDisk int64) {
	t.Helper()
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return nil
		}
		apparent += fi.Size()
		onDisk += blocksOf(fi) * 512
		return nil
	})
	return apparent, onDisk
}

func blocksOf(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks
	}
	return 0
}

// TestUnpackSparseEntryBounded: a PAX sparse entry says it is 1 TiB (or
// 64 MiB, above a 1 MiB limit); unpack used to write every byte of its
// holes as zeros. It is refused before anything of it is written.
func TestUnpackSparseEntryBounded(t *testing.T) {
	for _, c := range []struct {
		name string
		size int64
		o    Options
	}{
		{"64MiB over a 1MiB limit", 64 << 20, Options{MaxBytes: 1 << 20}},
		{"1TiB with the defaults", 1 << 40, Options{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			staging := t.TempDir()
			_, err := unpack(context.Background(), bytes.NewReader(sparseTar(t, "big", c.size)), staging, &c.o)
			wantLimit(t, err, LimitBytes)
			if a, d := stagedBytes(t, staging); a > 1<<20 || d > 1<<20 {
				t.Errorf("staged %d bytes (%d on disk)", a, d)
			}
		})
	}
}

// TestUnpackBytesBounded: files past MaxBytes, and a tar stream past it
// (an entry of a type that is not written still has its bytes read), are
// refused.
func TestUnpackBytesBounded(t *testing.T) {
	o := &Options{MaxBytes: 1 << 20}
	staging := t.TempDir()
	entries := []entry{file("a", strings.Repeat("x", 600<<10)), file("b", strings.Repeat("y", 600<<10))}
	_, err := unpack(context.Background(), bytes.NewReader(tarBytes(t, entries)), staging, o)
	wantLimit(t, err, LimitBytes)
	if a, _ := stagedBytes(t, staging); a > 1<<20 {
		t.Errorf("staged %d bytes, over the 1 MiB limit", a)
	}

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "unknown-type-with-data", Typeflag: 'Z', Size: 2 << 20, Mode: 0o644, Format: tar.FormatPAX})
	tw.Write(make([]byte, 2<<20))
	tw.Close()
	_, err = unpack(context.Background(), bytes.NewReader(buf.Bytes()), t.TempDir(), o)
	if err == nil {
		t.Fatal("a 2 MiB tar stream unpacked under a 1 MiB limit")
	}
	wantLimit(t, err, LimitBytes)
}

func TestUnpackEntriesBounded(t *testing.T) {
	var entries []entry
	for i := range 100 {
		entries = append(entries, file(fmt.Sprintf("f%d", i), ""))
	}
	_, err := unpack(context.Background(), bytes.NewReader(tarBytes(t, entries)), t.TempDir(), &Options{MaxEntries: 50})
	wantLimit(t, err, LimitEntries)
	if _, err := unpack(context.Background(), bytes.NewReader(tarBytes(t, entries)), t.TempDir(), &Options{MaxEntries: 100}); err != nil {
		t.Errorf("100 entries under a limit of 100: %v", err)
	}
}

// TestUnpackMetaBounded: xattrs and the names of directories and hard
// links are held until the end; past MaxMetaBytes the image is refused.
func TestUnpackMetaBounded(t *testing.T) {
	big := strings.Repeat("v", 4000)
	var entries []entry
	for i := range 100 {
		e := file(fmt.Sprintf("f%d", i), "")
		e.xattrs = map[string]string{"user.big": big}
		entries = append(entries, e)
	}
	_, err := unpack(context.Background(), bytes.NewReader(tarBytes(t, entries)), t.TempDir(), &Options{MaxMetaBytes: 64 << 10})
	wantLimit(t, err, LimitMetaBytes)

	var links []entry
	for i := range 100 {
		links = append(links, hardlink(fmt.Sprintf("%0200d", i), "nowhere"))
	}
	_, err = unpack(context.Background(), bytes.NewReader(tarBytes(t, links)), t.TempDir(), &Options{MaxMetaBytes: 8 << 10})
	wantLimit(t, err, LimitMetaBytes)
}

// reversedLinkChain is a tar with a file and n hard links in a chain,
// each to the next one listed: l0 -> l1 -> ... -> l(n-1) -> target.
func reversedLinkChain(t *testing.T, n int) []byte {
	var entries []entry
	for i := range n - 1 {
		entries = append(entries, hardlink(fmt.Sprintf("l%d", i), fmt.Sprintf("l%d", i+1)))
	}
	entries = append(entries, hardlink(fmt.Sprintf("l%d", n-1), "target"), file("target", "t"))
	return tarBytes(t, entries)
}

// TestUnpackHardLinkChainLinear: hard links listed before the links they
// point at were retried until none could be made, which is quadratic in
// their number (9,000 took a minute). The work is counted in file system
// calls, not timed.
func TestUnpackHardLinkChainLinear(t *testing.T) {
	const n = 3000
	staging := t.TempDir()
	st, err := unpack(context.Background(), bytes.NewReader(reversedLinkChain(t, n)), staging, &Options{})
	if err != nil {
		t.Fatal(err)
	}
	if st.ops > 3*n {
		t.Errorf("%d file system calls to make %d hard links, want at most %d", st.ops, n, 3*n)
	}
	target, err := os.Stat(filepath.Join(staging, "target"))
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, n / 2, n - 1} {
		fi, err := os.Stat(filepath.Join(staging, fmt.Sprintf("l%d", i)))
		if err != nil || !os.SameFile(fi, target) {
			t.Errorf("l%d: %v, not a link to target", i, err)
		}
	}
	if st.skipped != 0 {
		t.Errorf("skipped %d", st.skipped)
	}
}

// TestUnpackHardLinksCancelled: making hard links reads nothing, so a
// cancelled context must be checked there too.
func TestUnpackHardLinksCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := 0
	st, err := unpackWith(ctx, bytes.NewReader(reversedLinkChain(t, 500)), t.TempDir(), &Options{}, func() {
		if calls++; calls == 100 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if st.ops > 100 {
		t.Errorf("%d file system calls, want none after the 100th cancelled", st.ops)
	}
}

func TestUnpackNameTooLong(t *testing.T) {
	long := strings.Repeat("d/", pathMax/2) + "f"
	_, err := unpack(context.Background(), bytes.NewReader(tarBytes(t, []entry{symlink("s", long)})), t.TempDir(), &Options{})
	if err == nil || !strings.Contains(err.Error(), "PATH_MAX") {
		t.Errorf("err = %v, want a refusal naming PATH_MAX", err)
	}
}

// TestImportBombRefused: a gzipped root file system tarball and a gzipped
// OCI archive that expand past MaxBytes are refused with ErrLimit, and the
// store keeps nothing of them (no image, tmp/ empty).
func TestImportBombRefused(t *testing.T) {
	td := t.TempDir()
	o := testOptions()
	o.MaxBytes = 4 << 20
	zeros := string(make([]byte, 16<<20))

	rootfs := filepath.Join(td, "bomb.tar.gz")
	os.WriteFile(rootfs, gzipBytes(tarBytes(t, []entry{file("zeros", zeros)})), 0o644)
	s := openStore(t)
	_, err := s.ImportRootfs(context.Background(), rootfs, "test/bomb:1", Config{}, o)
	wantLimit(t, err, LimitBytes)
	noImages(t, s)

	// The layer itself is under the limit as a tar stream; its files are
	// not (a sparse entry).
	sparse := filepath.Join(td, "sparse.tar")
	os.WriteFile(sparse, sparseTar(t, "big", 1<<40), 0o644)
	_, err = s.ImportRootfs(context.Background(), sparse, "test/sparse:1", Config{}, o)
	wantLimit(t, err, LimitBytes)
	noImages(t, s)

	oci := filepath.Join(td, "bomb-oci.tar.gz")
	os.WriteFile(oci, gzipBytes(tarBytes(t, []entry{
		file("oci-layout", `{"imageLayoutVersion":"1.0.0"}`),
		file("index.json", `{"schemaVersion":2,"manifests":[]}`),
		file("blobs/sha256/"+strings.Repeat("0", 64), zeros),
	})), 0o644)
	_, err = s.Import(context.Background(), oci, "test/oci:1", o)
	wantLimit(t, err, LimitBytes)
	noImages(t, s)
}

// TestResolveUserLargePasswd: the image's /etc/passwd was read whole into
// memory; a large one is now read a line at a time.
func TestResolveUserLargePasswd(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "etc"), 0o755)
	f, err := os.Create(filepath.Join(dir, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	line := []byte("user" + strings.Repeat("x", 80) + ":x:1:1::/:/bin/sh\n")
	var chunk []byte
	for range 1 << 10 {
		chunk = append(chunk, line...)
	}
	for range 32 << 20 / len(chunk) {
		f.Write(chunk)
	}
	f.WriteString("app:x:1000:1001::/home/app:/bin/sh\n")
	f.Close()
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	uid, gid, err := resolveUser(root, "app")
	runtime.ReadMemStats(&after)
	if err != nil || uid != 1000 || gid != 1001 {
		t.Fatalf("resolveUser(app) = %d:%d %v", uid, gid, err)
	}
	if n := after.TotalAlloc - before.TotalAlloc; n > 4<<20 {
		t.Errorf("resolveUser allocated %d bytes for a 32 MiB /etc/passwd, want under 4 MiB", n)
	}

	// A line longer than any real one is refused, not held.
	os.WriteFile(filepath.Join(dir, "etc/group"), []byte(strings.Repeat("g", 1<<20)+"\n"), 0o644)
	if _, _, err := resolveUser(root, "app:staff"); err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Errorf("a 1 MiB line in /etc/group: %v", err)
	}
}

// TestImportLargeManifestRefused: a docker save archive's manifest.json is
// read whole into memory, so it counts against MaxMetaBytes.
func TestImportLargeManifestRefused(t *testing.T) {
	o := testOptions()
	o.MaxMetaBytes = 64 << 10
	in := filepath.Join(t.TempDir(), "save.tar")
	os.WriteFile(in, tarBytes(t, []entry{file("manifest.json", "["+strings.Repeat(" ", 128<<10)+"]")}), 0o644)
	s := openStore(t)
	_, err := s.Import(context.Background(), in, "test/big:1", o)
	wantLimit(t, err, LimitMetaBytes)
	noImages(t, s)
}

// rewriteSave rewrites the docker save tarball at path: each entry passes
// through edit (which may change manifest.json), and extra entries are
// appended.
func rewriteSave(t *testing.T, path string, edit func(name string, b []byte) []byte, extra []entry) {
	t.Helper()
	in, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []entry
	tr := tar.NewReader(bytes.NewReader(in))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, file(hdr.Name, string(edit(hdr.Name, b))))
	}
	if err := os.WriteFile(path, tarBytes(t, append(out, extra...)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestImportDockerSaveBounded: go-containerregistry's tarball scans a
// docker save archive from its start for each file it looks up, so a
// manifest naming one layer file thousands of times, or an archive of
// many entries, cost work in the product of the two (and a gzipped
// archive was uncompressed again for every scan). Both are refused now.
func TestImportDockerSaveBounded(t *testing.T) {
	img := sampleImage(t, "")
	dir := t.TempDir()
	s := openStore(t)

	layers := filepath.Join(dir, "layers.tar")
	writeDockerSave(t, layers, "example.com/test/many:1", img)
	rewriteSave(t, layers, func(name string, b []byte) []byte {
		if name != "manifest.json" {
			return b
		}
		var m []map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		l := m[0]["Layers"].([]any)
		for len(l) <= maxSaveLayers {
			l = append(l, l[0])
		}
		m[0]["Layers"] = l
		b, _ = json.Marshal(m)
		return b
	}, nil)
	_, err := s.Import(context.Background(), layers, "", testOptions())
	if err == nil || !strings.Contains(err.Error(), "layers, more than") {
		t.Errorf("a manifest of %d layers: %v", maxSaveLayers+1, err)
	}
	noImages(t, s)
	tmpEmpty(t, s)

	entries := filepath.Join(dir, "entries.tar")
	writeDockerSave(t, entries, "example.com/test/entries:1", img)
	var extra []entry
	for i := 0; i < maxSaveEntries; i++ {
		extra = append(extra, file(fmt.Sprintf("pad/%d", i), ""))
	}
	rewriteSave(t, entries, func(_ string, b []byte) []byte { return b }, extra)
	_, err = s.Import(context.Background(), entries, "", testOptions())
	if err == nil || !strings.Contains(err.Error(), "entries") {
		t.Errorf("an archive of over %d entries: %v", maxSaveEntries, err)
	}
	noImages(t, s)
	tmpEmpty(t, s)
}
