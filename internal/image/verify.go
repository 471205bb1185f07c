package image

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// reporter forwards byte counts to Options.Progress. close stops it: after
// close returns no callback runs, even from mutate.Extract's goroutine,
// which may outlive a failed conversion for a moment.
type reporter struct {
	mu     sync.Mutex
	fn     func(Progress)
	phase  string
	done   int64
	total  int64
	closed bool
}

func newReporter(fn func(Progress), phase string, total int64) *reporter {
	return &reporter{fn: fn, phase: phase, total: total}
}

func (r *reporter) add(n int64) {
	if r == nil || n == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done += n
	if r.fn != nil && !r.closed {
		r.fn(Progress{Phase: r.phase, Done: r.done, Total: r.total})
	}
}

// start reports the total before any bytes come.
func (r *reporter) start(total int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.total = total
	if r.fn != nil && !r.closed {
		r.fn(Progress{Phase: r.phase, Done: r.done, Total: r.total})
	}
}

func (r *reporter) close() {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
}

// checkedImage is an image whose layers are replaced by checked ones;
// mutate.Extract only asks an image for its layers.
type checkedImage struct {
	v1.Image
	layers []v1.Layer
}

func (c *checkedImage) Layers() ([]v1.Layer, error) { return c.layers, nil }

// checkLayers wraps img's layers so that reading them reports progress
// and verifies them: the compressed blob against its digest (when
// compressed is set: the blob's digest and size are known, as from a
// registry or an OCI layout), the uncompressed tar against its diff_id
// (always). A mismatch is an error wrapping ErrDigest. With compressed
// set, progress counts blob bytes; otherwise uncompressed bytes.
func checkLayers(img v1.Image, compressed bool, rep *reporter) (v1.Image, int64, error) {
	layers, err := img.Layers()
	if err != nil {
		return nil, 0, fmt.Errorf("list layers: %w", err)
	}
	var total int64
	out := make([]v1.Layer, len(layers))
	for i, l := range layers {
		if compressed {
			n, err := l.Size()
			if err != nil {
				return nil, 0, fmt.Errorf("layer %d size: %w", i, err)
			}
			total += n
		}
		out[i] = &checkedLayer{Layer: l, compressed: compressed, rep: rep}
	}
	return &checkedImage{Image: img, layers: out}, total, nil
}

type checkedLayer struct {
	v1.Layer
	compressed bool
	rep        *reporter
}

// blobView is the compressed side of a checkedLayer for
// partial.CompressedToLayer, which decompresses what Compressed returns.
type blobView struct {
	l    *checkedLayer
	blob *blobReader // the last one opened
}

func (b *blobView) Digest() (v1.Hash, error) { return b.l.Layer.Digest() }
func (b *blobView) Size() (int64, error)     { return b.l.Layer.Size() }

func (b *blobView) MediaType() (types.MediaType, error) { return b.l.Layer.MediaType() }

func (b *blobView) Compressed() (io.ReadCloser, error) {
	want, err := b.l.Layer.Digest()
	if err != nil {
		return nil, err
	}
	size, err := b.l.Layer.Size()
	if err != nil {
		return nil, err
	}
	h, err := v1.Hasher(want.Algorithm)
	if err != nil {
		return nil, err
	}
	rc, err := b.l.Layer.Compressed()
	if err != nil {
		return nil, err
	}
	b.blob = &blobReader{rc: rc, h: h, want: want, size: size, rep: b.l.rep}
	return b.blob, nil
}

func (l *checkedLayer) Uncompressed() (io.ReadCloser, error) {
	diffID, err := l.Layer.DiffID()
	if err != nil {
		return nil, fmt.Errorf("layer diff_id: %w", err)
	}
	if diffID.Algorithm != "sha256" {
		return nil, fmt.Errorf("layer diff_id %s: unsupported algorithm", diffID)
	}
	d := &diffReader{h: sha256.New(), want: diffID}
	if l.compressed {
		view := &blobView{l: l}
		cl, err := partial.CompressedToLayer(view)
		if err != nil {
			return nil, err
		}
		rc, err := cl.Uncompressed()
		if err != nil {
			if view.blob != nil {
				if derr := view.blob.verdict(); derr != nil {
					return nil, derr
				}
			}
			return nil, err
		}
		d.rc, d.blob = rc, view.blob
	} else {
		rc, err := l.Layer.Uncompressed()
		if err != nil {
			return nil, err
		}
		d.rc, d.rep = rc, l.rep
	}
	return d, nil
}

// blobReader counts and hashes a layer blob as it is read.
type blobReader struct {
	rc   io.ReadCloser
	h    hash.Hash
	want v1.Hash
	size int64
	rep  *reporter

	n   int64
	err error // the first error (io.EOF included) rc returned
	bad error // a digest mismatch, once known
}

func (b *blobReader) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.rc.Read(p)
	b.h.Write(p[:n])
	b.n += int64(n)
	b.rep.add(int64(n))
	if err != nil {
		b.err = err
		// At the end of a blob of the right size, or past its size, the
		// hash says whether the bytes are right. A blob ending early
		// (io.EOF) is wrong too; one cut off by a network error is not
		// known to be.
		switch {
		case b.n >= b.size:
			if got := hex.EncodeToString(b.h.Sum(nil)); got != b.want.Hex {
				b.bad = fmt.Errorf("layer %s: got %s:%s after %d bytes: %w", b.want, b.want.Algorithm, got, b.n, ErrDigest)
			}
		case err == io.EOF:
			b.bad = fmt.Errorf("layer %s: blob ends after %d of %d bytes: %w", b.want, b.n, b.size, ErrDigest)
		}
		if b.bad != nil {
			b.err = b.bad
			return n, b.bad
		}
	}
	return n, err
}

func (b *blobReader) Close() error { return b.rc.Close() }

// verdict is asked when decompressing the blob failed: a corrupted blob
// usually breaks the gzip or zstd stream before its end, where the digest
// is checked. It reads the rest of the blob and returns the digest
// mismatch, if that is what the failure was, or nil.
func (b *blobReader) verdict() error {
	if b.err == nil {
		io.Copy(io.Discard, b)
	}
	return b.bad
}

// diffReader hashes an uncompressed layer and checks it against the
// layer's diff_id at its end.
type diffReader struct {
	rc   io.ReadCloser
	h    hash.Hash
	want v1.Hash
	blob *blobReader // the blob under rc, when the layer is decompressed here
	rep  *reporter   // counts uncompressed bytes when set
}

func (d *diffReader) Read(p []byte) (int, error) {
	n, err := d.rc.Read(p)
	d.h.Write(p[:n])
	d.rep.add(int64(n))
	switch {
	case err == io.EOF:
		if got := hex.EncodeToString(d.h.Sum(nil)); got != d.want.Hex {
			return n, fmt.Errorf("layer with diff_id %s: uncompressed content has sha256:%s: %w", d.want, got, ErrDigest)
		}
	case err != nil && d.blob != nil && !errors.Is(err, ErrDigest):
		if derr := d.blob.verdict(); derr != nil {
			return n, derr
		}
	}
	return n, err
}

func (d *diffReader) Close() error { return d.rc.Close() }
