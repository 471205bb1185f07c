//go:build linux

package pid1

import (
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// SharesDir is where MountShares mounts each shared directory (microvm
// --share tag=T: SharesDir/T).
const SharesDir = "/run/microvm-shares"

// ShareOptions are the 9p mount options: 9P2000.L over virtio, messages up
// to the device's bound (devices/virtio9p.MaxMessage), and no cache but
// what shared writable mmap needs (cache=mmap): the host may change the
// files at any time.
const ShareOptions = "trans=virtio,version=9p2000.L,msize=262144,cache=mmap"

// shareTags lists the tags of the virtio-9p devices the kernel bound.
func shareTags() []string {
	paths, _ := filepath.Glob("/sys/bus/virtio/drivers/9pnet_virtio/virtio*/mount_tag")
	var tags []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if t := strings.TrimRight(string(b), "\x00\n"); t != "" && !strings.ContainsAny(t, "/") {
			tags = append(tags, t)
		}
	}
	return tags
}

// MountShares mounts each shared directory at SharesDir/TAG and returns
// the tags mounted. Failures go to logf.
func MountShares(logf func(format string, args ...any)) []string {
	var done []string
	for _, tag := range shareTags() {
		dir := filepath.Join(SharesDir, tag)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			logf("mkdir %s: %v", dir, err)
			continue
		}
		if err := unix.Mount(tag, dir, "9p", unix.MS_NODEV, ShareOptions); err != nil {
			logf("mount share %s on %s: %v", tag, dir, err)
			continue
		}
		done = append(done, tag)
	}
	return done
}
