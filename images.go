//go:build !microvm_lean

package microvm

// The Go API of images: OCI and Docker images as read-only ext4 root file
// systems (internal/image, docs/images.md), kept under StateDir()/images
// as `microvm image` keeps them, and Config.UseImage to boot one. Left out
// of the lean build of the CLI, which boots no images itself.

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/microvm/microvm/internal/image"
	"github.com/microvm/microvm/internal/vms"
)

// Image is a stored image: its ID (the config digest's hex), names, the
// path of its read-only ext4 (Rootfs) and what its configuration says a
// process runs with (Config: Env, WorkingDir, User resolved to UID and
// GID, Entrypoint, Cmd).
type Image = image.Image

// ImageConfig is an image's process configuration.
type ImageConfig = image.Config

// ImageStore is a store of images, shared with the CLI when it is the
// default one.
type ImageStore struct{ s *image.Store }

// OpenImageStore opens (creating) the store in dir, or the CLI's
// (StateDir()/images) when dir is "".
func OpenImageStore(dir string) (*ImageStore, error) {
	if dir == "" {
		state := StateDir()
		if err := vms.CheckStateDir(state); err != nil {
			return nil, err
		}
		dir = filepath.Join(state, "images")
	}
	s, err := image.Open(dir)
	if err != nil {
		return nil, err
	}
	return &ImageStore{s: s}, nil
}

// Pull fetches ref from its registry (credentials from docker's config;
// platform "" is linux/amd64) and stores it, unless it is stored already.
func (s *ImageStore) Pull(ctx context.Context, ref, platform string) (*Image, error) {
	return s.s.Pull(ctx, ref, image.Options{Platform: platform})
}

// Import stores an image from a docker save tarball, an OCI archive or an
// OCI layout directory; name "" takes the name the archive gives.
func (s *ImageStore) Import(ctx context.Context, path, name string) (*Image, error) {
	return s.s.Import(ctx, path, name, image.Options{})
}

// ImportRootfs stores a root file system tarball as the one-layer image
// name, with cfg as its configuration (docker import).
func (s *ImageStore) ImportRootfs(ctx context.Context, path, name string, cfg ImageConfig) (*Image, error) {
	return s.s.ImportRootfs(ctx, path, name, cfg, image.Options{})
}

// Get finds a stored image by name or ID prefix; errors.Is(err,
// ErrImageNotFound) when there is none.
func (s *ImageStore) Get(ref string) (*Image, error) { return s.s.Get(ref) }

// List lists the stored images.
func (s *ImageStore) List() ([]Image, error) { return s.s.List() }

// Remove drops a name, and the image with its last name.
func (s *ImageStore) Remove(ref string) error { return s.s.Remove(ref) }

// ErrImageNotFound: no stored image (or no image in the registry) has the
// name asked for.
var ErrImageNotFound = image.ErrNotFound

// UseImage makes img the machine's root file system: its ext4 becomes the
// first disk, read-only (every machine of the image shares the file), and
// the kernel command line names it, so that microvm's agent as /init (the
// initramfs guest/agentimage writes, with no busybox needed) mounts it
// under an overlayfs whose writable layer is a tmpfs of overlayBytes (0:
// half of guest RAM) and runs commands there. Call it before New; the
// agent then runs the image's commands as Config says (ImageConfig).
func (c *Config) UseImage(img *Image, overlayBytes uint64) {
	c.UseRootfs(img.Rootfs, overlayBytes)
}

// UseRootfs is UseImage for an ext4 file that is not in an image store
// (the containerd shim builds one from a container's snapshot).
func (c *Config) UseRootfs(ext4 string, overlayBytes uint64) {
	c.Disks = append([]DiskConfig{{Path: ext4, ReadOnly: true}}, c.Disks...)
	c.Cmdline = strings.TrimSpace(c.Cmdline + " microvm.root=/dev/vda")
	if overlayBytes > 0 {
		c.Cmdline += fmt.Sprintf(" microvm.rootsize=%dk", overlayBytes>>10)
	}
}
