package images

import (
	"context"
	"errors"
)

// Puller pulls the image ref into a store when Find does not have it:
// Store.PullWith with the caller's options, typically, with whatever the
// caller does around it (a progress line, its own error context).
type Puller func(ctx context.Context, ref string) (*Image, error)

// Find is the image ref names as docker run finds it: the stored one,
// else, only when there is none (ErrNotFound), what pull returns for ref.
// Any other error of the store is returned as it is, and pull is not
// called.
func (s *Store) Find(ctx context.Context, ref string, pull Puller) (*Image, error) {
	img, err := s.Get(ref)
	if err == nil {
		return img, nil
	}
	if !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	return pull(ctx, ref)
}
