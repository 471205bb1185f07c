//go:build linux

package pid1

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Kernel command-line parameters that ask PID 1 to run in an image root
// (ImageRoot); microvm's --image adds them.
const (
	paramRoot     = "microvm.root="     // the block device holding the image's ext4, e.g. /dev/vda; or RootTmpfs
	paramRootSize = "microvm.rootsize=" // the tmpfs size= of the writable layer, e.g. 512m; absent: half of RAM
)

// RootTmpfs as microvm.root= asks for an empty tmpfs as the root, with no
// image under it: a machine whose containers' roots all come from shared
// directories (the containerd shim's 9p root file systems) still needs a
// root that is a mount (pivot_root refuses the initramfs).
const RootTmpfs = "tmpfs"

// ImageRoot is an OCI image as the root file system: the image's ext4,
// shared read-only by every VM that runs it, under an overlayfs whose
// writable layer is a private tmpfs. Writes never reach the image, and
// starting a VM does not read the image beyond what it runs. With Device
// RootTmpfs the root is the tmpfs alone.
type ImageRoot struct {
	Device    string // the read-only ext4 (microvm.root=), or RootTmpfs
	TmpfsSize string // the writable layer's size= (microvm.rootsize=); "" is tmpfs's default
}

// ParseImageRoot reads microvm.root= and microvm.rootsize= from a kernel
// command line (the contents of /proc/cmdline); ok is false when there is
// no microvm.root=.
func ParseImageRoot(cmdline string) (r ImageRoot, ok bool) {
	for _, f := range strings.Fields(cmdline) {
		switch {
		case strings.HasPrefix(f, paramRoot):
			r.Device, ok = f[len(paramRoot):], true
		case strings.HasPrefix(f, paramRootSize):
			r.TmpfsSize = f[len(paramRootSize):]
		}
	}
	return r, ok && r.Device != ""
}

// Where ImageRoot mounts its parts in the initramfs before the switch.
const (
	imageBase  = "/.microvm"
	imageLower = imageBase + "/lower" // the image, read-only
	imageRW    = imageBase + "/rw"    // the tmpfs: upper and work
	imageNew   = imageBase + "/root"  // the overlay, the next root
)

// movedMounts are the initramfs's kernel file systems (Basic, already
// mounted) that move into the new root with what is mounted below them.
var movedMounts = []string{"/proc", "/sys", "/dev"}

// Enter mounts the image read-only, a tmpfs and the overlay of the two,
// moves /proc, /sys and /dev into it and makes it the root of this process
// (the MS_MOVE and chroot of switch_root(8)); PID 1's children inherit it.
// The initramfs stays in memory below (the running PID 1 is one of its
// files). Basic must be mounted first.
func (r ImageRoot) Enter() error {
	if err := os.MkdirAll(imageBase, 0o700); err != nil {
		return fmt.Errorf("image root: %w", err)
	}
	for _, d := range []string{imageLower, imageRW, imageNew} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("image root: %w", err)
		}
	}
	data := "mode=0755"
	if r.TmpfsSize != "" {
		data += ",size=" + r.TmpfsSize
	}
	if r.Device == RootTmpfs {
		if err := unix.Mount("tmpfs", imageNew, "tmpfs", unix.MS_NODEV, data); err != nil {
			return fmt.Errorf("image root: mount tmpfs (%s): %w", data, err)
		}
		return switchRoot()
	}
	if err := unix.Mount(r.Device, imageLower, "ext4", unix.MS_RDONLY|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("image root: mount %s read-only on %s: %w", r.Device, imageLower, err)
	}
	if err := unix.Mount("tmpfs", imageRW, "tmpfs", unix.MS_NODEV, data); err != nil {
		return fmt.Errorf("image root: writable layer: mount tmpfs (%s): %w", data, err)
	}
	upper, work := imageRW+"/upper", imageRW+"/work"
	for _, d := range []string{upper, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("image root: %w", err)
		}
	}
	// The image's own root directory mode and owner show through the
	// overlay's root, which takes upper's: copy them.
	var st unix.Stat_t
	if err := unix.Stat(imageLower, &st); err == nil {
		_ = unix.Chmod(upper, st.Mode&0o7777)
		_ = unix.Chown(upper, int(st.Uid), int(st.Gid))
	}
	opts := "lowerdir=" + imageLower + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("overlay", imageNew, "overlay", 0, opts); err != nil {
		return fmt.Errorf("image root: mount overlay (%s): %w", opts, err)
	}
	return switchRoot()
}

// switchRoot moves /proc, /sys and /dev into imageNew, mounted, and makes
// it the root of this process.
func switchRoot() error {
	for _, m := range movedMounts {
		dst := imageNew + m
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return fmt.Errorf("image root: %w", err)
		}
		if err := unix.Mount(m, dst, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("image root: move %s: %w", m, err)
		}
	}
	if err := unix.Chdir(imageNew); err != nil {
		return fmt.Errorf("image root: %w", err)
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("image root: move the overlay to /: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("image root: chroot: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("image root: %w", err)
	}
	return nil
}

// WriteNetworkFiles gives an image root what a container runtime writes
// for a container: /etc/resolv.conf naming the DNS servers the kernel
// learnt by DHCP (when it learnt any; an image's own file, or a link into a
// resolver the VM does not run, is replaced in the writable layer), and an
// /etc/hosts naming localhost when the image has none. /proc must be
// mounted.
func WriteNetworkFiles(logf func(format string, args ...any)) {
	writeNetworkFiles(PNP, "/etc", logf)
}

func writeNetworkFiles(pnp, etc string, logf func(format string, args ...any)) {
	if err := os.MkdirAll(etc, 0o755); err != nil {
		logf("%s: %v", etc, err)
		return
	}
	if b, err := os.ReadFile(pnp); err == nil && strings.Contains(string(b), "nameserver") {
		resolv := filepath.Join(etc, "resolv.conf")
		if err := os.Remove(resolv); err != nil && !errors.Is(err, os.ErrNotExist) {
			logf("resolv.conf: %v", err)
		} else if err := os.WriteFile(resolv, b, 0o644); err != nil {
			logf("resolv.conf: %v", err)
		}
	}
	hosts := filepath.Join(etc, "hosts")
	if _, err := os.Lstat(hosts); errors.Is(err, os.ErrNotExist) {
		if err := os.WriteFile(hosts, []byte("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"), 0o644); err != nil {
			logf("hosts: %v", err)
		}
	}
}
