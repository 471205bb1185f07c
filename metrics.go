package microvm

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/microvm/microvm/devices/blk"
	"github.com/microvm/microvm/devices/rng"
	"github.com/microvm/microvm/devices/virtionet"
	"github.com/microvm/microvm/internal/metricsrv"
	"github.com/microvm/microvm/internal/promtext"
	"github.com/microvm/microvm/kvm"
	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/vsock"
)

// exitSlots is how many KVM exit reasons a vCPU counts apart; reasons from
// exitSlots-1 up share the last slot (KVM defines about 40 today).
const exitSlots = 64

// vcpuCounters are one vCPU's counters. Its goroutine (runVCPU) is the only
// writer: one atomic add per exit, the thread id when it starts, the
// thread's CPU time when it ends. Metrics reads them from any goroutine.
type vcpuCounters struct {
	exits [exitSlots]atomic.Uint64 // by kvm.ExitReason
	tid   atomic.Int32             // the vCPU's OS thread while runVCPU runs; 0 before
	ended atomic.Bool              // runVCPU returned; cpu is final
	cpu   atomic.Int64             // the thread's CPU time (ns) when runVCPU returned
}

// bind records the calling thread, locked to the vCPU's goroutine.
func (c *vcpuCounters) bind() { c.tid.Store(int32(gettid())) }

// unbind records the thread's final CPU time, before the thread exits with
// the goroutine (runVCPU never unlocks it).
func (c *vcpuCounters) unbind() {
	if d, err := selfCPUTime(); err == nil {
		c.cpu.Store(int64(d))
	}
	c.ended.Store(true)
}

// exit counts one KVM exit.
func (c *vcpuCounters) exit(r kvm.ExitReason) {
	c.exits[min(uint32(r), exitSlots-1)].Add(1)
}

// cpuTime is the CPU time of the vCPU's thread: guest time, KVM's time in
// the kernel for it and microvm's exit handling. While the vCPU runs it is
// read from the thread's CPU clock; once runVCPU returned, the value it
// recorded. A reading taken while ended was still false came from the
// vCPU's own thread (runVCPU sets ended before its thread can exit), so
// the value never goes down.
func (c *vcpuCounters) cpuTime() time.Duration {
	if c.ended.Load() {
		return time.Duration(c.cpu.Load())
	}
	tid := c.tid.Load()
	if tid == 0 {
		return 0 // not started
	}
	d, err := threadCPUTime(int(tid))
	if c.ended.Load() || err != nil {
		return time.Duration(c.cpu.Load())
	}
	return d
}

// Metrics is a snapshot of a machine's counters (Machine.Metrics). Counters
// only grow while the machine exists; docs/metrics.md names each with its
// Prometheus metric.
type Metrics struct {
	// VCPUs holds one entry per vCPU, in id order.
	VCPUs []VCPUMetrics
	// PIOUnclaimed and MMIOUnclaimed count guest port I/O and MMIO
	// accesses no device claimed (reads return all-ones, writes are
	// dropped; a Linux guest probes a few ports at boot).
	PIOUnclaimed, MMIOUnclaimed uint64
	// PVWaits counts the guest's waits on the paravirtual wait port
	// (docs/machine.md), PVWakeups those a device interrupt ended early.
	PVWaits, PVWakeups uint64
	// Vsock is the vsock device's (nil without one).
	Vsock *VsockMetrics
	// RNG is the rng device's (nil without one).
	RNG *RNGMetrics
	// Disks and Nets follow Config.Disks and Config.Nets.
	Disks []DiskMetrics
	Nets  []NetMetrics
}

// VCPUMetrics are one vCPU's counters.
type VCPUMetrics struct {
	ID int
	// Exits counts the exits KVM_RUN returned, by reason (only reasons
	// that occurred are present). kvm.ExitIntr includes every return
	// caused by a signal: a stop, and the Go runtime's preemption
	// signals. Reasons from 63 up are counted under 63.
	Exits map[kvm.ExitReason]uint64
	// CPUTime is the CPU time of the vCPU's thread: time in the guest,
	// in KVM for it, and in microvm handling its exits.
	CPUTime time.Duration
}

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

// VhostUserVsockMetrics are the counters of `microvm vhost-user-vsock`
// (its --metrics-socket): its vsock device's, and the vhost-user
// back-end's. The virtio transport is the front-end's VMM's, so
// Vsock.Transport stays zero and the transport's families are not
// written; the queues' are (the device counts them).
type VhostUserVsockMetrics struct {
	Vsock VsockMetrics
	// Frontends counts front-end connections accepted; FrontendErrors
	// those dropped for a protocol error; DeviceFailures the device
	// failures reported to a front-end (a broken ring: the device stops
	// until the front-end starts it again). vhostuser.Backend.Stats.
	Frontends, FrontendErrors, DeviceFailures uint64
}

// WritePrometheus writes m in the Prometheus text exposition format,
// version 0.0.4: the virtio queue families, the vsock families and the
// vhost-user ones (docs/metrics.md).
func (m VhostUserVsockMetrics) WritePrometheus(out io.Writer) error {
	w := promtext.NewWriter(out)
	writeVirtio(w, []transport{m.Vsock.transport()}, false)
	Metrics{Vsock: &m.Vsock}.writeVsock(w)
	w.Family("microvm_vhost_user_frontends_total", promtext.Counter, "Front-end connections accepted.")
	w.Uint(m.Frontends)
	w.Family("microvm_vhost_user_frontend_errors_total", promtext.Counter, "Front-end connections dropped for a vhost-user protocol error.")
	w.Uint(m.FrontendErrors)
	w.Family("microvm_vhost_user_device_failures_total", promtext.Counter, "Device failures reported to the front-end (a broken ring: the device stops until restarted).")
	w.Uint(m.DeviceFailures)
	return w.Flush()
}

// RNGMetrics are the rng device's counters.
type RNGMetrics struct {
	Name      string // "rng0"
	Transport virtio.TransportStats
	rng.Stats
}

// DiskMetrics are one disk's counters.
type DiskMetrics struct {
	Name      string // "vda", "vdb", ...: what the guest calls it
	Path      string // the image (DiskConfig.Path)
	Transport virtio.TransportStats
	blk.Stats
}

// NetMetrics are one network device's counters.
type NetMetrics struct {
	Name      string // "eth0", "eth1", ...: what a Linux guest calls it
	TAP       string // the host TAP interface (NetConfig.TAP)
	Transport virtio.TransportStats
	virtionet.Stats
}

// Metrics returns a snapshot of the machine's counters. Any goroutine may
// call it at any time after New returned, while the machine runs and after
// Close (the counters then stay as they ended). Each counter is read
// atomically; the snapshot as a whole is not one instant.
func (m *Machine) Metrics() Metrics {
	out := Metrics{PIOUnclaimed: m.pio.Unclaimed(), MMIOUnclaimed: m.mmio.Unclaimed()}
	out.PVWaits, out.PVWakeups = m.pvwait.Stats()
	for i, c := range m.vcpuCtrs {
		v := VCPUMetrics{ID: i, Exits: map[kvm.ExitReason]uint64{}, CPUTime: c.cpuTime()}
		for r := range c.exits {
			if n := c.exits[r].Load(); n > 0 {
				v.Exits[kvm.ExitReason(r)] = n
			}
		}
		out.VCPUs = append(out.VCPUs, v)
	}
	if m.vsock != nil {
		out.Vsock = &VsockMetrics{Name: "vsock0", Dgram: m.cfg.Vsock.Dgram,
			Transport: m.vsockMMIO.Stats(), Stats: m.vsock.Stats()}
	}
	if m.rng != nil {
		out.RNG = &RNGMetrics{Name: "rng0", Transport: m.rngMMIO.Stats(), Stats: m.rng.Stats()}
	}
	for i, d := range m.disks {
		out.Disks = append(out.Disks, DiskMetrics{Name: strings.TrimPrefix(diskName(i), "/dev/"),
			Path: m.cfg.Disks[i].Path, Transport: m.diskMMIO[i].Stats(), Stats: d.Stats()})
	}
	for i, n := range m.nets {
		out.Nets = append(out.Nets, NetMetrics{Name: fmt.Sprintf("eth%d", i), TAP: m.cfg.Nets[i].TAP,
			Transport: m.netMMIO[i].Stats(), Stats: n.Stats()})
	}
	return out
}

// MetricsHandler serves GET (and HEAD) requests with Metrics in the
// Prometheus text exposition format, version 0.0.4, for an embedder's own
// HTTP server (Config.MetricsSocket serves it at /metrics).
func (m *Machine) MetricsHandler() http.Handler {
	return metricsrv.Handler(func(w io.Writer) error { return m.Metrics().WritePrometheus(w) })
}

// exitLabels are the exit reasons every vCPU reports, zero or not, so a
// rate can be taken from the first scrape on; others appear once seen.
var exitLabels = []kvm.ExitReason{kvm.ExitIO, kvm.ExitMMIO, kvm.ExitHLT, kvm.ExitIntr, kvm.ExitShutdown,
	kvm.ExitSystemEvent, kvm.ExitIRQWindowOpen, kvm.ExitInternalError, kvm.ExitFailEntry}

// exitLabel names an exit reason as the reason label does: the
// KVM_EXIT_ name in lower case ("io", "irq_window_open"), "other" for the
// shared last slot.
func exitLabel(r kvm.ExitReason) string {
	if r >= exitSlots-1 {
		return "other"
	}
	return strings.ToLower(strings.TrimPrefix(r.String(), "KVM_EXIT_"))
}

// WritePrometheus writes m in the Prometheus text exposition format,
// version 0.0.4: every family docs/metrics.md lists, the VM's first, then
// the virtio transports', then each device type's (a type's families only
// when the machine has such a device).
func (m Metrics) WritePrometheus(out io.Writer) error {
	w := promtext.NewWriter(out)
	m.writeVM(w)
	m.writeVirtio(w)
	m.writeVsock(w)
	m.writeBlk(w)
	m.writeNet(w)
	m.writeRNG(w)
	return w.Flush()
}

// counter writes a family of one sample per device.
func counter[T any](w *promtext.Writer, name, help string, devs []T, label func(T) string, v func(T) uint64) {
	if len(devs) == 0 {
		return
	}
	w.Family(name, promtext.Counter, help)
	for _, d := range devs {
		w.Uint(v(d), "device", label(d))
	}
}

func (m Metrics) writeVM(w *promtext.Writer) {
	w.Family("microvm_vcpu_exits_total", promtext.Counter,
		"Exits from KVM_RUN to microvm, by vCPU and KVM exit reason (intr includes signals: stops and Go runtime preemption).")
	for _, v := range m.VCPUs {
		id := strconv.Itoa(v.ID)
		seen := map[kvm.ExitReason]bool{}
		for _, r := range exitLabels {
			seen[r] = true
			w.Uint(v.Exits[r], "vcpu", id, "reason", exitLabel(r))
		}
		for r := kvm.ExitReason(0); r < exitSlots; r++ {
			if n, ok := v.Exits[r]; ok && !seen[r] {
				w.Uint(n, "vcpu", id, "reason", exitLabel(r))
			}
		}
	}
	w.Family("microvm_vcpu_cpu_seconds_total", promtext.Counter,
		"CPU time of the vCPU's thread: in the guest, in KVM for it, and in microvm handling its exits.")
	for _, v := range m.VCPUs {
		w.Float(v.CPUTime.Seconds(), "vcpu", strconv.Itoa(v.ID))
	}
	w.Family("microvm_bus_unclaimed_accesses_total", promtext.Counter,
		"Guest port I/O and MMIO accesses no device claimed (reads return all-ones).")
	w.Uint(m.PIOUnclaimed, "bus", "pio")
	w.Uint(m.MMIOUnclaimed, "bus", "mmio")
	w.Family("microvm_pvwait_waits_total", promtext.Counter, "Guest waits on the paravirtual wait port.")
	w.Uint(m.PVWaits)
	w.Family("microvm_pvwait_wakeups_total", promtext.Counter, "Paravirtual waits a device interrupt ended before their timeout.")
	w.Uint(m.PVWakeups)
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

func (m Metrics) transports() []transport {
	var ts []transport
	if v := m.Vsock; v != nil {
		ts = append(ts, v.transport())
	}
	if r := m.RNG; r != nil {
		ts = append(ts, transport{name: r.Name, stats: r.Transport, kicks: []queueCount{{"request", r.Kicks}}})
	}
	for _, d := range m.Disks {
		ts = append(ts, transport{name: d.Name, stats: d.Transport, kicks: []queueCount{{"request", d.Kicks}}})
	}
	for _, n := range m.Nets {
		ts = append(ts, transport{name: n.Name, stats: n.Transport,
			kicks: []queueCount{{"rx", n.RxKicks}, {"tx", n.TxKicks}},
			full:  []queueCount{{"rx", n.RxStalls}}})
	}
	return ts
}

func (m Metrics) writeVirtio(w *promtext.Writer) {
	writeVirtio(w, m.transports(), true)
}

// writeVirtio writes the virtio families of ts: the queues' (kicks,
// queue full), which the devices count, and, when mmio says the devices
// sit on microvm's virtio-mmio transport, the transport's.
func writeVirtio(w *promtext.Writer, ts []transport, mmio bool) {
	if len(ts) == 0 {
		return
	}
	if mmio {
		w.Family("microvm_virtio_interrupts_total", promtext.Counter,
			"Interrupts the device raised (irqfd signals), by kind: used_buffer or config (sent with DEVICE_NEEDS_RESET).")
		for _, t := range ts {
			w.Uint(t.stats.UsedBufferInterrupts, "device", t.name, "kind", "used_buffer")
			w.Uint(t.stats.ConfigInterrupts, "device", t.name, "kind", "config")
		}
	}
	w.Family("microvm_virtio_kicks_total", promtext.Counter,
		"Queue notifications from the guest driver that the device's workers observed, by queue.")
	for _, t := range ts {
		for _, k := range t.kicks {
			w.Uint(k.n, "device", t.name, "queue", k.queue)
		}
	}
	w.Family("microvm_virtio_queue_full_total", promtext.Counter,
		"Times the device had data for the guest but found no free buffer in the queue (it then waits for a kick).")
	for _, t := range ts {
		for _, k := range t.full {
			w.Uint(k.n, "device", t.name, "queue", k.queue)
		}
	}
	if !mmio {
		return
	}
	w.Family("microvm_virtio_guest_errors_total", promtext.Counter,
		"Driver errors the virtio-mmio transport saw, by kind (register, features, queue, status, device); each was logged.")
	for _, t := range ts {
		for k := virtio.GuestErrorKind(0); k < virtio.NumGuestErrorKinds; k++ {
			w.Uint(t.stats.GuestErrors[k], "device", t.name, "kind", k.String())
		}
	}
	counter(w, "microvm_virtio_activations_total", "Times the driver started the device (DRIVER_OK).",
		ts, func(t transport) string { return t.name }, func(t transport) uint64 { return t.stats.Activations })
	counter(w, "microvm_virtio_driver_resets_total", "Times the driver reset the device (status 0).",
		ts, func(t transport) string { return t.name }, func(t transport) uint64 { return t.stats.DriverResets })
}

func (m Metrics) writeVsock(w *promtext.Writer) {
	if m.Vsock == nil {
		return
	}
	v := []*VsockMetrics{m.Vsock}
	name := func(v *VsockMetrics) string { return v.Name }
	c := func(family, help string, f func(*VsockMetrics) uint64) { counter(w, family, help, v, name, f) }
	s := m.Vsock
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
	w.Family("microvm_vsock_guest_errors_total", promtext.Counter,
		"Malformed packets and protocol violations by the guest, by kind (header, address, type, length, op, credit, queue).")
	for k := vsock.GuestErrorKind(0); k < vsock.NumGuestErrorKinds; k++ {
		w.Uint(s.GuestErrorsByKind[k], "device", s.Name, "kind", k.String())
	}
	c("microvm_vsock_host_write_stalls_total", "Writes to host sockets that took only part of the data (the rest is buffered).", func(v *VsockMetrics) uint64 { return v.HostWriteStalls })
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
}

func (m Metrics) writeBlk(w *promtext.Writer) {
	ds := m.Disks
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
		for k := blk.GuestErrorKind(0); k < blk.NumGuestErrorKinds; k++ {
			w.Uint(d.GuestErrorsByKind[k], "device", d.Name, "kind", k.String())
		}
	}
	w.Family("microvm_blk_max_in_flight", promtext.Gauge, "Most requests seen in flight at once.")
	for _, d := range ds {
		w.Uint(d.MaxInFlight, "device", d.Name)
	}
}

func (m Metrics) writeNet(w *promtext.Writer) {
	ns := m.Nets
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
}

func (m Metrics) writeRNG(w *promtext.Writer) {
	if m.RNG == nil {
		return
	}
	rs := []*RNGMetrics{m.RNG}
	name := func(r *RNGMetrics) string { return r.Name }
	c := func(family, help string, f func(*RNGMetrics) uint64) { counter(w, family, help, rs, name, f) }
	c("microvm_rng_requests_total", "Entropy requests returned to the guest.", func(r *RNGMetrics) uint64 { return r.Requests })
	c("microvm_rng_bytes_total", "Random bytes written to guest memory.", func(r *RNGMetrics) uint64 { return r.Bytes })
	c("microvm_rng_throttled_total", "Times the device waited for its rate limit (--rng-rate).", func(r *RNGMetrics) uint64 { return r.Throttled })
	w.Family("microvm_rng_guest_errors_total", promtext.Counter,
		"Malformed request chains and queue errors, by kind (layout, queue); the device then needs a reset.")
	for k := rng.GuestErrorKind(0); k < rng.NumGuestErrorKinds; k++ {
		w.Uint(m.RNG.GuestErrorsByKind[k], "device", m.RNG.Name, "kind", k.String())
	}
}
