package image

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// Pull fetches ref from its registry (credentials from o.Keychain), picks
// o.Platform from a multi-platform index, converts the image and stores it
// under ref's normalized name. An image whose ID is stored already only
// gains the name: its layers are not downloaded. Cancelling ctx stops the
// download; nothing of an interrupted pull stays visible.
func (s *Store) Pull(ctx context.Context, ref string, o Options) (*Image, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("pull %q: %w", ref, err)
	}
	want, err := parsePlatform(o.Platform)
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", r.Name(), err)
	}
	opts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(o.keychain()),
		remote.WithPlatform(want),
		remote.WithUserAgent("microvm"),
	}
	desc, err := remote.Get(r, opts...)
	if err != nil {
		return nil, registryError(r, err)
	}
	img, err := descriptorImage(desc, want)
	if err != nil {
		return nil, registryError(r, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return nil, registryError(r, err)
	}
	src := source{img: img, compressed: true, phase: PhaseDownload, digest: digest.String(), platform: want}
	im, err := s.add(ctx, src, []string{r.Name()}, nil, &o)
	if err != nil {
		return nil, registryError(r, err)
	}
	return im, nil
}

// descriptorImage is the image a registry descriptor names: itself, or
// for an index the child for want.
func descriptorImage(desc *remote.Descriptor, want v1.Platform) (v1.Image, error) {
	switch {
	case desc.MediaType.IsIndex():
		idx, err := desc.ImageIndex()
		if err != nil {
			return nil, err
		}
		return indexImage(idx, want)
	case desc.MediaType.IsImage():
		return desc.Image()
	}
	return nil, fmt.Errorf("%s is not an image (media type %s)", desc.Digest, desc.MediaType)
}

// indexImage picks want's image from a multi-platform index. Without one
// the error lists the platforms the index has.
func indexImage(idx v1.ImageIndex, want v1.Platform) (v1.Image, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var have []string
	for _, d := range im.Manifests {
		if !d.MediaType.IsImage() {
			continue
		}
		if d.Platform == nil {
			if len(im.Manifests) == 1 {
				return idx.Image(d.Digest) // the only one; its config says
			}
			continue
		}
		if d.Platform.OS == "unknown" {
			continue // attestations and the like
		}
		if matches(*d.Platform, want) {
			return idx.Image(d.Digest)
		}
		have = append(have, platformString(*d.Platform))
	}
	if len(have) == 0 {
		return nil, fmt.Errorf("no %s image in the index (it lists no platforms)", platformString(want))
	}
	return nil, fmt.Errorf("no %s image in the index; it has %s", platformString(want), strings.Join(have, ", "))
}

// registryError says what a failed pull means: errors.Is tells ErrAuth
// (the registry wants credentials, or refused them) and ErrNotFound.
func registryError(r name.Reference, err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		if te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden ||
			hasCode(te, transport.UnauthorizedErrorCode, transport.DeniedErrorCode) {
			login := "docker login"
			if reg := r.Context().RegistryStr(); reg != name.DefaultRegistry {
				login += " " + reg
			}
			return fmt.Errorf("pull %s: %w (or the repository does not exist): "+authHint+": %w",
				r.Name(), ErrAuth, login, err)
		}
		if te.StatusCode == http.StatusNotFound ||
			hasCode(te, transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode) {
			return fmt.Errorf("pull %s: %w in the registry: %w", r.Name(), ErrNotFound, err)
		}
	}
	return fmt.Errorf("pull %s: %w", r.Name(), err)
}

func hasCode(te *transport.Error, codes ...transport.ErrorCode) bool {
	for _, d := range te.Errors {
		for _, c := range codes {
			if d.Code == c {
				return true
			}
		}
	}
	return false
}
