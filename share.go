package microvm

// The shared directory kind (virtio-9p): ShareConfig and its checks, how
// New builds the devices, their counters (ShareMetrics, the microvm_9p_*
// families) and their command-line flag (--share).

import (
	"fmt"
	"os"
	"strings"

	"github.com/microvm/microvm/devices/virtio9p"
	"github.com/microvm/microvm/internal/promtext"
	"github.com/microvm/microvm/virtio"
)

// shareDevices is the shared directories' part of deviceSet.
type shareDevices struct {
	shares    []*virtio9p.Device // Config.Shares, in order
	shareMMIO []*virtio.MMIO
}

// ShareConfig adds a virtio-9p device sharing a host directory with the
// guest, which mounts it by tag (docs/share.md):
//
//	mount -t 9p -o trans=virtio,version=9p2000.L TAG /mnt
//
// The guest reads and writes the directory's files as the host user
// microvm runs as; it reaches nothing outside the directory (symlinks in
// it are not followed on the host).
type ShareConfig struct {
	// Tag is the guest's name for it (1 to 64 printable bytes, no
	// spaces, commas or '=').
	Tag string
	// Path is the host directory.
	Path string
	// ReadOnly refuses every change the guest asks for (EROFS).
	ReadOnly bool
}

// ShareMetrics are one shared directory's counters.
type ShareMetrics struct {
	Name      string // the tag
	Path      string // the host directory
	Transport virtio.TransportStats
	virtio9p.Stats
}

// ParseShare parses a --share value: tag=T,path=DIR[,readonly].
func ParseShare(s string) (ShareConfig, error) {
	var sc ShareConfig
	for _, kv := range strings.Split(s, ",") {
		k, v, hasV := strings.Cut(kv, "=")
		switch {
		case k == "tag" && hasV && v != "":
			sc.Tag = v
		case k == "path" && hasV && v != "":
			sc.Path = v
		case (k == "readonly" || k == "ro") && !hasV:
			sc.ReadOnly = true
		default:
			return sc, fmt.Errorf("%w: --share %q: unknown or malformed %q; want tag=T,path=DIR[,readonly]", ErrConfig, s, kv)
		}
	}
	if sc.Tag == "" || sc.Path == "" {
		return sc, fmt.Errorf("%w: --share %q: want tag=T,path=DIR[,readonly]", ErrConfig, s)
	}
	return sc, nil
}

var shareKind = deviceKind{
	validate: func(c *Config) error {
		tags := map[string]bool{}
		for _, sc := range c.Shares {
			if err := virtio9p.CheckTag(sc.Tag); err != nil {
				return fmt.Errorf("%w: share %s: %w", ErrConfig, sc.Path, err)
			}
			if tags[sc.Tag] {
				return fmt.Errorf("%w: two shares have the tag %q", ErrConfig, sc.Tag)
			}
			tags[sc.Tag] = true
			fi, err := os.Stat(sc.Path)
			if err != nil {
				return fmt.Errorf("%w: share %s: %w", ErrConfig, sc.Tag, err)
			}
			if !fi.IsDir() {
				return fmt.Errorf("%w: share %s: %s is not a directory", ErrConfig, sc.Tag, sc.Path)
			}
		}
		return nil
	},
	add: func(m *Machine) error {
		for _, sc := range m.cfg.Shares {
			dev, err := virtio9p.New(virtio9p.Config{Tag: sc.Tag, Root: sc.Path, ReadOnly: sc.ReadOnly,
				Log: m.log.WithField("device", "9p-"+sc.Tag)})
			if err != nil {
				return fmt.Errorf("%w: %w", ErrConfig, err)
			}
			m.shares = append(m.shares, dev)
			t, err := m.addVirtio(dev, func() error { dev.Close(); return nil })
			if err != nil {
				return err
			}
			m.shareMMIO = append(m.shareMMIO, t)
		}
		return nil
	},
	metrics: func(m *Machine, out *DeviceMetrics) {
		for i, d := range m.shares {
			out.Shares = append(out.Shares, ShareMetrics{Name: m.cfg.Shares[i].Tag, Path: m.cfg.Shares[i].Path,
				Transport: m.shareMMIO[i].Stats(), Stats: d.Stats()})
		}
	},
	transports: func(d *DeviceMetrics) []transport {
		var ts []transport
		for _, s := range d.Shares {
			ts = append(ts, transport{name: s.Name, stats: s.Transport, kicks: []queueCount{{"request", s.Kicks}}})
		}
		return ts
	},
	families: func(w *promtext.Writer, d *DeviceMetrics) {
		ss := d.Shares
		name := func(s ShareMetrics) string { return s.Name }
		c := func(family, help string, f func(ShareMetrics) uint64) { counter(w, family, help, ss, name, f) }
		c("microvm_9p_requests_total", "9P requests the guest made of a shared directory.", func(s ShareMetrics) uint64 { return s.Requests })
		c("microvm_9p_replies_total", "Replies written back to the guest.", func(s ShareMetrics) uint64 { return s.Replies })
		c("microvm_9p_request_bytes_total", "Bytes of those requests (file data written included).", func(s ShareMetrics) uint64 { return s.RequestBytes })
		c("microvm_9p_reply_bytes_total", "Bytes of the replies (file data read included).", func(s ShareMetrics) uint64 { return s.ReplyBytes })
		if len(ss) == 0 {
			return
		}
		w.Family("microvm_9p_guest_errors_total", promtext.Counter,
			"Malformed 9P request chains and queue errors, by kind (layout, queue); the device then needs a reset.")
		for _, s := range ss {
			writeGuestErrorSamples(w, s.Name, virtio9p.GuestErrorKinds, s.GuestErrorsByKind)
		}
	},
	flags: []Flag{
		{Name: "share", Synopsis: "[--share tag=T,path=DIR[,readonly]]...",
			Usage: "share host directory DIR with the guest over virtio-9p; the guest mounts it with: mount -t 9p -o trans=virtio,version=9p2000.L T /mnt (repeatable)",
			Set: func(c *Config, v string) error {
				sc, err := ParseShare(v)
				if err != nil {
					return err
				}
				c.Shares = append(c.Shares, sc)
				return nil
			}},
	},
}
