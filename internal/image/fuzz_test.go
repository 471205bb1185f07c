package image

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Limits small enough that a fuzz input past them is found at once, and
// checked against what is left on disk.
func fuzzOptions() Options {
	o := testOptions()
	o.MaxBytes = 1 << 20
	o.MaxEntries = 512
	o.MaxMetaBytes = 256 << 10
	return o
}

// layerSeeds are tar streams that reach each kind of entry unpack makes,
// and the ways out of the root it must refuse.
func layerSeeds(f *testing.F) [][]byte {
	var chain []entry
	for i := range 20 {
		chain = append(chain, hardlink(fmt.Sprintf("l%d", i), fmt.Sprintf("l%d", i+1)))
	}
	chain = append(chain, hardlink("l20", "target"), file("target", "t"))
	x := file("etc/x", "x")
	x.xattrs = map[string]string{"user.a": "b", "security.capability": "\x01\x00\x00\x02"}
	seeds := [][]byte{
		tarBytes(f, []entry{dir("etc", 0o755), x, symlink("etc/s", "x"), hardlink("etc/h", "etc/x"),
			{name: "dev/null", typ: 'c', mode: 0o666}, dir("ro", 0o500), file("ro/f", "f")}),
		tarBytes(f, chain),
		tarBytes(f, []entry{symlink("evil", "../.."), file("evil/escape", "x")}),
		tarBytes(f, []entry{symlink("abs", "/"), file("abs/escape", "x"), hardlink("hl", "../escape")}),
		tarBytes(f, []entry{file("../escape", "x")}),
		tarBytes(f, []entry{file("a/b", "1"), file("a", "2"), dir("a/b", 0o755), file("a/b/c", "3")}),
		sparseTar(f, "sparse", 1<<40),
		gzipBytes(tarBytes(f, []entry{file("zeros", string(make([]byte, 4<<20)))})),
	}
	return seeds
}

// checkInside fails when anything under top other than the paths kept is
// outside inside (a directory under top).
func checkInside(t *testing.T, top, inside string, keep ...string) {
	t.Helper()
	filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == top || p == inside || strings.HasPrefix(p, inside+string(filepath.Separator)) {
			return nil
		}
		for _, k := range keep {
			if p == k {
				return nil
			}
		}
		t.Errorf("written outside %s: %s", inside, p)
		return nil
	})
}

// regularBytes is the apparent size of the regular files under dir, each
// inode counted once.
func regularBytes(dir string) int64 {
	var n int64
	seen := map[uint64]bool{}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if fi, err := d.Info(); err == nil && !seen[inode(fi)] {
			seen[inode(fi)] = true
			n += fi.Size()
		}
		return nil
	})
	return n
}

// FuzzUnpackLayer feeds unpack a tar stream (gunzipped first when it is
// gzipped) as mutate.Extract would, though unpack must hold without the
// checks mutate.Extract makes: nothing is written outside the staging
// directory, the files written stay within MaxBytes, and the work of
// making hard links and setting directory modes is linear in the entries.
func FuzzUnpackLayer(f *testing.F) {
	for _, s := range layerSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		top := t.TempDir()
		sentinel := filepath.Join(top, "escape-target")
		os.WriteFile(sentinel, []byte("keep"), 0o644)
		staging := filepath.Join(top, "staging")
		os.Mkdir(staging, 0o755)
		var r io.Reader = bytes.NewReader(b)
		if len(b) > 2 && b[0] == 0x1f && b[1] == 0x8b {
			zr, err := gzip.NewReader(r)
			if err != nil {
				return
			}
			r = zr
		}
		o := fuzzOptions()
		st, err := unpack(context.Background(), r, staging, &o)
		checkInside(t, top, staging, sentinel)
		if b, _ := os.ReadFile(sentinel); string(b) != "keep" {
			t.Errorf("the file outside was changed: %q", b)
		}
		if n := regularBytes(staging); n > o.MaxBytes {
			t.Errorf("%d bytes of files staged, over the limit of %d (err %v)", n, o.MaxBytes, err)
		}
		// Each entry costs at most three calls (a hard link: a look at
		// its target, and once more when its target is made; a
		// directory: one), whatever order they come in.
		if st != nil && st.ops > 3*int(o.MaxEntries) {
			t.Errorf("%d file system calls for at most %d entries", st.ops, o.MaxEntries)
		}
	})
}

// archiveSeeds are a docker save tarball and an OCI archive, plain and
// gzipped, of a small image.
func archiveSeeds(f *testing.F) [][]byte {
	img := imageOf(f, v1.Config{Cmd: []string{"/bin/sh"}}, "amd64",
		layer(f, dir("etc", 0o755), file("etc/passwd", "root:x:0:0::/root:/bin/sh\n"), hardlink("etc/h", "etc/passwd")),
		layer(f, file("etc/.wh.passwd", ""), symlink("etc/s", "/etc/h")))
	td := f.TempDir()
	save := filepath.Join(td, "save.tar")
	writeDockerSave(f, save, "example.com/fuzz/save:1", img)
	layoutDir := filepath.Join(td, "layout")
	writeLayout(f, layoutDir, img, map[string]string{annotationRefName: "example.com/fuzz/oci:1"})
	var seeds [][]byte
	for _, zip := range []bool{false, true} {
		out := filepath.Join(td, fmt.Sprintf("oci-%v.tar", zip))
		tarDir(f, layoutDir, out, zip)
		b, err := os.ReadFile(out)
		if err != nil {
			f.Fatal(err)
		}
		seeds = append(seeds, b)
	}
	b, err := os.ReadFile(save)
	if err != nil {
		f.Fatal(err)
	}
	return append(seeds, b, gzipBytes(b))
}

// fuzzImport runs one import of the bytes b as a file, through imp, in a
// store of its own, and checks what it left: nothing outside the store
// (but the file), nothing in tmp/, and no more on disk than the limits
// allow.
func fuzzImport(t *testing.T, b []byte, imp func(s *Store, path string, o Options) error) {
	top := t.TempDir()
	in := filepath.Join(top, "in")
	if err := os.WriteFile(in, b, 0o644); err != nil {
		t.Fatal(err)
	}
	storeDir := filepath.Join(top, "store")
	s, err := Open(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	o := fuzzOptions()
	err = imp(s, in, o)
	checkInside(t, top, storeDir, in)
	tmpEmpty(t, s)
	if err != nil {
		noImages(t, s)
	}
	// A stored image holds at most MaxBytes of files; its ext4 adds
	// metadata (inodes for MaxEntries, directories, the journal-less
	// superblocks) that mke2fs sizes from the tree.
	var onDisk int64
	filepath.WalkDir(storeDir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				onDisk += blocksOf(fi) * 512
			}
		}
		return nil
	})
	if max := 4*o.MaxBytes + 16<<20; onDisk > max {
		t.Errorf("the store takes %d bytes on disk after an import under a %d-byte limit (err %v)", onDisk, o.MaxBytes, err)
	}
}

// FuzzImportArchive feeds Import a file: a docker save tarball or an OCI
// archive, each perhaps gzipped, whose every part (index, manifests,
// config, layers) the input chooses. Digests are checked, so mutations
// of a layer mostly stop there; the seeds' structure is what is explored.
func FuzzImportArchive(f *testing.F) {
	if _, err := findTool("mke2fs"); err != nil {
		f.Skip(err)
	}
	for _, s := range archiveSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fuzzImport(t, b, func(s *Store, path string, o Options) error {
			_, err := s.Import(context.Background(), path, "example.com/fuzz/in:1", o)
			return err
		})
	})
}

// FuzzImportRootfs feeds ImportRootfs a root file system tarball, plain or
// gzipped: no digest stands between the input and unpack.
func FuzzImportRootfs(f *testing.F) {
	if _, err := findTool("mke2fs"); err != nil {
		f.Skip(err)
	}
	for _, s := range layerSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fuzzImport(t, b, func(s *Store, path string, o Options) error {
			_, err := s.ImportRootfs(context.Background(), path, "example.com/fuzz/rootfs:1", Config{User: "0"}, o)
			return err
		})
	})
}
