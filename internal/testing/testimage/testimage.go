// Package testimage builds small OCI images in memory for tests: layers
// from tar entries, and an image of layers with a given configuration.
// The image tests, the exec --image tests and the containerd shim's tests
// share it. WriteDockerContext (dockerctx.go) writes the small Docker
// project that the Docker test and make bench-docker build in a VM.
package testimage

import (
	"archive/tar"
	"bytes"
	"io"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Entry is one tar entry of a layer; Size is set from Body, and a zero
// ModTime becomes a fixed time.
type Entry struct {
	Hdr  tar.Header
	Body []byte
}

// Layer is an uncompressed layer holding entries.
func Layer(tb testing.TB, entries []Entry) v1.Layer {
	tb.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.Hdr
		h.Size = int64(len(e.Body))
		if h.ModTime.IsZero() {
			h.ModTime = time.Unix(1700000000, 0)
		}
		if err := tw.WriteHeader(&h); err != nil {
			tb.Fatal(err)
		}
		if _, err := tw.Write(e.Body); err != nil {
			tb.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		tb.Fatal(err)
	}
	return FromTar(tb, buf.Bytes())
}

// FromTar is an uncompressed layer of the tar archive b.
func FromTar(tb testing.TB, b []byte) v1.Layer {
	tb.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

// Of is a linux/arch image of layers, in order, with configuration cfg.
func Of(tb testing.TB, cfg v1.Config, arch string, layers ...v1.Layer) v1.Image {
	tb.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		tb.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		tb.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.Config = cfg
	cf.OS, cf.Architecture = "linux", arch
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		tb.Fatal(err)
	}
	return img
}
