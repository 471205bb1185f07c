package microvm

// The disk kind (virtio-blk): DiskConfig and its checks, Config.Root and
// the root= it adds to the kernel command line, how New opens the disks,
// their counters (DiskMetrics, the microvm_blk_* families) and their
// command-line flags (--disk, --root).

import (
	"fmt"
	"strings"

	"github.com/microvm/microvm/devices/blk"
	"github.com/microvm/microvm/internal/promtext"
	"github.com/microvm/microvm/internal/vmm"
	"github.com/microvm/microvm/virtio"
)

// diskDevices is the disks' part of deviceSet.
type diskDevices struct {
	disks    []*blk.Device // Config.Disks, in order
	diskMMIO []*virtio.MMIO
}

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
	// CopyOnWrite opens the image read-only (shared with other readers)
	// and keeps the guest's writes in a private overlay, a temporary file
	// removed with the machine: the image never changes, so many machines
	// can share it and throw their writes away (docs/blk.md). A snapshot
	// of a machine whose copy-on-write disk holds writes is refused.
	CopyOnWrite bool
}

// DiskMetrics are one disk's counters.
type DiskMetrics struct {
	Name      string // "vda", "vdb", ...: what the guest calls it
	Path      string // the image (DiskConfig.Path)
	Transport virtio.TransportStats
	blk.Stats
}

// maxDisks is what the virtio-mmio slots leave for disks once vsock and
// rng have theirs; the guest names them vda..vdf.
const maxDisks = vmm.VirtioSlots - 2

// diskName is the guest's name of disk i.
func diskName(i int) string { return "/dev/vd" + string(rune('a'+i)) }

// rootDisk is the index of the disk c.Root names, or -1.
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

// ParseDisk parses a --disk value: path=F[,readonly|,cow][,serial=S].
func ParseDisk(s string) (DiskConfig, error) {
	var d DiskConfig
	for _, kv := range strings.Split(s, ",") {
		k, v, hasV := strings.Cut(kv, "=")
		switch {
		case k == "path" && hasV && v != "":
			d.Path = v
		case k == "readonly" && !hasV:
			d.ReadOnly = true
		case k == "cow" && !hasV:
			d.CopyOnWrite = true
		case k == "serial" && hasV:
			d.Serial = v
		default:
			return d, fmt.Errorf("%w: --disk %q: unknown or malformed %q; want path=FILE[,readonly|,cow][,serial=S]", ErrConfig, s, kv)
		}
	}
	if d.Path == "" {
		return d, fmt.Errorf("%w: --disk %q: no path=FILE", ErrConfig, s)
	}
	if d.ReadOnly && d.CopyOnWrite {
		return d, fmt.Errorf("%w: --disk %q: readonly or cow, not both (a copy-on-write disk takes writes)", ErrConfig, s)
	}
	return d, nil
}

var diskKind = deviceKind{
	validate: func(c *Config) error {
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
		if c.Root != "" && c.rootDisk() < 0 {
			var names []string
			for i := range c.Disks {
				names = append(names, diskName(i))
			}
			return fmt.Errorf("%w: root %q is none of the disks (%s)", ErrConfig, c.Root, strings.Join(names, ", "))
		}
		return nil
	},
	add: func(m *Machine) error {
		for i, dc := range m.cfg.Disks {
			dev, err := blk.Open(blk.Config{Path: dc.Path, ReadOnly: dc.ReadOnly, Serial: dc.Serial,
				CopyOnWrite: dc.CopyOnWrite, Log: m.log.WithField("device", diskName(i))})
			if err != nil {
				return err
			}
			m.disks = append(m.disks, dev)
			t, err := m.addVirtio(dev, dev.Close)
			if err != nil {
				return err
			}
			m.diskMMIO = append(m.diskMMIO, t)
		}
		return nil
	},
	cmdline: func(c *Config) []string {
		if r := c.rootCmdline(); r != "" {
			return []string{r}
		}
		return nil
	},
	metrics: func(m *Machine, out *DeviceMetrics) {
		for i, d := range m.disks {
			out.Disks = append(out.Disks, DiskMetrics{Name: strings.TrimPrefix(diskName(i), "/dev/"),
				Path: m.cfg.Disks[i].Path, Transport: m.diskMMIO[i].Stats(), Stats: d.Stats()})
		}
	},
	transports: func(d *DeviceMetrics) []transport {
		var ts []transport
		for _, d := range d.Disks {
			ts = append(ts, transport{name: d.Name, stats: d.Transport, kicks: []queueCount{{"request", d.Kicks}}})
		}
		return ts
	},
	families: func(w *promtext.Writer, dm *DeviceMetrics) {
		ds := dm.Disks
		if len(ds) == 0 {
			return
		}
		name := func(d DiskMetrics) string { return d.Name }
		c := func(family, help string, f func(DiskMetrics) uint64) { counter(w, family, help, ds, name, f) }
		w.Family("microvm_blk_requests_total", promtext.Counter, "Requests completed OK, by operation.")
		for _, d := range ds {
			for _, op := range []struct {
				name string
				n    uint64
			}{{"read", d.Reads}, {"write", d.Writes}, {"flush", d.Flushes}, {"discard", d.Discards},
				{"write_zeroes", d.WriteZeroes}, {"get_id", d.GetIDs}} {
				w.Uint(op.n, "device", d.Name, "op", op.name)
			}
		}
		c("microvm_blk_read_bytes_total", "Bytes read from the image into guest memory.", func(d DiskMetrics) uint64 { return d.BytesRead })
		c("microvm_blk_written_bytes_total", "Bytes written from guest memory to the image.", func(d DiskMetrics) uint64 { return d.BytesWritten })
		c("microvm_blk_refused_total", "Requests answered IOERR or UNSUPP because of what the guest asked (out of range, read-only, unknown type).", func(d DiskMetrics) uint64 { return d.Refused })
		c("microvm_blk_host_errors_total", "Requests answered IOERR because the host file failed.", func(d DiskMetrics) uint64 { return d.HostErrors })
		w.Family("microvm_blk_guest_errors_total", promtext.Counter,
			"Malformed request chains and queue errors, by kind (header, layout, queue); the device then needs a reset.")
		for _, d := range ds {
			writeGuestErrorSamples(w, d.Name, blk.GuestErrorKinds, d.GuestErrorsByKind)
		}
		w.Family("microvm_blk_max_in_flight", promtext.Gauge, "Most requests seen in flight at once.")
		for _, d := range ds {
			w.Uint(d.MaxInFlight, "device", d.Name)
		}
	},
	flags: []Flag{
		{Name: "disk", Synopsis: "[--disk path=F[,readonly|,cow][,serial=S]]...",
			Usage: "add a virtio-blk disk over a raw image: path=FILE[,readonly|,cow][,serial=S]; cow keeps the writes in a throw-away overlay (repeatable: /dev/vda, /dev/vdb, ... in order)",
			Set: func(c *Config, v string) error {
				d, err := ParseDisk(v)
				if err != nil {
					return err
				}
				c.Disks = append(c.Disks, d)
				return nil
			}},
		{Name: "root", Synopsis: "[--root /dev/vdX]",
			Usage: "boot from this disk (/dev/vda, ...) instead of the initramfs: adds root=DEV rw (ro for a read-only disk)",
			Set:   func(c *Config, v string) error { c.Root = v; return nil }},
	},
	finish: func(c *Config, _ func(string) bool) error {
		if c.Root != "" && len(c.Disks) == 0 {
			return fmt.Errorf("%w: --root %s needs a --disk", ErrConfig, c.Root)
		}
		return nil
	},
}

// DiskStats returns the counters of disk i (Config.Disks[i]); zero when
// there is no such disk.
func (m *Machine) DiskStats(i int) blk.Stats {
	if i < 0 || i >= len(m.disks) {
		return blk.Stats{}
	}
	return m.disks[i].Stats()
}
