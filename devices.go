package microvm

// The virtio devices a machine can have, one deviceKind each: its
// configuration (a Config field, its checks, its command-line flags), how
// New builds it, what it adds to the kernel command line, and its metrics.
// Its virtio-mmio slot, interrupt, virtio_mmio.device= entry and ACPI
// description follow from the slot (internal/vmm), whatever the kind.
//
// Adding a device is adding its package under devices/, an entry in
// deviceKinds with its config type, its deviceSet and DeviceMetrics fields
// (all in this file), and its field in Config (config.go): nothing else in
// the root package, the CLI (cmd/microvm makes its flags from DeviceFlags)
// or the metrics server changes.

import (
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/microvm/microvm/devices/blk"
	"github.com/microvm/microvm/devices/rng"
	"github.com/microvm/microvm/devices/virtio9p"
	"github.com/microvm/microvm/devices/virtionet"
	"github.com/microvm/microvm/devices/virtionet/usernet/netpolicy"
	"github.com/microvm/microvm/internal/promtext"
	"github.com/microvm/microvm/internal/vmm"
	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/vsock"
)

// A deviceKind is one kind of virtio device.
type deviceKind struct {
	// validate checks the kind's part of a Config (New, before anything
	// is created).
	validate func(c *Config) error
	// add creates the devices c asks for and puts each in the next slot
	// (Machine.addVirtio), in order.
	add func(m *Machine) error
	// cmdline is what the kind adds to the kernel command line, before
	// the virtio-mmio entries (nil: nothing).
	cmdline func(c *Config) []string
	// metrics fills the kind's part of a Metrics snapshot.
	metrics func(m *Machine, out *DeviceMetrics)
	// transports are its devices as the virtio families see them.
	transports func(d *DeviceMetrics) []transport
	// families writes its own Prometheus families (docs/metrics.md).
	families func(w *promtext.Writer, d *DeviceMetrics)
	// flags are its command-line flags; finish checks them together once
	// all are parsed (nil: nothing to check).
	flags  []Flag
	finish func(c *Config, given func(flag string) bool) error
}

// deviceKinds are the kinds in slot order (docs/machine.md): vsock, rng,
// the disks, the network devices, the shared directories.
var deviceKinds = []deviceKind{vsockKind, rngKind, diskKind, netKind, shareKind}

// deviceSet is the machine's virtio devices and their transports, by kind
// (Machine embeds it). Set by New and never changed.
type deviceSet struct {
	vsock       *vsock.Device
	vsockMMIO   *virtio.MMIO
	uds         *vsock.UDS
	vsockRouter *vsockRouter // the device's Dialer: ListenVsock listeners, else uds_<port>

	rng     *rng.Device
	rngMMIO *virtio.MMIO

	disks    []*blk.Device // Config.Disks, in order
	diskMMIO []*virtio.MMIO

	nets    []*virtionet.Device // Config.Nets, in order
	netMMIO []*virtio.MMIO

	shares    []*virtio9p.Device // Config.Shares, in order
	shareMMIO []*virtio.MMIO
}

// addVirtio puts dev in the machine's next virtio-mmio slot and has
// closeDev run when the machine closes, after the slot's transport has
// reset the device and its eventfds are gone (OnClose runs last in, first
// out).
func (m *Machine) addVirtio(dev virtio.Device, closeDev func() error) (*virtio.MMIO, error) {
	m.vm.OnClose(closeDev)
	return m.vm.AddVirtio(dev)
}

// DeviceMetrics are the virtio devices' counters, by kind (Metrics embeds
// it).
type DeviceMetrics struct {
	// Vsock is the vsock device's (nil without one).
	Vsock *VsockMetrics
	// RNG is the rng device's (nil without one).
	RNG *RNGMetrics
	// Disks, Nets and Shares follow Config.Disks, Config.Nets and
	// Config.Shares.
	Disks  []DiskMetrics
	Nets   []NetMetrics
	Shares []ShareMetrics
}

// Flag is a device's command-line flag, as DeviceFlags returns it for a
// CLI to offer (cmd/microvm makes urfave/cli flags of them).
type Flag struct {
	// Name is the flag's name without dashes ("disk").
	Name string
	// Usage is its help text.
	Usage string
	// Synopsis is how a usage line shows it ("[--disk path=F]...").
	Synopsis string
	// Bool says the flag may stand alone (--rng) and takes on or off as
	// a value (--rng=off); Default is then "on" or "off".
	Bool    bool
	Default string
	// Set applies one occurrence's value to a Config, in command-line
	// order; a repeatable flag adds a device each time.
	Set func(c *Config, value string) error
}

// DeviceFlags returns every device kind's command-line flags, in slot
// order of their kinds.
func DeviceFlags() []Flag {
	var fs []Flag
	for _, k := range deviceKinds {
		fs = append(fs, k.flags...)
	}
	return fs
}

// DeviceFlagDefaults sets what the flags configure when none is given: a
// Config from the command line starts with it (the rng device is on).
func DeviceFlagDefaults(c *Config) {
	for _, f := range DeviceFlags() {
		if f.Bool {
			_ = f.Set(c, f.Default)
		}
	}
}

// FinishDeviceFlags checks the device flags together once all are set;
// given says which flags the command line holds. Errors wrap ErrConfig.
func FinishDeviceFlags(c *Config, given func(flag string) bool) error {
	for _, k := range deviceKinds {
		if k.finish != nil {
			if err := k.finish(c, given); err != nil {
				return err
			}
		}
	}
	return nil
}

// onOff parses a Bool flag's value.
func onOff(flag, v string) (bool, error) {
	switch strings.ToLower(v) {
	case "on", "true", "1", "yes":
		return true, nil
	case "off", "false", "0", "no":
		return false, nil
	}
	return false, fmt.Errorf("%w: --%s %q: want on or off", ErrConfig, flag, v)
}

// transport is one virtio device as the virtio families see it.
type transport struct {
	name  string
	stats virtio.TransportStats
	kicks []queueCount // notifications the device's workers observed, by queue
	full  []queueCount // work held back for want of guest buffers, by queue
}

type queueCount struct {
	queue string
	n     uint64
}

// --- vsock ---------------------------------------------------------------------

// VsockConfig adds a virtio-vsock device reached from the host through
// Firecracker-compatible Unix sockets, and in-process through
// Machine.DialVsock and Machine.ListenVsock.
type VsockConfig struct {
	// CID is the guest's context id (>= 3).
	CID uint64
	// UDSPath, when set, is the host socket: clients connect to it and
	// send "CONNECT <port>\n"; guest connections to port P go to
	// UDSPath_P (when no ListenVsock listener has P). Empty: the device
	// is reached in-process only (DialVsock, ListenVsock), and guest
	// connections to ports without a listener are refused.
	UDSPath string
	// MaxConnections bounds open connections (default 1023).
	MaxConnections int
	// ConnBuffer is the per-connection buffer in bytes (default 256 KiB, at
	// most MaxVsockConnBuffer).
	ConnBuffer int
	// BufferTotal bounds the guest->host bytes all connections together
	// may make the device buffer (vsock.Config.MaxBuffered; 0: 64 MiB, or
	// MaxConnections x 4 KiB when more). At least vsock.MinMaxBuffered:
	// every connection is sure of a 4 KiB window.
	BufferTotal uint64
	// ConnectTimeout bounds the CONNECT handshake (default 2 s).
	ConnectTimeout time.Duration
	// Options selects data-path optimisations (nil: vsock.DefaultOptions).
	Options *vsock.Options
	// Dgram offers experimental vsock datagrams (vsock.Config.Dgram): host
	// applications send to UDSPath.dgram, guest datagrams to port P go to
	// UDSPath_P.dgram. It needs UDSPath.
	Dgram bool
}

// MaxVsockConnBuffer bounds VsockConfig.ConnBuffer, as the vhost-user
// back-end's --conn-buffer: the buffer is host memory each connection may
// hold, and the credit arithmetic is 32-bit.
const MaxVsockConnBuffer = 1 << 30

// VsockMetrics are the vsock device's counters.
type VsockMetrics struct {
	Name      string // "vsock0", the device label of its metrics
	Dgram     bool   // the device offers datagrams (VsockConfig.Dgram)
	Transport virtio.TransportStats
	vsock.Stats
}

// transport is the vsock device as the virtio families see it.
func (v *VsockMetrics) transport() transport {
	t := transport{name: v.Name, stats: v.Transport,
		kicks: []queueCount{{"rx", v.RxKicks}, {"tx", v.TxKicks}},
		full:  []queueCount{{"rx", v.RxQueueFull}}}
	if v.Dgram {
		t.kicks = append(t.kicks, queueCount{"dgram_tx", v.DgramKicks})
	}
	return t
}

// The vsock device's command-line flags are cmd/microvm's own
// (vsockflags.go): `run` and `vhost-user-vsock` share them under two sets
// of names.
var vsockKind = deviceKind{
	validate: func(c *Config) error {
		v := c.Vsock
		if v == nil {
			return nil
		}
		if v.CID < 3 || v.CID > 0xffffffff-1 {
			return fmt.Errorf("%w: vsock CID %d: must be at least 3 (0-2 are reserved) and below 2^32-1", ErrConfig, v.CID)
		}
		if v.Dgram && v.UDSPath == "" {
			return fmt.Errorf("%w: vsock datagrams need a Unix socket path (--vsock-uds)", ErrConfig)
		}
		if v.ConnBuffer < 0 || v.ConnBuffer > MaxVsockConnBuffer {
			return fmt.Errorf("%w: vsock connection buffer %d: want 1..%d bytes (0: the default)", ErrConfig, v.ConnBuffer, MaxVsockConnBuffer)
		}
		if v.MaxConnections < 0 {
			return fmt.Errorf("%w: vsock connection limit %d: want at least 1 (0: the default)", ErrConfig, v.MaxConnections)
		}
		if v.UDSPath != "" {
			if err := vsock.CheckUDSPath(v.UDSPath); err != nil {
				return fmt.Errorf("%w: %w", ErrConfig, err)
			}
		}
		return nil
	},
	add: func(m *Machine) error {
		vc := m.cfg.Vsock
		if vc == nil {
			return nil
		}
		// Guest connections go to ListenVsock listeners, else to
		// UDSPath_<port> (refused without UDSPath). Registered before the
		// device, the router is closed after it.
		var fallback vsock.Dialer
		if vc.UDSPath != "" {
			fallback = vsock.UDSDialer{Path: vc.UDSPath}
		}
		router := newVsockRouter(vc.CID, fallback)
		m.vsockRouter = router
		m.vm.OnClose(func() error { router.closeAll(); return nil })
		dev, err := vsock.New(vsock.Config{
			CID:            vc.CID,
			MaxConns:       vc.MaxConnections,
			ConnBuffer:     uint32(vc.ConnBuffer),
			MaxBuffered:    vc.BufferTotal,
			ConnectTimeout: vc.ConnectTimeout,
			Dialer:         router,
			Options:        vc.Options,
			Dgram:          vc.Dgram,
			DgramUDS:       vc.UDSPath,
			Log:            m.log.WithField("device", "vsock"),
		})
		if err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
		m.vsock = dev
		if m.vsockMMIO, err = m.addVirtio(dev, func() error { dev.Close(); return nil }); err != nil {
			return err
		}
		if vc.UDSPath == "" {
			return nil
		}
		uds, err := vsock.ListenUDS(vc.UDSPath, dev, vc.ConnectTimeout, m.log.WithField("device", "vsock-uds"))
		if err != nil {
			return err
		}
		m.uds = uds
		m.vm.OnClose(func() error {
			// The device first: host clients still waiting for the guest
			// driver are released at once instead of at their deadline.
			dev.Close()
			return uds.Close()
		})
		return nil
	},
	metrics: func(m *Machine, out *DeviceMetrics) {
		if m.vsock != nil {
			out.Vsock = &VsockMetrics{Name: "vsock0", Dgram: m.cfg.Vsock.Dgram,
				Transport: m.vsockMMIO.Stats(), Stats: m.vsock.Stats()}
		}
	},
	transports: func(d *DeviceMetrics) []transport {
		if d.Vsock == nil {
			return nil
		}
		return []transport{d.Vsock.transport()}
	},
	families: func(w *promtext.Writer, d *DeviceMetrics) {
		if d.Vsock != nil {
			writeVsockFamilies(w, d.Vsock)
		}
	},
}

// writeVsockFamilies writes the vsock device's families (also for
// `microvm vhost-user-vsock`'s metrics).
func writeVsockFamilies(w *promtext.Writer, s *VsockMetrics) {
	v := []*VsockMetrics{s}
	name := func(v *VsockMetrics) string { return v.Name }
	c := func(family, help string, f func(*VsockMetrics) uint64) { counter(w, family, help, v, name, f) }
	c("microvm_vsock_tx_packets_total", "Packets the guest sent (TX queue).", func(v *VsockMetrics) uint64 { return v.TxPackets })
	c("microvm_vsock_rx_packets_total", "Packets sent to the guest (RX queue).", func(v *VsockMetrics) uint64 { return v.RxPackets })
	c("microvm_vsock_tx_bytes_total", "Stream and SEQPACKET payload bytes the guest sent.", func(v *VsockMetrics) uint64 { return v.TxBytes })
	c("microvm_vsock_rx_bytes_total", "Stream and SEQPACKET payload bytes sent to the guest.", func(v *VsockMetrics) uint64 { return v.RxBytes })
	c("microvm_vsock_connections_opened_total", "Connections added to the device's table, either way.", func(v *VsockMetrics) uint64 { return v.ConnsOpened })
	c("microvm_vsock_connections_established_total", "Connections that reached the established state, either way.", func(v *VsockMetrics) uint64 { return v.ConnsEstablished })
	c("microvm_vsock_connections_refused_total", "Connection attempts that never got established: refused by the host or the guest, or timed out.", func(v *VsockMetrics) uint64 { return v.ConnsRefused })
	c("microvm_vsock_connections_reset_total", "Established connections ended by an RST instead of the orderly shutdown, by either side.", func(v *VsockMetrics) uint64 { return v.ConnsReset })
	w.Family("microvm_vsock_connections", promtext.Gauge, "Connections open now.")
	w.Int(s.ConnsOpen, "device", s.Name)
	c("microvm_vsock_rst_sent_total", "RST packets sent to the guest (resets, refusals, orderly closes, packets for no connection).", func(v *VsockMetrics) uint64 { return v.RstSent })
	c("microvm_vsock_rst_dropped_total", "RSTs dropped because the device's RST queue was full.", func(v *VsockMetrics) uint64 { return v.DroppedRsts })
	writeGuestErrors(w, "microvm_vsock_guest_errors_total",
		"Malformed packets and protocol violations by the guest, by kind (header, address, type, length, op, credit, queue).",
		s.Name, vsock.GuestErrorKinds, s.GuestErrorsByKind)
	c("microvm_vsock_host_write_stalls_total", "Writes to host sockets that took only part of the data (the rest is buffered).", func(v *VsockMetrics) uint64 { return v.HostWriteStalls })
	c("microvm_vsock_host_reads_empty_total", "Reads of host sockets that found nothing (EAGAIN); the short-read option saves most of them.", func(v *VsockMetrics) uint64 { return v.HostReadsEmpty })
	c("microvm_vsock_host_events_total", "Epoll events of host sockets the device's RX worker handled (each a look at the connection, often a wake-up).", func(v *VsockMetrics) uint64 { return v.HostEvents })
	c("microvm_vsock_epoll_interest_changes_total", "Changes to what a host socket's epoll registration asks for (the ready-gate option).", func(v *VsockMetrics) uint64 { return v.InterestChanges })
	c("microvm_vsock_tx_interrupts_total", "TX-completion interrupts the device raised.", func(v *VsockMetrics) uint64 { return v.TxInterrupts })
	c("microvm_vsock_tx_interrupts_covered_total", "TX-completion interrupts not raised because the RX interrupt held to the end of the TX batch served them on the shared line (the irq-coalesce option).", func(v *VsockMetrics) uint64 { return v.TxInterruptsCovered })
	c("microvm_vsock_credit_updates_sent_total", "CREDIT_UPDATE packets sent to the guest.", func(v *VsockMetrics) uint64 { return v.CreditUpdatesSent })
	c("microvm_vsock_credit_stalls_total", "Credit grants cut short by the device-wide buffer bound (--vsock-buffer-total).", func(v *VsockMetrics) uint64 { return v.CreditStalls })
	c("microvm_vsock_transport_resets_total", "Host-side transport resets (Machine.ResetVsockTransport): every connection dropped.", func(v *VsockMetrics) uint64 { return v.TransportResets })
	c("microvm_vsock_transport_reset_events_total", "TRANSPORT_RESET events written to the guest's event queue.", func(v *VsockMetrics) uint64 { return v.EventsSent })
	w.Family("microvm_vsock_buffer_granted_bytes", promtext.Gauge, "Guest-to-host buffer space granted to open connections now.")
	w.Uint(s.BufferGranted, "device", s.Name)
	c("microvm_vsock_late_rw_dropped_total", "Guest data sent after the host had closed, before the guest saw it: dropped.", func(v *VsockMetrics) uint64 { return v.LateRWDropped })
	w.Family("microvm_vsock_seqpacket_messages_total", promtext.Counter, "SEQPACKET messages passed whole, by direction.")
	w.Uint(s.SeqToHost, "device", s.Name, "direction", "to_host")
	w.Uint(s.SeqToGuest, "device", s.Name, "direction", "to_guest")
	c("microvm_vsock_direct_enqueues_total", "Connection work a producer put in the RX ring itself (--vsock-opt direct-enqueue).", func(v *VsockMetrics) uint64 { return v.DirectEnqueues })
	c("microvm_vsock_rx_handoffs_total", "Connection work another goroutine handed to the RX worker with a wake-up (what direct-enqueue avoids).", func(v *VsockMetrics) uint64 { return v.RxHandoffs })
	c("microvm_vsock_kick_suppressions_total", "TX passes run with the guest's kicks off across host writes (--vsock-opt kick-suppress).", func(v *VsockMetrics) uint64 { return v.KickSuppressions })
	c("microvm_vsock_batched_packets_total", "TX packets that joined a run already holding their connection's lock (--vsock-opt batch).", func(v *VsockMetrics) uint64 { return v.BatchedPackets })
	c("microvm_vsock_tx_passes_cut_total", "TX passes ended at their chain budget with the ring maybe not empty (a guest that keeps posting); the worker looked at its stop eventfd before going on.", func(v *VsockMetrics) uint64 { return v.TxPassesCut })
	if !s.Dgram {
		return
	}
	c("microvm_vsock_dgram_tx_total", "Datagrams from the guest delivered to a host socket.", func(v *VsockMetrics) uint64 { return v.DgramTx })
	c("microvm_vsock_dgram_rx_total", "Datagrams from host sockets delivered to the guest.", func(v *VsockMetrics) uint64 { return v.DgramRx })
	c("microvm_vsock_dgram_tx_bytes_total", "Payload bytes of the datagrams counted in microvm_vsock_dgram_tx_total.", func(v *VsockMetrics) uint64 { return v.DgramTxBytes })
	c("microvm_vsock_dgram_rx_bytes_total", "Payload bytes of the datagrams counted in microvm_vsock_dgram_rx_total.", func(v *VsockMetrics) uint64 { return v.DgramRxBytes })
	c("microvm_vsock_dgram_tx_dropped_total", "Guest datagrams no host socket took (none bound, or its queue full).", func(v *VsockMetrics) uint64 { return v.DgramTxDropped })
	c("microvm_vsock_dgram_rx_dropped_total", "Host datagrams dropped because the guest had no datagram buffer posted.", func(v *VsockMetrics) uint64 { return v.DgramRxDropped })
	c("microvm_vsock_dgram_rx_rejected_total", "Host datagrams shorter than the address prefix or larger than the guest's buffer.", func(v *VsockMetrics) uint64 { return v.DgramRxRejected })
	c("microvm_vsock_dgram_passes_cut_total", "Datagram TX passes ended at their budget; the worker served host datagrams and looked at its stop eventfd before going on.", func(v *VsockMetrics) uint64 { return v.DgramPassesCut })
}

// --- rng -----------------------------------------------------------------------

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

// --- disks (virtio-blk) --------------------------------------------------------

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

// --- network devices (virtio-net) ------------------------------------------------

// MaxNets bounds Config.Nets: the virtio-mmio slots are shared with the
// other devices (docs/machine.md).
const MaxNets = 4

// NetConfig adds a virtio-net device on a host TAP interface or on a
// user-mode network (docs/net.md).
type NetConfig struct {
	// TAP is the host interface. microvm attaches to it, creating it when
	// it does not exist and microvm has CAP_NET_ADMIN; the host side's
	// address and link state are the caller's to set.
	TAP string
	// NetNS is the network namespace the TAP is in or is created in (a
	// path such as /var/run/netns/NAME; "" is microvm's own): how a
	// container runtime puts the VM on a pod's network (docs/net.md).
	NetNS string
	// User, instead of a TAP, puts the device on a user-mode network
	// (devices/virtionet/usernet): DHCP, DNS and NAT through microvm's
	// own sockets, no privilege needed. The kernel command line gets
	// ip=...:ethN:dhcp, so a Linux guest with IP_PNP (the project
	// kernel) has the address before /init. At most one device has it.
	// Not in the lean build of the CLI, which hands such runs to
	// microvm-full.
	User bool
	// Publish forwards host ports to the guest (User only).
	Publish []virtionet.Publish
	// HostLoopback (User only; --net user,host-loopback) lets the guest
	// reach the host's 127.0.0.1 at 192.168.127.254, and the host's own
	// addresses: off, a service on the host that trusts local clients is
	// out of the guest's reach (docs/net.md, "What the guest reaches").
	HostLoopback bool
	// Egress (User only; --net user,egress=SPEC, netpolicy.ParseEgress)
	// limits the guest's other destinations; the zero value allows all
	// but the blocked ranges (loopback, link-local and cloud metadata,
	// multicast).
	Egress netpolicy.Egress
	// MAC is the guest's address; nil picks a random locally
	// administered one.
	MAC net.HardwareAddr
}

// HasUserNet reports whether a device is on a user-mode network.
func (c *Config) HasUserNet() bool {
	for _, n := range c.Nets {
		if n.User {
			return true
		}
	}
	return false
}

// NetMetrics are one network device's counters.
type NetMetrics struct {
	Name      string // "eth0", "eth1", ...: what a Linux guest calls it
	TAP       string // the host TAP interface (NetConfig.TAP); "" on a user-mode network
	User      bool   // on a user-mode network (NetConfig.User)
	Transport virtio.TransportStats
	virtionet.Stats
}

// netSyntax is --net's value.
const netSyntax = "user[,host-loopback][,egress=SPEC][,mac=M] or tap=NAME[,netns=PATH][,mac=M]"

// ParseNet parses a --net value: user[,host-loopback][,egress=SPEC][,mac=M]
// or tap=NAME[,netns=PATH][,mac=M]. SPEC is netpolicy.ParseEgress's, its
// rules joined with "+" since "," joins the options.
func ParseNet(s string) (NetConfig, error) {
	var nc NetConfig
	egress := false
	for i, kv := range strings.Split(s, ",") {
		if kv == "user" && i == 0 {
			nc.User = true
			continue
		}
		if kv == "host-loopback" {
			if nc.HostLoopback {
				return nc, fmt.Errorf("%w: --net %q: host-loopback given twice", ErrConfig, s)
			}
			nc.HostLoopback = true
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || v == "" {
			return nc, fmt.Errorf("%w: --net %q: want %s", ErrConfig, s, netSyntax)
		}
		switch k {
		case "egress":
			if egress {
				return nc, fmt.Errorf("%w: --net %q: egress given twice (join its rules with +)", ErrConfig, s)
			}
			e, err := netpolicy.ParseEgress(v)
			if err != nil {
				return nc, fmt.Errorf("%w: --net %q: %w", ErrConfig, s, err)
			}
			nc.Egress, egress = e, true
		case "tap":
			if nc.TAP != "" {
				return nc, fmt.Errorf("%w: --net %q: tap given twice", ErrConfig, s)
			}
			if len(v) > 15 || strings.ContainsAny(v, "/ \t") {
				return nc, fmt.Errorf("%w: --net %q: TAP name %q: want at most 15 bytes, no '/' or spaces", ErrConfig, s, v)
			}
			nc.TAP = v
		case "netns":
			if nc.NetNS != "" {
				return nc, fmt.Errorf("%w: --net %q: netns given twice", ErrConfig, s)
			}
			nc.NetNS = v
		case "mac":
			if nc.MAC != nil {
				return nc, fmt.Errorf("%w: --net %q: mac given twice", ErrConfig, s)
			}
			m, err := virtionet.ParseMAC(v)
			if err != nil {
				return nc, fmt.Errorf("%w: --net %q: %w", ErrConfig, s, err)
			}
			nc.MAC = m
		default:
			return nc, fmt.Errorf("%w: --net %q: unknown key %q (want tap, netns, mac, egress or host-loopback)", ErrConfig, s, k)
		}
	}
	switch {
	case nc.User && nc.TAP != "":
		return nc, fmt.Errorf("%w: --net %q: user or tap=NAME, not both", ErrConfig, s)
	case !nc.User && nc.TAP == "":
		return nc, fmt.Errorf("%w: --net %q: want user or tap=NAME", ErrConfig, s)
	case nc.User && nc.NetNS != "":
		return nc, fmt.Errorf("%w: --net %q: netns needs a TAP (tap=NAME)", ErrConfig, s)
	case !nc.User && (nc.HostLoopback || egress):
		return nc, fmt.Errorf("%w: --net %q: host-loopback and egress are --net user's (a TAP's traffic is the host's firewall's to filter)", ErrConfig, s)
	}
	return nc, nil
}

// userNetCmdline is the kernel's ip= parameter for user-mode network
// device i: DHCP on ethN alone.
func userNetCmdline(i int) string { return fmt.Sprintf("ip=:::::eth%d:dhcp", i) }

var netKind = deviceKind{
	validate: func(c *Config) error {
		if len(c.Nets) > MaxNets {
			return fmt.Errorf("%w: %d network devices; at most %d", ErrConfig, len(c.Nets), MaxNets)
		}
		users := 0
		for _, n := range c.Nets {
			switch {
			case n.User && n.TAP != "":
				return fmt.Errorf("%w: net: a TAP (%s) or a user-mode network, not both", ErrConfig, n.TAP)
			case n.User && n.NetNS != "":
				return fmt.Errorf("%w: net: a network namespace (%s) needs a TAP, not a user-mode network", ErrConfig, n.NetNS)
			case n.User:
				users++
			case n.TAP == "":
				return fmt.Errorf("%w: net: no TAP interface named and not a user-mode network", ErrConfig)
			case len(n.TAP) >= 16:
				return fmt.Errorf("%w: net: TAP name %q is longer than 15 bytes", ErrConfig, n.TAP)
			case len(n.Publish) > 0:
				return fmt.Errorf("%w: net %s: --publish needs a user-mode network (--net user), not a TAP", ErrConfig, n.TAP)
			case n.HostLoopback || n.Egress.Restrict || len(n.Egress.Allow) > 0:
				return fmt.Errorf("%w: net %s: host-loopback and egress need a user-mode network (--net user), not a TAP", ErrConfig, n.TAP)
			}
			if !n.Egress.Restrict && len(n.Egress.Allow) > 0 {
				return fmt.Errorf("%w: net: egress rules without Restrict: set it, the rules are then the only destinations", ErrConfig)
			}
			if _, err := netpolicy.ParseEgress(n.Egress.String()); err != nil {
				return fmt.Errorf("%w: net: %w", ErrConfig, err)
			}
			if n.MAC != nil && (len(n.MAC) != 6 || n.MAC[0]&1 != 0) {
				return fmt.Errorf("%w: net: MAC %v is not a 6-byte unicast address", ErrConfig, n.MAC)
			}
			for _, p := range n.Publish {
				if p.HostPort == 0 || p.GuestPort == 0 || (p.Proto != "tcp" && p.Proto != "udp") || net.ParseIP(p.HostIP) == nil {
					return fmt.Errorf("%w: net: publish %+v: want tcp or udp, a host IP and two ports", ErrConfig, p)
				}
			}
		}
		if users > 1 {
			return fmt.Errorf("%w: %d devices on user-mode networks; at most one", ErrConfig, users)
		}
		return nil
	},
	cmdline: func(c *Config) []string {
		for i, n := range c.Nets {
			if n.User {
				return []string{userNetCmdline(i)}
			}
		}
		return nil
	},
	add: func(m *Machine) error {
		for i, nc := range m.cfg.Nets {
			// A restore may give the device a MAC other than the one the
			// guest saw (a clone's own: MACChanges).
			cfg := virtionet.Config{TAP: nc.TAP, NetNS: nc.NetNS, MAC: nc.MAC, NewMAC: m.snap != nil,
				Log: m.log.WithField("device", fmt.Sprintf("net%d", i))}
			var dev *virtionet.Device
			var err error
			if nc.User {
				dev, err = m.userNet(cfg, nc)
			} else {
				dev, err = virtionet.New(cfg)
			}
			if err != nil {
				return err
			}
			m.nets = append(m.nets, dev)
			t, err := m.addVirtio(dev, dev.Close)
			if err != nil {
				return err
			}
			m.netMMIO = append(m.netMMIO, t)
		}
		return nil
	},
	metrics: func(m *Machine, out *DeviceMetrics) {
		for i, n := range m.nets {
			out.Nets = append(out.Nets, NetMetrics{Name: fmt.Sprintf("eth%d", i), TAP: m.cfg.Nets[i].TAP, User: m.cfg.Nets[i].User,
				Transport: m.netMMIO[i].Stats(), Stats: n.Stats()})
		}
	},
	transports: func(d *DeviceMetrics) []transport {
		var ts []transport
		for _, n := range d.Nets {
			ts = append(ts, transport{name: n.Name, stats: n.Transport,
				kicks: []queueCount{{"rx", n.RxKicks}, {"tx", n.TxKicks}},
				full:  []queueCount{{"rx", n.RxStalls}}})
		}
		return ts
	},
	families: func(w *promtext.Writer, d *DeviceMetrics) {
		ns := d.Nets
		name := func(n NetMetrics) string { return n.Name }
		c := func(family, help string, f func(NetMetrics) uint64) { counter(w, family, help, ns, name, f) }
		c("microvm_net_tx_frames_total", "Frames the guest sent to the TAP.", func(n NetMetrics) uint64 { return n.TxFrames })
		c("microvm_net_rx_frames_total", "Frames from the TAP delivered to the guest.", func(n NetMetrics) uint64 { return n.RxFrames })
		c("microvm_net_tx_bytes_total", "Bytes of the frames counted in microvm_net_tx_frames_total (virtio-net headers excluded).", func(n NetMetrics) uint64 { return n.TxBytes })
		c("microvm_net_rx_bytes_total", "Bytes of the frames counted in microvm_net_rx_frames_total (virtio-net headers excluded).", func(n NetMetrics) uint64 { return n.RxBytes })
		c("microvm_net_tx_errors_total", "Guest TX chains with a bad header or length: dropped (guest errors).", func(n NetMetrics) uint64 { return n.TxErrors })
		c("microvm_net_tx_dropped_total", "Frames the TAP refused with an error other than EAGAIN.", func(n NetMetrics) uint64 { return n.TxDropped })
		c("microvm_net_tx_stalls_total", "Writes that found the TAP full (retried when it drains, not dropped).", func(n NetMetrics) uint64 { return n.TxStalls })
		c("microvm_net_rx_dropped_total", "TAP frames too large for any buffer the guest posted: dropped.", func(n NetMetrics) uint64 { return n.RxDropped })
		c("microvm_net_rx_errors_total", "TAP reads that failed or returned a runt.", func(n NetMetrics) uint64 { return n.RxErrors })
	},
	flags: []Flag{
		{Name: "net", Synopsis: "[--net user[,host-loopback][,egress=SPEC]|tap=NAME[,netns=PATH][,mac=M]]...",
			Usage: fmt.Sprintf("add a virtio-net device: user: on a user-mode network (NAT, DHCP, DNS; no root; guest %s; host-loopback: the host's 127.0.0.1 at %s, off by default; egress=SPEC limits the guest's destinations, SPEC %s; loopback, link-local and cloud metadata addresses are never reached); tap=NAME: on host TAP NAME (attached, or created with CAP_NET_ADMIN), in the network namespace at PATH if given; guest MAC M or a random one; repeatable, at most %d", usernetGuestIP, usernetHostIP, netpolicy.EgressSyntax, MaxNets),
			Set: func(c *Config, v string) error {
				n, err := ParseNet(v)
				if err != nil {
					return err
				}
				if len(c.Nets) == MaxNets {
					return fmt.Errorf("%w: --net: at most %d devices", ErrConfig, MaxNets)
				}
				c.Nets = append(c.Nets, n)
				return nil
			}},
		{Name: "publish", Synopsis: "[--publish [IP:]PORT:GUESTPORT[/udp]]...",
			Usage: "forward host port PORT (on IP, default 127.0.0.1) to the guest's GUESTPORT on the --net user device; tcp unless /udp; repeatable",
			Set: func(c *Config, v string) error {
				p, err := virtionet.ParsePublish(v)
				if err != nil {
					return fmt.Errorf("%w: --%w", ErrConfig, err)
				}
				c.pendingPublish = append(c.pendingPublish, p)
				return nil
			}},
	},
	finish: func(c *Config, _ func(string) bool) error {
		if len(c.pendingPublish) == 0 {
			return nil
		}
		for i := range c.Nets {
			if c.Nets[i].User {
				c.Nets[i].Publish = append(c.Nets[i].Publish, c.pendingPublish...)
				c.pendingPublish = nil
				return nil
			}
		}
		return fmt.Errorf("%w: --publish needs --net user", ErrConfig)
	},
}

// The user-mode network's addresses as the flags' help shows them
// (devices/virtionet/usernet, which the lean build does not link).
const (
	usernetGuestIP = "192.168.127.2"
	usernetHostIP  = "192.168.127.254"
)

// --- shared directories (virtio-9p) ---------------------------------------------

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
