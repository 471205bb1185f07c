//go:build linux

// Package ifconf sets an IPv4 address on a network interface and brings it
// up with the classic SIOCSIF* ioctls, and makes persistent TAP devices: what
// the I/O benchmark needs on both sides of its link (the host in its network
// namespace, and the guest's /init, which has no ip(8)) without netlink.
package ifconf

import (
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// Up gives interface name the address addr (with its prefix length as the
// netmask) and sets it up.
func Up(name string, addr netip.Prefix) error {
	if !addr.Addr().Is4() {
		return fmt.Errorf("ifconf: %s: %v is not IPv4", name, addr)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("ifconf: socket: %w", err)
	}
	defer unix.Close(fd)
	set := func(what string, req uint, ip netip.Addr) error {
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			return fmt.Errorf("ifconf: %s: %w", name, err)
		}
		if err := ifr.SetInet4Addr(ip.AsSlice()); err != nil {
			return fmt.Errorf("ifconf: %s %s: %w", name, what, err)
		}
		if err := unix.IoctlIfreq(fd, req, ifr); err != nil {
			return fmt.Errorf("ifconf: %s: set %s %v: %w", name, what, ip, err)
		}
		return nil
	}
	if err := set("address", unix.SIOCSIFADDR, addr.Addr()); err != nil {
		return err
	}
	if err := set("netmask", unix.SIOCSIFNETMASK, Netmask(addr.Bits())); err != nil {
		return err
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return fmt.Errorf("ifconf: %s: %w", name, err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("ifconf: %s: get flags: %w", name, err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("ifconf: %s: set up: %w", name, err)
	}
	return nil
}

// Netmask is the IPv4 netmask of a prefix of bits bits (0 to 32).
func Netmask(bits int) netip.Addr {
	bits = min(max(bits, 0), 32)
	m := ^uint32(0) << (32 - bits)
	if bits == 0 {
		m = 0
	}
	return netip.AddrFrom4([4]byte{byte(m >> 24), byte(m >> 16), byte(m >> 8), byte(m)})
}

// PersistentTAP creates TAP device name (no packet information header),
// marked persistent so that it outlives this call and any VMM that attaches
// to it afterwards; it goes with its network namespace. A TAP of that name
// that already exists is reused.
func PersistentTAP(name string) error {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("ifconf: open /dev/net/tun: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return fmt.Errorf("ifconf: %s: %w", name, err)
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		return fmt.Errorf("ifconf: create TAP %s: %w", name, err)
	}
	if err := unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 1); err != nil {
		return fmt.Errorf("ifconf: make TAP %s persistent: %w", name, err)
	}
	return nil
}
