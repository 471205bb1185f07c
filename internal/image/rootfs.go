package image

import (
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// ImportRootfs stores a root file system tarball (plain or gzipped: what
// mmdebstrap, debootstrap plus tar, or `docker export` write) as a
// one-layer image named ref, as `docker import` does. The image has no
// configuration beyond cfg's Env, WorkingDir, User, Entrypoint and Cmd
// (UID and GID are resolved from the tarball's /etc/passwd and /etc/group).
func (s *Store) ImportRootfs(ctx context.Context, path, ref string, cfg Config, o Options) (*Image, error) {
	n, err := normalize(ref)
	if err != nil {
		return nil, fmt.Errorf("import %s: name %q: %w", path, ref, err)
	}
	plat, err := parsePlatform(o.Platform)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", path, err)
	}
	l, err := newRootfsLayer(ctx, path, &o)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", path, err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", path, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", path, err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = plat.OS, plat.Architecture, plat.Variant
	cf.Created = v1.Time{Time: l.mtime}
	cf.Config.Env, cf.Config.WorkingDir, cf.Config.User = cfg.Env, cfg.WorkingDir, cfg.User
	cf.Config.Entrypoint, cf.Config.Cmd = cfg.Entrypoint, cfg.Cmd
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, fmt.Errorf("import %s: %w", path, err)
	}
	im, err := s.add(ctx, source{img: img, phase: PhaseRead, platform: plat}, []string{n}, nil, &o)
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", path, err)
	}
	return im, nil
}

// rootfsLayer is a tarball on disk as an uncompressed layer: its digest is
// its diff ID (the sha256 of the tar), computed once when it is made, so
// nothing is compressed only to be named.
type rootfsLayer struct {
	path   string
	gz     bool
	diffID v1.Hash
	size   int64 // of the uncompressed tar
	mtime  time.Time
}

var _ v1.Layer = (*rootfsLayer)(nil)

// newRootfsLayer reads the tarball once to name it: up to o's MaxBytes of
// uncompressed tar (what unpack would refuse anyway), so that a gzip bomb
// is refused after reading that much rather than after all of it.
func newRootfsLayer(ctx context.Context, path string, o *Options) (*rootfsLayer, error) {
	l := &rootfsLayer{path: path}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file (a root file system tarball)")
	}
	l.mtime = fi.ModTime().UTC().Truncate(time.Second)
	var magic [2]byte
	if n, _ := f.ReadAt(magic[:], 0); n == 2 && magic == [2]byte{0x1f, 0x8b} {
		l.gz = true
	}
	rc, err := l.Uncompressed()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	h := sha256.New()
	maxBytes, _, _ := o.limits()
	n, err := io.Copy(h, &ctxReader{ctx: ctx, r: rc, budget: budget{limit: LimitBytes, max: maxBytes, what: "the tarball's uncompressed bytes"}})
	if err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	l.size = n
	l.diffID = v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}
	return l, nil
}

func (l *rootfsLayer) Digest() (v1.Hash, error)            { return l.diffID, nil }
func (l *rootfsLayer) DiffID() (v1.Hash, error)            { return l.diffID, nil }
func (l *rootfsLayer) Size() (int64, error)                { return l.size, nil }
func (l *rootfsLayer) MediaType() (types.MediaType, error) { return types.OCIUncompressedLayer, nil }
func (l *rootfsLayer) Compressed() (io.ReadCloser, error)  { return l.Uncompressed() }

// Uncompressed opens the tarball, through gzip when it is compressed.
func (l *rootfsLayer) Uncompressed() (io.ReadCloser, error) {
	f, err := os.Open(l.path)
	if err != nil {
		return nil, err
	}
	if !l.gz {
		return f, nil
	}
	zr, err := gzip.NewReader(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	var once sync.Once
	return &readCloser{Reader: zr, close: func() error {
		var err error
		once.Do(func() { zr.Close(); err = f.Close() })
		return err
	}}, nil
}
