package virtionet

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// TUNSETOFFLOAD flags (linux/if_tun.h): what the reader of the TAP, the
// guest here, accepts in frames it receives.
const (
	tunFCsum = 0x01 // TUN_F_CSUM
	tunFTSO4 = 0x02 // TUN_F_TSO4
	tunFTSO6 = 0x04 // TUN_F_TSO6
	tunFUFO  = 0x10 // TUN_F_UFO
)

// backend is the host side of the device: a packet descriptor where one
// read returns one frame and one write sends one (a TAP opened with
// IFF_VNET_HDR; a SOCK_DGRAM socket of plain frames, socket.go; in tests a
// socketpair), plus the TAP's offload switch.
type backend interface {
	// FD is the non-blocking packet descriptor.
	FD() int
	// VnetHeader reports whether every frame on FD carries the
	// HeaderSize-byte virtio-net header (a TAP), so the kernel on the
	// other side does the offloads; without it frames are plain and
	// the device offers no offload.
	VnetHeader() bool
	// SetOffload tells the TAP which TUN_F_ flags the guest accepts.
	SetOffload(flags uint) error
	// Close closes the descriptor.
	Close() error
}

// packetFD is a back-end's descriptor: FD, and a Close that closes it
// once.
type packetFD struct{ fd int }

// FD is the non-blocking descriptor.
func (p *packetFD) FD() int { return p.fd }

// Close closes the descriptor; later calls do nothing.
func (p *packetFD) Close() error {
	if p.fd < 0 {
		return nil
	}
	err := unix.Close(p.fd)
	p.fd = -1
	return err
}

// TAP is an open TAP device with virtio-net headers (IFF_VNET_HDR). Its
// Close closes the descriptor: a TAP that is not persistent goes away.
type TAP struct {
	packetFD
	name string
}

// OpenTAP attaches to the TAP interface name, creating it when it does not
// exist and the caller has CAP_NET_ADMIN (TUNSETIFF does both). The
// descriptor is non-blocking and carries a HeaderSize-byte virtio-net
// header before every frame.
func OpenTAP(name string) (*TAP, error) {
	if name == "" || len(name) >= unix.IFNAMSIZ {
		return nil, fmt.Errorf("virtio-net: TAP name %q: want 1..%d bytes", name, unix.IFNAMSIZ-1)
	}
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("virtio-net: open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("virtio-net: TAP %s: %w", name, err)
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("virtio-net: attach to TAP %s (TUNSETIFF): %w", name, err)
	}
	if err := unix.IoctlSetPointerInt(fd, unix.TUNSETVNETHDRSZ, HeaderSize); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("virtio-net: TAP %s: TUNSETVNETHDRSZ: %w", name, err)
	}
	t := &TAP{packetFD: packetFD{fd}, name: ifr.Name()}
	// Until the guest negotiates offloads it takes plain frames only.
	if err := t.SetOffload(0); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// Name is the interface name.
func (t *TAP) Name() string { return t.name }

// VnetHeader is true: the TAP was opened with IFF_VNET_HDR.
func (t *TAP) VnetHeader() bool { return true }

// SetOffload sets the TAP's TUN_F_ offload flags (TUNSETOFFLOAD).
func (t *TAP) SetOffload(flags uint) error {
	if err := unix.IoctlSetInt(t.fd, unix.TUNSETOFFLOAD, int(flags)); err != nil {
		return fmt.Errorf("virtio-net: TAP %s: TUNSETOFFLOAD %#x: %w", t.name, flags, err)
	}
	return nil
}

// offloadFlags maps the negotiated GUEST_ features to TUN_F_ flags: the
// TAP may hand us only what the guest said it takes. TSO and UFO need
// checksum offload (5.1.3.1), so without GUEST_CSUM nothing is set.
func offloadFlags(features uint64) uint {
	if features&FeatureGuestCsum == 0 {
		return 0
	}
	f := uint(tunFCsum)
	if features&FeatureGuestTSO4 != 0 {
		f |= tunFTSO4
	}
	if features&FeatureGuestTSO6 != 0 {
		f |= tunFTSO6
	}
	if features&FeatureGuestUFO != 0 {
		f |= tunFUFO
	}
	return f
}
