//go:build linux

package main

import (
	"fmt"
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
	// Programs open /dev/ptmx; with devpts mounted, point it at its ptmx.
	if _, err := os.Lstat("/dev/ptmx"); err != nil {
		os.Symlink("pts/ptmx", "/dev/ptmx")
	}
	if err := linkUp("lo"); err != nil {
		log.Print(err)
	}
}

// linkUp sets IFF_UP on a network interface (SIOCGIFFLAGS, SIOCSIFFLAGS).
func linkUp(name string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("link %s up: socket: %w", name, err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return fmt.Errorf("link %s up: %w", name, err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("link %s up: get flags: %w", name, err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("link %s up: set flags: %w", name, err)
	}
	return nil
}

// powerOff ends the machine (pid1.End: power off with ACPI, else a
// restart, which microvm and QEMU with -no-reboot take as the end). It never
// returns: PID 1 must not exit.
func powerOff() { pid1.End(log.Printf) }
