//go:build linux

package main

import (
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// mounts are what a guest needs before running commands. The kernel does
// not mount devtmpfs for an initramfs root, so PID 1 does.
var mounts = []struct {
	source, target, fstype string
	flags                  uintptr
	data                   string
}{
	{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
	{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
	{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"},
	{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "mode=0620,ptmxmode=0666"},
	{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
	{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755"},
}

// setupSystem mounts the file systems and brings up lo. Failures are
// logged, not fatal: an Exec that needs nothing missing still works.
func setupSystem() {
	for _, m := range mounts {
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			log.Printf("mkdir %s: %v", m.target, err)
		}
		err := unix.Mount(m.source, m.target, m.fstype, m.flags, m.data)
		if err != nil && !errors.Is(err, unix.EBUSY) {
			log.Printf("mount %s on %s: %v", m.fstype, m.target, err)
		}
	}
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

// powerOff syncs and powers the machine off, restarting it if power off
// fails (with reboot=k microvm exits either way). It never returns: PID 1
// must not exit.
func powerOff() {
	unix.Sync()
	err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	log.Printf("power off: %v; restarting", err)
	err = unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	log.Printf("restart: %v; halting here", err)
	for {
		time.Sleep(time.Hour)
	}
}
