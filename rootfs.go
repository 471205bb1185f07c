package microvm

import (
	"fmt"
	"strings"
)

// UseRootfs makes ext4, a file of an ext4 file system, the machine's root
// file system: it becomes the first disk, read-only, and the kernel command
// line names it, so that microvm's agent as /init (the initramfs
// guest/agentimage writes) mounts it under an overlayfs whose writable
// layer is a tmpfs of overlayBytes (0: half of guest RAM). Call it before
// New. images.Use does this for a stored image; the containerd shim builds
// the file from a container's snapshot.
func (c *Config) UseRootfs(ext4 string, overlayBytes uint64) {
	c.Disks = append([]DiskConfig{{Path: ext4, ReadOnly: true}}, c.Disks...)
	c.Cmdline = strings.TrimSpace(c.Cmdline + " microvm.root=/dev/vda")
	if overlayBytes > 0 {
		c.Cmdline += fmt.Sprintf(" microvm.rootsize=%dk", overlayBytes>>10)
	}
}
