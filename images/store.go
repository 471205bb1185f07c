package images

import (
	"context"
	"path/filepath"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/internal/image"
	"github.com/microvm/microvm/internal/vms"
)

// Image is a stored image: its ID (the config digest's hex), names, the
// path of its read-only ext4 (Rootfs) and what its configuration says a
// process runs with (Config: Env, WorkingDir, User resolved to UID and
// GID, Entrypoint, Cmd).
type Image = image.Image

// Config is an image's process configuration.
type Config = image.Config

// Store is a store of images, shared with the CLI when it is the default
// one.
type Store struct{ s *image.Store }

// Open opens (creating) the store in dir, or the CLI's (the state
// directory's images/, as named.StateDir tells) when dir is "".
func Open(dir string) (*Store, error) {
	if dir == "" {
		state := vms.StateDir()
		if err := vms.CheckStateDir(state); err != nil {
			return nil, err
		}
		dir = filepath.Join(state, "images")
	}
	s, err := image.Open(dir)
	if err != nil {
		return nil, err
	}
	return &Store{s: s}, nil
}

// Options tune one pull or import (the With methods): the platform, a
// progress callback, registry credentials, a warnings log, and the limits
// on what an image may unpack to (0: the store's default; negative: none;
// an image past one is refused with a *image.LimitError, nothing kept).
// The zero value is the plain methods' choice.
type Options = image.Options

// Progress is one report to Options.Progress: the phase (downloading,
// reading layers, converting) and its bytes done of a total, 0 when
// unknown.
type Progress = image.Progress

// Pull fetches ref from its registry (credentials from docker's config;
// platform "" is linux/amd64) and stores it, unless it is stored already.
func (s *Store) Pull(ctx context.Context, ref, platform string) (*Image, error) {
	return s.PullWith(ctx, ref, Options{Platform: platform})
}

// PullWith is Pull with the choices in o.
func (s *Store) PullWith(ctx context.Context, ref string, o Options) (*Image, error) {
	return s.s.Pull(ctx, ref, o)
}

// Import stores an image from a docker save tarball, an OCI archive or an
// OCI layout directory; name "" takes the name the archive gives.
func (s *Store) Import(ctx context.Context, path, name string) (*Image, error) {
	return s.ImportWith(ctx, path, name, Options{})
}

// ImportWith is Import with the choices in o.
func (s *Store) ImportWith(ctx context.Context, path, name string, o Options) (*Image, error) {
	return s.s.Import(ctx, path, name, o)
}

// ImportRootfs stores a root file system tarball as the one-layer image
// name, with cfg as its configuration (docker import).
func (s *Store) ImportRootfs(ctx context.Context, path, name string, cfg Config) (*Image, error) {
	return s.ImportRootfsWith(ctx, path, name, cfg, Options{})
}

// ImportRootfsWith is ImportRootfs with the choices in o.
func (s *Store) ImportRootfsWith(ctx context.Context, path, name string, cfg Config, o Options) (*Image, error) {
	return s.s.ImportRootfs(ctx, path, name, cfg, o)
}

// Get finds a stored image by name or ID prefix; errors.Is(err,
// ErrNotFound) when there is none.
func (s *Store) Get(ref string) (*Image, error) { return s.s.Get(ref) }

// List lists the stored images.
func (s *Store) List() ([]Image, error) { return s.s.List() }

// Remove drops a name, and the image with its last name.
func (s *Store) Remove(ref string) error { return s.s.Remove(ref) }

// ErrNotFound: no stored image (or no image in the registry) has the name
// asked for.
var ErrNotFound = image.ErrNotFound

// Use makes img the root file system of the machine cfg configures: its
// ext4 becomes the first disk, read-only (every machine of the image
// shares the file), and the kernel command line names it, so that
// microvm's agent as /init (the initramfs guest/agentimage writes, with no
// busybox needed) mounts it under an overlayfs whose writable layer is a
// tmpfs of overlayBytes (0: half of guest RAM) and runs commands there.
// Call it before microvm.New; the agent then runs the image's commands as
// its Config says.
func Use(cfg *microvm.Config, img *Image, overlayBytes uint64) {
	cfg.UseRootfs(img.Rootfs, overlayBytes)
}
