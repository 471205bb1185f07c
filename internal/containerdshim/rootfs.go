package containerdshim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/mount"

	"github.com/microvm/microvm/internal/image"
)

// rootfsImage is the file, in the bundle, that holds a container's root
// file system as ext4 for the VM's first disk.
const rootfsImage = "microvm-rootfs.ext4"

// rootfs is a container's root file system on its way into the guest:
// containerd's snapshot mounted at BUNDLE/rootfs (when it is more than
// one directory), then either copied into BUNDLE/microvm-rootfs.ext4 (the
// VM's first container: the guest runs it as its root under an overlay
// whose writable layer is a tmpfs, microvm.Config.UseRootfs) or streamed
// into the running guest as a tar archive (every later container of the
// pod). Either way the snapshot itself is only read.
type rootfs struct {
	bundle  string
	src     string // the directory that holds the root
	mounted bool   // BUNDLE/rootfs holds containerd's mounts
	ext4    string // the image, once written
}

// mountRootfs mounts ms (the snapshotter's mounts) unless the root is one
// directory already. On error nothing is left mounted.
func mountRootfs(bundle string, ms []*types.Mount) (*rootfs, error) {
	r := &rootfs{bundle: bundle}
	switch {
	case len(ms) == 0:
		// The bundle's rootfs directory is the root (ctr run --rootfs).
		r.src = filepath.Join(bundle, "rootfs")
	case len(ms) == 1 && ms[0].Type == "bind":
		// The native snapshotter: a directory, read in place.
		r.src = ms[0].Source
	default:
		r.src = filepath.Join(bundle, "rootfs")
		if err := os.MkdirAll(r.src, 0o711); err != nil {
			return nil, fmt.Errorf("rootfs: %w", err)
		}
		list := make([]mount.Mount, len(ms))
		for i, m := range ms {
			list[i] = mount.Mount{Type: m.Type, Source: m.Source, Target: m.Target, Options: m.Options}
		}
		if err := mount.All(list, r.src); err != nil {
			return nil, fmt.Errorf("rootfs: mount the snapshot: %w", err)
		}
		r.mounted = true
	}
	return r, nil
}

// writeExt4 copies the root into BUNDLE/microvm-rootfs.ext4.
func (r *rootfs) writeExt4(ctx context.Context) error {
	size, err := image.DirExt4Size(r.src)
	if err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	out := filepath.Join(r.bundle, rootfsImage)
	if err := image.WriteDirExt4(ctx, out, r.src, size, "rootfs"); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	r.ext4 = out
	return nil
}

// cleanup unmounts the snapshot and removes the ext4; it can run again.
func (r *rootfs) cleanup() error {
	return cleanupBundle(r.bundle, r.mounted)
}

// cleanupBundle undoes prepareRootfs in bundle; the shim's delete action
// (after the shim died) calls it with mounted true, since it cannot know.
func cleanupBundle(bundle string, mounted bool) error {
	var errs []error
	if mounted {
		if err := mount.UnmountAll(filepath.Join(bundle, "rootfs"), 0); err != nil {
			errs = append(errs, fmt.Errorf("rootfs: unmount: %w", err))
		}
	}
	for _, f := range []string{rootfsImage, rootfsImage + ".tmp"} {
		if err := os.Remove(filepath.Join(bundle, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("rootfs: %w", err))
		}
	}
	return errors.Join(errs...)
}
