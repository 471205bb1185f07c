//go:build linux

package main

import (
	"log"
	"os"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/guest/pid1"
)

// mounts are what a guest needs before running commands.
var mounts = append(append([]pid1.Mount(nil), pid1.Basic...), []pid1.Mount{
	{Source: "devpts", Target: "/dev/pts", FSType: "devpts", Flags: unix.MS_NOSUID | unix.MS_NOEXEC, Data: "mode=0620,ptmxmode=0666"},
	{Source: "tmpfs", Target: "/tmp", FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=1777"},
	{Source: "tmpfs", Target: "/run", FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=0755"},
}...)

// setupSystem mounts the file systems and brings up lo. Failures are
// logged, not fatal: an Exec that needs nothing missing still works.
func setupSystem() {
	pid1.MountAll(mounts, log.Printf)
	pid1.LoadModules(pid1.ModuleOrder, log.Printf) // a distribution kernel's virtio modules
	pid1.LinkResolvConf(log.Printf)                // --net user: the DNS server DHCP named
	// Programs open /dev/ptmx; with devpts mounted, point it at its ptmx.
	if _, err := os.Lstat("/dev/ptmx"); err != nil {
		os.Symlink("pts/ptmx", "/dev/ptmx")
	}
	if err := pid1.LinkUp("lo"); err != nil {
		log.Print(err)
	}
}

// powerOff ends the machine (pid1.End: power off with ACPI, else a
// restart, which microvm and QEMU with -no-reboot take as the end). It never
// returns: PID 1 must not exit.
func powerOff() { pid1.End(log.Printf) }
