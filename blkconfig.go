package microvm

import (
	"fmt"
	"strings"

	"github.com/microvm/microvm/devices/blk"
	"github.com/microvm/microvm/devices/rng"
)

// DiskConfig adds a virtio-blk disk backed by a raw image file. Disks
// appear in the guest as /dev/vda, /dev/vdb, ... in the order of
// Config.Disks.
type DiskConfig struct {
	// Path is the image: its size must be a multiple of 512 bytes. It is
	// locked (flock) while the machine exists, so a second microvm cannot
	// open it at the same time (readers share a read-only image).
	Path string
	// ReadOnly opens the image read-only; the guest sees a read-only disk
	// and writes fail.
	ReadOnly bool
	// Serial is what the guest reads as the disk's id (at most 20 bytes;
	// /sys/block/vdX/serial).
	Serial string
}

// RNGConfig adds a virtio-rng entropy device fed from the host's
// getrandom(2).
type RNGConfig struct {
	// Rate limits the bytes per second the guest gets (0: no limit, at most
	// rng.MaxRate).
	Rate uint64
}

// maxDisks is what the virtio-mmio slots leave for disks once vsock and
// rng have theirs; the guest names them vda..vdf.
const maxDisks = virtioMaxSlots - 2

// diskName is the guest's name of disk i.
func diskName(i int) string { return "/dev/vd" + string(rune('a'+i)) }

func (c *Config) validateDisks() error {
	if len(c.Disks) > maxDisks {
		return fmt.Errorf("%w: %d disks; at most %d", ErrConfig, len(c.Disks), maxDisks)
	}
	for i, d := range c.Disks {
		if d.Path == "" {
			return fmt.Errorf("%w: disk %d has no path", ErrConfig, i)
		}
		if len(d.Serial) > blk.MaxSerial {
			return fmt.Errorf("%w: disk %s: serial %q is longer than %d bytes", ErrConfig, d.Path, d.Serial, blk.MaxSerial)
		}
	}
	if c.Root != "" {
		if c.rootDisk() < 0 {
			var names []string
			for i := range c.Disks {
				names = append(names, diskName(i))
			}
			return fmt.Errorf("%w: root %q is none of the disks (%s)", ErrConfig, c.Root, strings.Join(names, ", "))
		}
	}
	if c.RNG != nil && c.RNG.Rate > rng.MaxRate {
		return fmt.Errorf("%w: rng rate %d B/s: at most %d", ErrConfig, c.RNG.Rate, uint64(rng.MaxRate))
	}
	return nil
}

// rootDisk is the index of the disk Root names, or -1.
func (c *Config) rootDisk() int {
	for i := range c.Disks {
		if c.Root == diskName(i) {
			return i
		}
	}
	return -1
}

// rootCmdline is the root= parameter for Config.Root: read-write unless
// the disk is read-only.
func (c *Config) rootCmdline() string {
	i := c.rootDisk()
	if i < 0 {
		return ""
	}
	mode := "rw"
	if c.Disks[i].ReadOnly {
		mode = "ro"
	}
	return "root=" + c.Root + " " + mode
}
