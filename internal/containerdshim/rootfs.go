package containerdshim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/mount"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/microvm/microvm/internal/image"
)

// RootfsMethod is how a pod's root file systems reach its VM
// (docs/containerd.md compares them).
type RootfsMethod string

const (
	// RootfsExt4 copies: the pod's first container's root into an ext4
	// image that is the VM's root disk, every later container's as a tar
	// stream into guest memory. Writes stay in the guest.
	RootfsExt4 RootfsMethod = "ext4"
	// Rootfs9p shares: each container's root, as containerd's snapshotter
	// mounted it, is bound into the pod's shared directory and the guest
	// reads and writes it over virtio-9p. Nothing is copied, and writes
	// land in the snapshot, as under runc. The VM boots with an empty
	// tmpfs root (microvm.root=tmpfs).
	Rootfs9p RootfsMethod = "9p"
)

// RootfsAnnotation on a pod's sandbox (or a lone container) picks its
// method over Config.Rootfs; CRI passes it from the pod's annotations when
// the runtime's pod_annotations lists it.
const RootfsAnnotation = "io.microvm.shim.rootfs"

// parseRootfsMethod checks a method's name.
func parseRootfsMethod(v string) (RootfsMethod, error) {
	switch m := RootfsMethod(v); m {
	case RootfsExt4, Rootfs9p:
		return m, nil
	}
	return "", fmt.Errorf("root file system method %q: want %q or %q", v, RootfsExt4, Rootfs9p)
}

// podRootfsMethod is the method of the pod whose first container has spec.
func podRootfsMethod(def RootfsMethod, spec *specs.Spec) (RootfsMethod, error) {
	v, ok := spec.Annotations[RootfsAnnotation]
	if !ok {
		return def, nil
	}
	m, err := parseRootfsMethod(v)
	if err != nil {
		return "", fmt.Errorf("%w: annotation %s: %w", errdefs.ErrInvalidArgument, RootfsAnnotation, err)
	}
	return m, nil
}

// rootShareName is the entry, in a container's directory of the pod's
// shared directory, where Rootfs9p binds its root; unbindVolumes undoes it
// with the volumes.
const rootShareName = "root"

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

// share binds the root into the pod's shared directory (Rootfs9p) and
// returns its path in the guest; unbindVolumes(id) undoes it. The bind is
// writable even for a read-only root: the agent creates the mount points
// it needs, then remounts the root read-only, as runc does.
func (r *rootfs) share(pod, id string) (string, error) {
	p, err := bindShared(pod, id, rootShareName, r.src, 0)
	if err != nil {
		return "", fmt.Errorf("rootfs: %w", err)
	}
	return p, nil
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
