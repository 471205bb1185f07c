package microvm

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/microvm/microvm/internal/promtext"
	"github.com/microvm/microvm/internal/vmm"
	"github.com/microvm/microvm/kvm"
	"github.com/microvm/microvm/virtio"
)

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
	// DeviceMetrics holds each virtio device's counters, by kind.
	DeviceMetrics
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
	writeVsockFamilies(w, &m.Vsock)
	w.Family("microvm_vhost_user_frontends_total", promtext.Counter, "Front-end connections accepted.")
	w.Uint(m.Frontends)
	w.Family("microvm_vhost_user_frontend_errors_total", promtext.Counter, "Front-end connections dropped for a vhost-user protocol error.")
	w.Uint(m.FrontendErrors)
	w.Family("microvm_vhost_user_device_failures_total", promtext.Counter, "Device failures reported to the front-end (a broken ring: the device stops until restarted).")
	w.Uint(m.DeviceFailures)
	return w.Flush()
}

// Metrics returns a snapshot of the machine's counters. Any goroutine may
// call it at any time after New returned, while the machine runs and after
// Close (the counters then stay as they ended). Each counter is read
// atomically; the snapshot as a whole is not one instant.
func (m *Machine) Metrics() Metrics {
	vm := m.vm.Metrics()
	out := Metrics{PIOUnclaimed: vm.PIOUnclaimed, MMIOUnclaimed: vm.MMIOUnclaimed,
		PVWaits: vm.PVWaits, PVWakeups: vm.PVWakeups}
	for _, v := range vm.VCPUs {
		out.VCPUs = append(out.VCPUs, VCPUMetrics(v))
	}
	for _, k := range deviceKinds {
		k.metrics(m, &out.DeviceMetrics)
	}
	return out
}

// MetricsContentType is the HTTP Content-Type of WritePrometheus's output.
// An embedder serving metrics from its own HTTP server sets it and writes
// a snapshot:
//
//	w.Header().Set("Content-Type", microvm.MetricsContentType)
//	m.Metrics().WritePrometheus(w)
//
// (Config.MetricsSocket serves the same at /metrics.)
const MetricsContentType = promtext.ContentType

// writeMetrics writes a snapshot for the metrics server.
func (m *Machine) writeMetrics(w io.Writer) error { return m.Metrics().WritePrometheus(w) }

// exitLabels are the exit reasons every vCPU reports, zero or not, so a
// rate can be taken from the first scrape on; others appear once seen.
var exitLabels = []kvm.ExitReason{kvm.ExitIO, kvm.ExitMMIO, kvm.ExitHLT, kvm.ExitIntr, kvm.ExitShutdown,
	kvm.ExitSystemEvent, kvm.ExitIRQWindowOpen, kvm.ExitInternalError, kvm.ExitFailEntry}

// exitLabel names an exit reason as the reason label does: the
// KVM_EXIT_ name in lower case ("io", "irq_window_open"), "other" for the
// shared last slot.
func exitLabel(r kvm.ExitReason) string {
	if r >= vmm.ExitSlots-1 {
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
	var ts []transport
	for _, k := range deviceKinds {
		ts = append(ts, k.transports(&m.DeviceMetrics)...)
	}
	writeVirtio(w, ts, true)
	for _, k := range deviceKinds {
		k.families(w, &m.DeviceMetrics)
	}
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
		for r := kvm.ExitReason(0); r < vmm.ExitSlots; r++ {
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
		writeGuestErrorSamples(w, t.name, virtio.TransportGuestErrorKinds, t.stats.GuestErrors)
	}
	counter(w, "microvm_virtio_activations_total", "Times the driver started the device (DRIVER_OK).",
		ts, func(t transport) string { return t.name }, func(t transport) uint64 { return t.stats.Activations })
	counter(w, "microvm_virtio_driver_resets_total", "Times the driver reset the device (status 0).",
		ts, func(t transport) string { return t.name }, func(t transport) uint64 { return t.stats.DriverResets })
	counter(w, "microvm_virtio_notify_exits_total",
		"Queue notifications that reached microvm as register writes (a vCPU exit each), not through an ioeventfd.",
		ts, func(t transport) string { return t.name }, func(t transport) uint64 { return t.stats.NotifyExits })
}

// writeGuestErrors writes a guest-error family of one device: a sample
// for each of the kinds the device reports.
func writeGuestErrors(w *promtext.Writer, family, help, device string, kinds []virtio.GuestErrorKind, c virtio.GuestErrorCounts) {
	w.Family(family, promtext.Counter, help)
	writeGuestErrorSamples(w, device, kinds, c)
}

// writeGuestErrorSamples writes one device's samples of a guest-error
// family.
func writeGuestErrorSamples(w *promtext.Writer, device string, kinds []virtio.GuestErrorKind, c virtio.GuestErrorCounts) {
	for _, k := range kinds {
		w.Uint(c[k], "device", device, "kind", k.String())
	}
}

// Inspect describes the machine's virtio devices as they stand: each
// transport's status, unacknowledged interrupt bits and ring indices
// (virtio.TransportState), and each vsock connection's state and credit
// counters (vsock.ConnInfo). It is for an operator asking why a device or a
// connection stalled (the CLI logs it on SIGUSR1, docs/debugging.md): it
// never stops the guest or a device. Safe from any goroutine while the
// machine runs.
func (m *Machine) Inspect() string {
	var b strings.Builder
	for _, t := range m.namedTransports() {
		fmt.Fprintf(&b, "%s: %s\n", t.name, t.mmio.Inspect())
	}
	if m.vsock != nil {
		conns := m.vsock.Connections()
		fmt.Fprintf(&b, "vsock: %d connections\n", len(conns))
		for _, c := range conns {
			fmt.Fprintf(&b, "  %s\n", c)
		}
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// DeviceStatuses is one line with each virtio device's status byte as its
// driver last wrote it, in slot order: "vsock=0xf rng=0xf disk0=0x0". A
// device at 0x0 was never probed (the guest's driver did not reach it, or
// reset it); 0xf is running; bit 0x40 is NEEDS_RESET. With PeekVCPUs, it
// tells how far a guest that stopped answering got.
func (m *Machine) DeviceStatuses() string {
	var parts []string
	for _, t := range m.namedTransports() {
		parts = append(parts, fmt.Sprintf("%s=%#x", t.name, t.mmio.Inspect().Status))
	}
	return strings.Join(parts, " ")
}

// namedTransport is one virtio device's transport and the name Inspect
// gives it ("vsock", "rng", "disk0", "net1", "share0").
type namedTransport struct {
	name string
	mmio *virtio.MMIO
}

// namedTransports lists the machine's transports in slot order.
func (d *deviceSet) namedTransports() []namedTransport {
	var out []namedTransport
	if d.vsockMMIO != nil {
		out = append(out, namedTransport{"vsock", d.vsockMMIO})
	}
	if d.rngMMIO != nil {
		out = append(out, namedTransport{"rng", d.rngMMIO})
	}
	for i, t := range d.diskMMIO {
		out = append(out, namedTransport{fmt.Sprintf("disk%d", i), t})
	}
	for i, t := range d.netMMIO {
		out = append(out, namedTransport{fmt.Sprintf("net%d", i), t})
	}
	for i, t := range d.shareMMIO {
		out = append(out, namedTransport{fmt.Sprintf("share%d", i), t})
	}
	return out
}
