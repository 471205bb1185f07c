package image

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Annotations that name an image in an OCI layout's index.json: containerd
// and docker write the full name in the first, the OCI spec's ref.name is
// often only a tag.
const (
	annotationContainerdName = "io.containerd.image.name"
	annotationRefName        = "org.opencontainers.image.ref.name"
)

// Import stores an image from a file on this machine: a `docker save`
// tarball (plain or gzipped), an OCI archive (a tar of an OCI image
// layout), or an OCI image layout directory. With ref "" the image is
// stored under the name(s) the archive gives it, and an archive that
// names none, or holds several images, is an error asking for a name;
// otherwise ref picks the image so named in the archive (or its only one)
// and is the name stored.
func (s *Store) Import(ctx context.Context, path, ref string, o Options) (*Image, error) {
	var want string
	if ref != "" {
		n, err := normalize(ref)
		if err != nil {
			return nil, fmt.Errorf("import %s: name %q: %w", path, ref, err)
		}
		want = n
	}
	plat, err := parsePlatform(o.Platform)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", path, err)
	}
	im, err := s.importPath(ctx, path, want, plat, &o)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", path, err)
	}
	return im, nil
}

func (s *Store) importPath(ctx context.Context, p, want string, plat v1.Platform, o *Options) (*Image, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if fi.IsDir() {
		return s.importLayout(ctx, p, want, plat, nil, o)
	}
	open := archiveOpener(ctx, p, o)
	kind, entries, err := archiveKind(open, o)
	if err != nil {
		return nil, err
	}
	switch kind {
	case "oci":
		w, err := newWorkDir(s.path(tmpDir))
		if err != nil {
			return nil, err
		}
		defer w.remove()
		dir := w.join("layout")
		if err := extractArchive(ctx, open, dir, o); err != nil {
			return nil, fmt.Errorf("unpack OCI archive: %w", err)
		}
		return s.importLayout(ctx, dir, want, plat, w, o)
	case "docker":
		// go-containerregistry's tarball reads the archive from its
		// start for every file it looks up (about two per layer), so
		// the archive is bounded in entries and, when gzipped,
		// uncompressed once to a plain tar whose file contents a
		// lookup seeks past.
		if entries > maxSaveEntries {
			return nil, fmt.Errorf("docker save tarball of %d entries: more than the %d an image is allowed (docker writes about four a layer)", entries, maxSaveEntries)
		}
		w, err := newWorkDir(s.path(tmpDir))
		if err != nil {
			return nil, err
		}
		defer w.remove()
		if open, err = plainArchive(ctx, open, w.join("save.tar")); err != nil {
			return nil, fmt.Errorf("uncompress docker save tarball: %w", err)
		}
		return s.importDockerSave(ctx, open, want, plat, w, o)
	}
	return nil, errors.New("neither a docker save tarball (no manifest.json) nor an OCI archive (no oci-layout and index.json)")
}

// archiveOpener opens the archive, through gzip when it is compressed.
// Every read checks ctx, and a gzipped archive is read only up to o's
// MaxBytes each time it is opened (the archive is opened once per file
// looked up in it, by archiveKind, extractArchive and tarball): a few MiB
// of gzip can stand for terabytes.
func archiveOpener(ctx context.Context, p string, o *Options) tarball.Opener {
	maxBytes, _, _ := o.limits()
	return func() (io.ReadCloser, error) {
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		var magic [2]byte
		if n, _ := f.ReadAt(magic[:], 0); n < 2 || magic != [2]byte{0x1f, 0x8b} {
			return &ctxFile{ctx: ctx, File: f}, nil // tar can seek past file contents in it
		}
		zr, err := gzip.NewReader(bufio.NewReader(f))
		if err != nil {
			f.Close()
			return nil, err
		}
		r := &ctxReader{ctx: ctx, r: zr, budget: budget{limit: LimitBytes, max: maxBytes, what: "the archive's uncompressed bytes"}}
		return &readCloser{Reader: r, close: func() error { zr.Close(); return f.Close() }}, nil
	}
}

// ctxFile is a file whose reads fail once ctx is done; it still seeks,
// so that tar skips file contents without reading them.
type ctxFile struct {
	ctx context.Context
	*os.File
}

func (c *ctxFile) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.File.Read(p)
}

type readCloser struct {
	io.Reader
	close func() error
}

func (r *readCloser) Close() error { return r.close() }

// Bounds on a docker save tarball, which the tarball package scans once
// for each file it looks up: at most maxSaveLayers lookups of layers (a
// manifest can name one layer file any number of times) in an archive of
// at most maxSaveEntries entries, a few million tar headers in all.
// Docker itself cannot run an image of more than 127 layers.
const (
	maxSaveEntries = 4096
	maxSaveLayers  = 512
)

// plainArchive gives an opener of a plain tar with the archive's
// contents: open itself when the archive is not gzipped, otherwise the
// archive uncompressed (within open's bounds) to the new file at path.
func plainArchive(ctx context.Context, open tarball.Opener, path string) (tarball.Opener, error) {
	rc, err := open()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	if _, ok := rc.(*ctxFile); ok {
		return open, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	_, err = io.Copy(f, rc)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	return func() (io.ReadCloser, error) {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		return &ctxFile{ctx: ctx, File: f}, nil
	}, nil
}

// archiveKind tells a docker save tarball ("docker") from an OCI archive
// ("oci") by their top-level files, and counts the archive's entries. An
// archive with both (docker 25 and later writes both) is read as OCI,
// which keeps the manifest digest. manifest.json and index.json are read
// whole into memory later, so each counts against o's MaxMetaBytes.
func archiveKind(open tarball.Opener, o *Options) (kind string, entries int, err error) {
	_, _, maxMeta := o.limits()
	rc, err := open()
	if err != nil {
		return "", 0, err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var manifest, ociLayout, index bool
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", entries, fmt.Errorf("read archive: %w", err)
		}
		entries++
		n := path.Clean(strings.TrimLeft(hdr.Name, "/"))
		if n == "manifest.json" || n == "index.json" {
			held := budget{limit: LimitMetaBytes, max: maxMeta, what: "the archive's " + n}
			if err := held.add(hdr.Size); err != nil {
				return "", entries, err
			}
		}
		switch n {
		case "manifest.json":
			manifest = true
		case "oci-layout":
			ociLayout = true
		case "index.json":
			index = true
		}
	}
	switch {
	case ociLayout && index:
		return "oci", entries, nil
	case manifest:
		return "docker", entries, nil
	}
	return "", entries, nil
}

// extractArchive unpacks the directories and regular files of an OCI
// archive into dir (through an os.Root: nothing lands outside it), within
// o's limits: the blobs are written before their digests are checked, and
// a gzipped archive can expand without bound.
func extractArchive(ctx context.Context, open tarball.Opener, dir string, o *Options) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	rc, err := open()
	if err != nil {
		return err
	}
	defer rc.Close()
	maxBytes, maxEntries, _ := o.limits()
	written := budget{limit: LimitBytes, max: maxBytes, what: "the OCI archive's files"}
	entries := budget{limit: LimitEntries, max: maxEntries, what: "the OCI archive's tar entries"}
	tr := tar.NewReader(&ctxReader{ctx: ctx, r: rc, budget: budget{limit: LimitBytes, max: maxBytes, what: "the OCI archive's uncompressed tar stream"}})
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := entries.add(1); err != nil {
			return err
		}
		n, err := entryName(hdr.Name)
		if err != nil {
			return err
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(n, 0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := written.add(hdr.Size); err != nil {
				return err
			}
			if d := path.Dir(n); d != "." {
				if err := root.MkdirAll(d, 0o700); err != nil {
					return err
				}
			}
			f, err := root.OpenFile(n, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("%s: %w", n, err)
			}
		}
	}
}

// named is one image an archive offers, with the names it gives it.
type named struct {
	names    []string // normalized
	platform *v1.Platform
	pick     func() (v1.Image, error)
}

// choose picks the image to import: with want set, the one named want, or
// else the only one, stored as want; with want "", the only one, which
// must have a name, stored under its names. Entries that differ only in
// platform count as one image, and plat's is taken.
func choose(offers []named, want string, plat v1.Platform) (named, []string, error) {
	if len(offers) == 0 {
		return named{}, nil, errors.New("the archive holds no image")
	}
	var all []string
	for _, c := range offers {
		all = append(all, c.names...)
	}
	cands := offers
	if want != "" {
		var byName []named
		for _, c := range offers {
			if slices.Contains(c.names, want) {
				byName = append(byName, c)
			}
		}
		if len(byName) > 0 {
			cands = byName
		}
	}
	if len(cands) > 1 && sameNames(cands) {
		// One image in several platforms: take plat's.
		var byPlat []named
		for _, c := range cands {
			if c.platform != nil && matches(*c.platform, plat) {
				byPlat = append(byPlat, c)
			}
		}
		if len(byPlat) > 0 {
			cands = byPlat
		}
	}
	if len(cands) > 1 {
		if want != "" {
			return named{}, nil, fmt.Errorf("the archive holds %d images and none is named %s (names: %s)",
				len(offers), want, listOrNone(all))
		}
		return named{}, nil, fmt.Errorf("the archive holds %d images (names: %s); choose one with --name",
			len(offers), listOrNone(all))
	}
	c := cands[0]
	if want != "" {
		return c, []string{want}, nil
	}
	if len(c.names) == 0 {
		return named{}, nil, errors.New("the archive does not name its image; give it a name with --name")
	}
	return c, c.names, nil
}

func sameNames(cands []named) bool {
	for _, c := range cands[1:] {
		if !slices.Equal(c.names, cands[0].names) {
			return false
		}
	}
	return true
}

func listOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// importDockerSave imports from a `docker save` tarball. It has no
// manifest, so the image's Digest is left empty (computing one would mean
// compressing every layer).
func (s *Store) importDockerSave(ctx context.Context, open tarball.Opener, want string, plat v1.Platform, w *workDir, o *Options) (*Image, error) {
	m, err := tarball.LoadManifest(open)
	if err != nil {
		return nil, fmt.Errorf("read manifest.json: %w", err)
	}
	var offers []named
	for i, d := range m {
		if len(d.Layers) > maxSaveLayers {
			return nil, fmt.Errorf("manifest.json: image %d has %d layers, more than the %d allowed", i+1, len(d.Layers), maxSaveLayers)
		}
		var names []string
		var tag *name.Tag
		for _, t := range d.RepoTags {
			nt, err := name.NewTag(t)
			if err != nil {
				return nil, fmt.Errorf("manifest.json: tag %q: %w", t, err)
			}
			if tag == nil {
				tag = &nt
			}
			names = append(names, nt.Name())
		}
		single := len(m) == 1
		if !single && tag == nil {
			return nil, fmt.Errorf("manifest.json: image %d of %d has no tag to select it by", i+1, len(m))
		}
		offers = append(offers, named{names: names, pick: func() (v1.Image, error) {
			if single {
				return tarball.Image(open, nil)
			}
			return tarball.Image(open, tag)
		}})
	}
	c, names, err := choose(offers, want, plat)
	if err != nil {
		return nil, err
	}
	img, err := c.pick()
	if err != nil {
		return nil, err
	}
	return s.add(ctx, source{img: img, phase: PhaseRead, platform: plat}, names, w, o)
}

// importLayout imports from an OCI image layout directory. The images it
// offers are the entries of its index.json, named by their annotations;
// an entry that is itself an index gives the image for plat.
func (s *Store) importLayout(ctx context.Context, dir, want string, plat v1.Platform, w *workDir, o *Options) (*Image, error) {
	lp, err := layout.FromPath(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errors.New("not an OCI image layout: no index.json")
	}
	if err != nil {
		return nil, fmt.Errorf("OCI layout: %w", err)
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		return nil, fmt.Errorf("OCI layout: %w", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("OCI layout index.json: %w", err)
	}
	var offers []named
	for _, d := range im.Manifests {
		var pick func() (v1.Image, error)
		switch {
		case d.MediaType.IsImage():
			pick = func() (v1.Image, error) { return idx.Image(d.Digest) }
		case d.MediaType.IsIndex():
			pick = func() (v1.Image, error) {
				child, err := idx.ImageIndex(d.Digest)
				if err != nil {
					return nil, err
				}
				return indexImage(child, plat)
			}
		default:
			continue
		}
		offers = append(offers, named{names: layoutNames(d), platform: d.Platform, pick: pick})
	}
	c, names, err := choose(offers, want, plat)
	if err != nil {
		return nil, err
	}
	img, err := c.pick()
	if err != nil {
		return nil, err
	}
	digest, err := img.Digest()
	if err != nil {
		return nil, err
	}
	src := source{img: img, compressed: true, phase: PhaseRead, digest: digest.String(), platform: plat}
	return s.add(ctx, src, names, w, o)
}

// layoutNames is the normalized name an index.json entry's annotations
// give, if any. A ref.name that is only a tag ("12", "latest") is not a
// name.
func layoutNames(d v1.Descriptor) []string {
	for _, key := range []string{annotationContainerdName, annotationRefName} {
		v := d.Annotations[key]
		if v == "" {
			continue
		}
		if key == annotationRefName && !strings.ContainsAny(v, "/:") {
			continue
		}
		if n, err := normalize(v); err == nil {
			return []string{n}
		}
	}
	return nil
}
