package microvm

// The vsock device kind: VsockConfig and its checks, how New builds the
// device and its Unix socket listener, and its counters (VsockMetrics, the
// microvm_vsock_* families). The in-process API over the device
// (DialVsock, ListenVsock) is vsock.go's.

import (
	"fmt"
	"time"

	"github.com/microvm/microvm/internal/promtext"
	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/vsock"
)

// vsockDevices is the vsock device's part of deviceSet.
type vsockDevices struct {
	vsock       *vsock.Device
	vsockMMIO   *virtio.MMIO
	uds         *vsock.UDS
	vsockRouter *vsockRouter // the device's Dialer: ListenVsock listeners, else uds_<port>
}

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

// The vsock device's command-line flags are the CLI's own
// (internal/clibase): `run` and `vhost-user-vsock` share them under two sets
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

// VsockStats returns the vsock device's counters (zero without one).
func (m *Machine) VsockStats() vsock.Stats {
	if m.vsock == nil {
		return vsock.Stats{}
	}
	return m.vsock.Stats()
}
