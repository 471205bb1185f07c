package microvm

// The rng device kind: RNGConfig and its checks, how New builds the
// virtio-rng device, its counters (RNGMetrics, the microvm_rng_*
// families) and its command-line flags (--rng, --rng-rate).

import (
	"fmt"
	"strings"

	"github.com/microvm/microvm/devices/rng"
	"github.com/microvm/microvm/internal/promtext"
	"github.com/microvm/microvm/virtio"
)

// rngDevices is the rng device's part of deviceSet.
type rngDevices struct {
	rng     *rng.Device
	rngMMIO *virtio.MMIO
}

// RNGConfig adds a virtio-rng entropy device fed from the host's
// getrandom(2).
type RNGConfig struct {
	// Rate limits the bytes per second the guest gets (0: no limit, at most
	// rng.MaxRate).
	Rate uint64
}

// RNGMetrics are the rng device's counters.
type RNGMetrics struct {
	Name      string // "rng0"
	Transport virtio.TransportStats
	rng.Stats
}

var rngKind = deviceKind{
	validate: func(c *Config) error {
		if c.RNG != nil && c.RNG.Rate > rng.MaxRate {
			return fmt.Errorf("%w: rng rate %d B/s: at most %d", ErrConfig, c.RNG.Rate, uint64(rng.MaxRate))
		}
		return nil
	},
	add: func(m *Machine) error {
		rc := m.cfg.RNG
		if rc == nil {
			return nil
		}
		dev, err := rng.New(rng.Config{Rate: rc.Rate, Log: m.log.WithField("device", "rng")})
		if err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
		m.rng = dev
		m.rngMMIO, err = m.addVirtio(dev, func() error { dev.Close(); return nil })
		return err
	},
	metrics: func(m *Machine, out *DeviceMetrics) {
		if m.rng != nil {
			out.RNG = &RNGMetrics{Name: "rng0", Transport: m.rngMMIO.Stats(), Stats: m.rng.Stats()}
		}
	},
	transports: func(d *DeviceMetrics) []transport {
		if r := d.RNG; r != nil {
			return []transport{{name: r.Name, stats: r.Transport, kicks: []queueCount{{"request", r.Kicks}}}}
		}
		return nil
	},
	families: func(w *promtext.Writer, d *DeviceMetrics) {
		if d.RNG == nil {
			return
		}
		rs := []*RNGMetrics{d.RNG}
		name := func(r *RNGMetrics) string { return r.Name }
		c := func(family, help string, f func(*RNGMetrics) uint64) { counter(w, family, help, rs, name, f) }
		c("microvm_rng_requests_total", "Entropy requests returned to the guest.", func(r *RNGMetrics) uint64 { return r.Requests })
		c("microvm_rng_bytes_total", "Random bytes written to guest memory.", func(r *RNGMetrics) uint64 { return r.Bytes })
		c("microvm_rng_throttled_total", "Times the device waited for its rate limit (--rng-rate).", func(r *RNGMetrics) uint64 { return r.Throttled })
		writeGuestErrors(w, "microvm_rng_guest_errors_total",
			"Malformed request chains and queue errors, by kind (layout, queue); the device then needs a reset.",
			d.RNG.Name, rng.GuestErrorKinds, d.RNG.GuestErrorsByKind)
	},
	flags: []Flag{
		{Name: "rng", Bool: true, Default: "on", Synopsis: "[--rng=off]",
			Usage: "virtio-rng entropy device fed from getrandom (--rng=off leaves it out)",
			Set: func(c *Config, v string) error {
				on, err := onOff("rng", v)
				switch {
				case err != nil:
					return err
				case !on:
					c.RNG = nil
				case c.RNG == nil:
					c.RNG = &RNGConfig{}
				}
				return nil
			}},
		{Name: "rng-rate", Synopsis: "[--rng-rate RATE]",
			Usage: "limit the rng device to this many bytes per second (SIZE[/s]; a bare number means bytes; default no limit)",
			Set: func(c *Config, v string) error {
				r, err := ParseBytes(strings.TrimSuffix(v, "/s"))
				if err != nil || r == 0 || r > rng.MaxRate {
					return fmt.Errorf("%w: --rng-rate %q: want a rate between 1 byte/s and 1G/s", ErrConfig, v)
				}
				if c.RNG == nil {
					return fmt.Errorf("%w: --rng-rate needs the rng device (--rng=off leaves it out)", ErrConfig)
				}
				c.RNG.Rate = r
				return nil
			}},
	},
}

// RNGStats returns the rng device's counters (zero without one).
func (m *Machine) RNGStats() rng.Stats {
	if m.rng == nil {
		return rng.Stats{}
	}
	return m.rng.Stats()
}
