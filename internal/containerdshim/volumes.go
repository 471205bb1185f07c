package containerdshim

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"

	"github.com/containerd/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/guest/pid1"
)

// Volumes that write back. Each pod's VM gets one shared directory at boot,
// the host directory volumesRoot/SANDBOX served over virtio-9p under the
// tag volumesTag (microvm.ShareConfig); the agent mounts it at
// pid1.SharesDir/volumesTag. A container's directory volumes are bind
// mounts, made on the host at Create, at volumesRoot/SANDBOX/CONTAINER/I
// (I: the mount's index in the spec), so the guest reads and writes the
// host directories themselves: two containers of a pod sharing an emptyDir
// see each other's files, and what they write stays on the host. The
// directory lies outside every bundle, so containerd's removal of a bundle
// never walks into a volume; the shim only ever unmounts and rmdirs there.
const volumesTag = "microvm-volumes"

// volumesRoot is the host directory of every pod's shared directory (a
// variable for tests).
var volumesRoot = "/run/microvm-shim"

// shareDir is the host directory shared with the VM of the pod sandbox.
func shareDir(sandbox string) string { return filepath.Join(volumesRoot, sandbox) }

// makeShareDir creates the sandbox's shared directory before its VM boots.
func makeShareDir(sandbox string) (string, error) {
	dir := shareDir(sandbox)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("volumes: %w", err)
	}
	return dir, nil
}

// sharedVolume says whether a bind mount goes through the shared directory:
// directories do; files (CRI's /etc/hosts, /etc/resolv.conf, /etc/hostname)
// are copied in (copyBinds), and so is /dev/shm, which must stay memory
// the pod's processes can map shared.
func sharedVolume(m specs.Mount) bool {
	if !isBind(m) || m.Destination == "/dev/shm" {
		return false
	}
	fi, err := os.Stat(m.Source)
	return err == nil && fi.IsDir()
}

// bindVolumes binds each directory volume of s below the sandbox's shared
// directory, read-only where the mount asks, and returns the guest path of
// each by the mount's index. On error what it bound is undone.
func bindVolumes(sandbox, id string, s *specs.Spec) (_ map[int]string, err error) {
	paths := map[int]string{}
	defer func() {
		if err != nil {
			_ = unbindVolumes(id)
		}
	}()
	for i, m := range s.Mounts {
		if !sharedVolume(m) {
			continue
		}
		p, err := bindShared(sandbox, id, strconv.Itoa(i), m.Source, unix.MS_REC)
		switch {
		case errors.Is(err, errBind): // the volume's source cannot be bound
			return nil, fmt.Errorf("%w: mount %s: %w", errdefs.ErrInvalidArgument, m.Destination, err)
		case err != nil:
			return nil, fmt.Errorf("volumes: %w", err)
		}
		if hasOption(m.Options, "ro") {
			dst := filepath.Join(shareDir(sandbox), id, strconv.Itoa(i))
			if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
				return nil, fmt.Errorf("mount %s: read-only: %w", m.Destination, err)
			}
		}
		paths[i] = p
	}
	return paths, nil
}

// errBind marks bindShared's failure to bind src itself (as opposed to
// making the mount point).
var errBind = errors.New("bind")

// bindShared binds the host path src at SANDBOX/ID/NAME in the sandbox's
// shared directory (a bind, with MS_REC in flags for a recursive one) and
// returns where the guest sees it. unbindVolumes(id) undoes it, whatever
// the name: the caller calls it when a later step fails.
func bindShared(sandbox, id, name, src string, flags uintptr) (string, error) {
	host := filepath.Join(shareDir(sandbox), id)
	if err := os.MkdirAll(host, 0o700); err != nil {
		return "", err
	}
	dst := filepath.Join(host, name)
	if err := os.Mkdir(dst, 0o700); err != nil {
		return "", err
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND|flags, ""); err != nil {
		return "", fmt.Errorf("%w %s: %w", errBind, src, err)
	}
	return path.Join(pid1.SharesDir, volumesTag, id, name), nil
}

// unbindVolumes undoes bindVolumes for container id, whichever pod it was
// in (the delete action after a killed shim knows only the id): it
// unmounts each bind and removes the empty mount points. It never removes
// anything a volume holds.
func unbindVolumes(id string) error {
	dirs, _ := filepath.Glob(filepath.Join(volumesRoot, "*", id))
	var errs []error
	for _, dir := range dirs {
		points, _ := filepath.Glob(filepath.Join(dir, "*"))
		for _, p := range points {
			if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
				errs = append(errs, fmt.Errorf("volumes: unmount %s: %w", p, err))
				continue
			}
			if err := unix.Rmdir(p); err != nil {
				errs = append(errs, fmt.Errorf("volumes: %s: %w", p, err))
			}
		}
		if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("volumes: %s: %w", dir, err))
		}
	}
	return errors.Join(errs...)
}

// removeShareDir removes the sandbox's shared directory once its VM is
// gone, unbinding what containers left there.
func removeShareDir(sandbox string) error {
	dir := shareDir(sandbox)
	ids, _ := filepath.Glob(filepath.Join(dir, "*"))
	var errs []error
	for _, d := range ids {
		errs = append(errs, unbindVolumes(filepath.Base(d)))
	}
	if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("volumes: %s: %w", dir, err))
	}
	return errors.Join(errs...)
}
