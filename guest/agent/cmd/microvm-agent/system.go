//go:build linux

package main

import (
	"log"
	"os"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/guest/pid1"
)

// mounts are what a guest needs before running commands, after Basic (and,
// for an image, after the switch into the image's root).
var mounts = []pid1.Mount{
	{Source: "devpts", Target: "/dev/pts", FSType: "devpts", Flags: unix.MS_NOSUID | unix.MS_NOEXEC, Data: "mode=0620,ptmxmode=0666"},
	{Source: "tmpfs", Target: "/dev/shm", FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=1777"},
	{Source: "tmpfs", Target: "/run", FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=0755"},
	// Each container's cgroup lives below (agent.Options.CgroupRoot);
	// a kernel without cgroups logs one line and runs containers without.
	{Source: "cgroup2", Target: cgroupRoot, FSType: "cgroup2", Flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
}

// cgroupRoot is where the agent mounts cgroup v2 in the guest.
const cgroupRoot = "/sys/fs/cgroup"

// haveCgroup2 says whether cgroup v2 is mounted at cgroupRoot.
func haveCgroup2() bool {
	var st unix.Statfs_t
	return unix.Statfs(cgroupRoot, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// initramfsTmp is /tmp for the agent's own initramfs; an image keeps its
// /tmp in its writable layer, as a container does.
var initramfsTmp = pid1.Mount{Source: "tmpfs", Target: "/tmp", FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=1777"}

// setupSystem mounts the file systems, enters the image's root when the
// kernel command line names one (microvm --image), mounts the shared
// directories, and brings up lo.
// Failures are logged, not fatal: an Exec that needs nothing missing still
// works; but an image root that cannot be entered is fatal, since commands
// would run in the wrong file system.
func setupSystem() error {
	pid1.MountAll(pid1.Basic, log.Printf)
	pid1.LoadModules(pid1.ModuleOrder, log.Printf) // a distribution kernel's virtio modules
	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		log.Print(err)
	}
	root, image := pid1.ParseImageRoot(string(cmdline))
	if image {
		if err := root.Enter(); err != nil {
			return err
		}
	}
	if image && root.Device != pid1.RootTmpfs {
		pid1.MountAll(mounts, log.Printf)
		pid1.WriteNetworkFiles(log.Printf) // --net user: the DNS server DHCP named
	} else {
		// The initramfs, or an empty tmpfs root (microvm.root=tmpfs).
		pid1.MountAll(append(mounts, initramfsTmp), log.Printf)
		pid1.LinkResolvConf(log.Printf) // --net user: the DNS server DHCP named
	}
	// microvm --share: each shared directory at /run/microvm-shares/TAG
	// (after /run is mounted, in the image's root when there is one).
	pid1.MountShares(log.Printf)
	// Programs open /dev/ptmx; with devpts mounted, point it at its ptmx.
	if _, err := os.Lstat("/dev/ptmx"); err != nil {
		os.Symlink("pts/ptmx", "/dev/ptmx")
	}
	if err := pid1.LinkUp("lo"); err != nil {
		log.Print(err)
	}
	return nil
}

// powerOff ends the machine (pid1.End: power off with ACPI, else a
// restart, which microvm and QEMU with -no-reboot take as the end). It never
// returns: PID 1 must not exit.
func powerOff() { pid1.End(log.Printf) }
