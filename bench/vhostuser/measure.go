package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/microvm/microvm/bench/internal/vhufront"
)

// Directions and kinds of measurement.
const (
	h2g = "h2g" // host -> guest
	g2h = "g2h" // guest -> host

	kindTput = "tput" // a stream for -dur: bytes/s, msgs/s
	kindRTT  = "rtt"  // ping-pong of one message at a time: p50, p99
)

// sample is one measurement: one cell (direction, payload, kind) of one
// target in one pair.
type sample struct {
	Backend string `json:"backend"`
	Options string `json:"options"`
	Dir     string `json:"direction"`
	Payload int    `json:"payload"`
	Kind    string `json:"kind"`
	Pair    int    `json:"pair"`

	// Throughput: bytes the receiver got (equal to what the sender sent),
	// the window from the sender's first write to the receiver's end of
	// stream (CLOCK_MONOTONIC across the two processes).
	Bytes     int64   `json:"bytes,omitempty"`
	Msgs      int64   `json:"msgs,omitempty"`
	Seconds   float64 `json:"seconds,omitempty"`
	BytesPerS float64 `json:"bytes_per_s,omitempty"`
	MsgsPerS  float64 `json:"msgs_per_s,omitempty"`
	// Ping-pong.
	RTTs   int   `json:"rtts,omitempty"`
	RTTP50 int64 `json:"rtt_p50_ns,omitempty"`
	RTTP99 int64 `json:"rtt_p99_ns,omitempty"`

	// Through the rings (vsock only): payload bytes both ways, kicks we
	// made and interrupts the back-end signalled, per queue (rx, tx).
	RingBytes   uint64    `json:"ring_bytes,omitempty"`
	Kicks       [2]uint64 `json:"kicks,omitempty"`
	Irqs        [2]uint64 `json:"irqs,omitempty"`
	KicksPerMiB float64   `json:"kicks_per_mib,omitempty"`
	// BusyKicks: TX kicks made while the device still held earlier TX
	// packets (vhufront.Stats.BusyKicks), and per MiB.
	BusyKicks       uint64  `json:"tx_busy_kicks,omitempty"`
	BusyKicksPerMiB float64 `json:"tx_busy_kicks_per_mib,omitempty"`
	IrqsPerMiB      float64 `json:"irqs_per_mib,omitempty"`
	CreditRequests  uint64  `json:"credit_requests,omitempty"`
	// CPU time over the measurement: the back-end process (utime+stime,
	// 10 ms ticks), and this process (the guest driver, or the AF_UNIX
	// reference's receiving or echoing end).
	BackendCPU       float64 `json:"backend_cpu_s,omitempty"`
	BackendCPUPerMiB float64 `json:"backend_cpu_s_per_mib,omitempty"`
	// The back-end's syscalls (read- and write-like) and context switches
	// over the measurement, and per MiB (processSwitches).
	BackendSyscalls       uint64  `json:"backend_syscalls,omitempty"`
	BackendSwitches       uint64  `json:"backend_switches,omitempty"`
	BackendSyscallsPerMiB float64 `json:"backend_syscalls_per_mib,omitempty"`
	BackendSwitchesPerMiB float64 `json:"backend_switches_per_mib,omitempty"`
	GeneratorCPU          float64 `json:"generator_cpu_s,omitempty"`
	// The other two parties, the same way: the host side (the peer
	// process) and the guest side (this process: the guest driver, or
	// the AF_UNIX reference's own end), over the measurement and per MiB.
	Host, Guest         partyUsage `json:"-"`
	HostCPUPerMiB       float64    `json:"host_cpu_s_per_mib,omitempty"`
	HostSyscallsPerMiB  float64    `json:"host_syscalls_per_mib,omitempty"`
	HostSwitchesPerMiB  float64    `json:"host_switches_per_mib,omitempty"`
	GuestCPUPerMiB      float64    `json:"guest_cpu_s_per_mib,omitempty"`
	GuestSyscallsPerMiB float64    `json:"guest_syscalls_per_mib,omitempty"`
	GuestSwitchesPerMiB float64    `json:"guest_switches_per_mib,omitempty"`

	Err string `json:"error,omitempty"`
}

// partyUsage is what one process used: CPU time (utime+stime), its read-
// and write-like syscalls and its context switches (processSwitches).
type partyUsage struct {
	CPU      time.Duration
	Syscalls uint64
	Switches uint64
}

// readParty reads what process pid has used so far.
func readParty(pid int) (partyUsage, error) {
	cpu, err := processCPU(pid)
	if err != nil {
		return partyUsage{}, err
	}
	sys, sw, err := processSwitches(pid)
	return partyUsage{CPU: cpu, Syscalls: sys, Switches: sw}, err
}

// readParties reads what the host side (the peer process) and the guest
// side (this process) have used so far.
func (r *runner) readParties() (host, guest partyUsage, err error) {
	if host, err = readParty(r.peer.Pid()); err != nil {
		return host, guest, err
	}
	guest, err = readParty(os.Getpid())
	return host, guest, err
}

// since is what was used between b and u.
func (u partyUsage) since(b partyUsage) partyUsage {
	return partyUsage{CPU: u.CPU - b.CPU, Syscalls: u.Syscalls - b.Syscalls, Switches: u.Switches - b.Switches}
}

// setParties records the host's and the guest's usage and their costs per
// MiB moved.
func (s *sample) setParties(host, guest partyUsage, mib float64) {
	s.Host, s.Guest = host, guest
	if mib <= 0 {
		return
	}
	s.HostCPUPerMiB = host.CPU.Seconds() / mib
	s.HostSyscallsPerMiB = float64(host.Syscalls) / mib
	s.HostSwitchesPerMiB = float64(host.Switches) / mib
	s.GuestCPUPerMiB = guest.CPU.Seconds() / mib
	s.GuestSyscallsPerMiB = float64(guest.Syscalls) / mib
	s.GuestSwitchesPerMiB = float64(guest.Switches) / mib
}

// percentile returns the p-th percentile (0..100) of sorted values, the
// nearest-rank definition.
func percentile(sorted []int64, p float64) int64 {
	if len(sorted) == 0 {
		return 0
	}
	k := int(float64(len(sorted))*p/100+0.999999) - 1
	return sorted[max(0, min(k, len(sorted)-1))]
}

func (s *sample) setRTTs(rtts []int64) error {
	if len(rtts) == 0 {
		return errors.New("no round trip completed")
	}
	r := append([]int64(nil), rtts...)
	sort.Slice(r, func(i, j int) bool { return r[i] < r[j] })
	s.RTTs, s.RTTP50, s.RTTP99 = len(r), percentile(r, 50), percentile(r, 99)
	return nil
}

// setTransfer fills the throughput fields from the sender's and the
// receiver's view of one stream, which must agree on the bytes.
func (s *sample) setTransfer(sent, recv vhufront.Transfer) error {
	if sent.Bytes != recv.Bytes {
		return fmt.Errorf("sender sent %d bytes, receiver got %d", sent.Bytes, recv.Bytes)
	}
	if sent.Bytes == 0 {
		return errors.New("no bytes moved")
	}
	if recv.End <= sent.Start {
		return fmt.Errorf("receiver ended (%d ns) before the sender started (%d ns)", recv.End, sent.Start)
	}
	s.Bytes, s.Msgs = sent.Bytes, sent.Msgs
	s.Seconds = float64(recv.End-sent.Start) / 1e9
	s.BytesPerS = float64(s.Bytes) / s.Seconds
	s.MsgsPerS = float64(s.Bytes) / float64(s.Payload) / s.Seconds
	return nil
}

// cell is what one measurement asks the peer and the local side to do.
type cell struct {
	dir, kind string
	payload   int
}

// peerCmd is the peer's half of c: the host program. dial or listen is
// where it meets the local side; port, when not 0, is the guest port for
// the vsock CONNECT handshake.
func (r *runner) peerCmd(c cell, dial, listen string, port uint32) vhufront.PeerCmd {
	cmd := vhufront.PeerCmd{Dial: dial, Listen: listen, Port: port, Payload: c.payload, Timeout: r.timeout}
	switch c.dir + c.kind {
	case h2g + kindTput:
		cmd.Role, cmd.Duration = vhufront.RoleSource, r.dur
	case g2h + kindTput:
		cmd.Role, cmd.Duration = vhufront.RoleSink, r.dur
	case h2g + kindRTT:
		cmd.Role, cmd.Duration, cmd.MaxMsgs = vhufront.RolePing, r.rttDur, r.rttMax
	case g2h + kindRTT:
		cmd.Role, cmd.Duration = vhufront.RoleEcho, r.rttDur
	}
	return cmd
}

// vsockCell measures c through the guest driver g on back-end be. port is
// fresh: the guest listens on it (host-initiated, h2g) or the peer listens
// on <uds>_<port> (guest-initiated, g2h).
func (r *runner) vsockCell(g *vhufront.Guest, be *backendProc, c cell, port uint32) (sample, error) {
	s := sample{Dir: c.dir, Payload: c.payload, Kind: c.kind}
	pid := be.cmd.Process.Pid
	st0 := g.Stats()
	cpu0, err := processCPU(pid)
	if err != nil {
		return s, err
	}
	sys0, sw0, err := processSwitches(pid)
	if err != nil {
		return s, err
	}
	self0, _ := processCPU(os.Getpid())
	host0, guest0, err := r.readParties()
	if err != nil {
		return s, err
	}
	var cmd vhufront.PeerCmd
	if c.dir == h2g {
		cmd = r.peerCmd(c, be.uds, "", port)
	} else {
		cmd = r.peerCmd(c, "", fmt.Sprintf("%s_%d", be.uds, port), 0)
	}
	if err := r.peer.Begin(cmd); err != nil {
		return s, err
	}
	deadline := time.Now().Add(max(r.dur, r.rttDur) + r.timeout)
	var local vhufront.Transfer
	var rtts []int64
	switch c.dir + c.kind {
	case h2g + kindTput:
		local, err = g.Sink(port, deadline)
	case g2h + kindTput:
		local, err = g.Source(port, c.payload, r.dur, deadline)
	case h2g + kindRTT:
		err = g.Echo(port, deadline)
	case g2h + kindRTT:
		rtts, err = g.Ping(port, c.payload, r.rttDur, r.rttMax, deadline)
	}
	if err != nil {
		return s, fmt.Errorf("guest: %w%s", err, r.peerSide())
	}
	res, err := r.peer.End(max(r.dur, r.rttDur) + r.timeout)
	if err != nil {
		return s, err
	}
	cpu1, err := processCPU(pid)
	if err != nil {
		return s, err
	}
	sys1, sw1, err := processSwitches(pid)
	if err != nil {
		return s, err
	}
	self1, _ := processCPU(os.Getpid())
	host1, guest1, err := r.readParties()
	if err != nil {
		return s, err
	}
	st1 := g.Stats()
	if err := r.fill(&s, c, local, res, rtts); err != nil {
		return s, err
	}
	s.RingBytes = st1.RxBytes + st1.TxBytes - st0.RxBytes - st0.TxBytes
	mib := float64(s.RingBytes) / (1 << 20)
	for q := range 2 {
		s.Kicks[q] = st1.Kicks[q] - st0.Kicks[q]
		s.Irqs[q] = st1.Irqs[q] - st0.Irqs[q]
	}
	s.BusyKicks = st1.BusyKicks - st0.BusyKicks
	s.CreditRequests = st1.CreditReqs - st0.CreditReqs
	s.BackendCPU = (cpu1 - cpu0).Seconds()
	s.BackendSyscalls, s.BackendSwitches = sys1-sys0, sw1-sw0
	s.GeneratorCPU = (self1 - self0).Seconds()
	if mib > 0 {
		s.KicksPerMiB = float64(s.Kicks[0]+s.Kicks[1]) / mib
		s.BusyKicksPerMiB = float64(s.BusyKicks) / mib
		s.IrqsPerMiB = float64(s.Irqs[0]+s.Irqs[1]) / mib
		s.BackendCPUPerMiB = s.BackendCPU / mib
		s.BackendSyscallsPerMiB = float64(s.BackendSyscalls) / mib
		s.BackendSwitchesPerMiB = float64(s.BackendSwitches) / mib
	}
	s.setParties(host1.since(host0), guest1.since(guest0), mib)
	return s, nil
}

// peerSide is what the peer reports after the local side of a measurement
// failed, often the cause (a host side that found a bad byte closes its
// socket, and the device resets the connection). A peer still waiting
// stays busy and is stopped by the caller.
func (r *runner) peerSide() string {
	_, err := r.peer.End(2 * time.Second)
	if err == nil {
		return "; the peer saw no error"
	}
	return "; " + err.Error()
}

// fill checks and records what both sides saw.
func (r *runner) fill(s *sample, c cell, local vhufront.Transfer, res vhufront.PeerReply, rtts []int64) error {
	switch c.dir + c.kind {
	case h2g + kindTput, g2h + kindTput:
		if res.Transfer == nil {
			return errors.New("peer reported no transfer")
		}
		if c.dir == h2g {
			return s.setTransfer(*res.Transfer, local)
		}
		return s.setTransfer(local, *res.Transfer)
	case h2g + kindRTT:
		return s.setRTTs(res.RTTs)
	default:
		return s.setRTTs(rtts)
	}
}

// unixCell measures c over a plain AF_UNIX stream between the peer and
// this process: the reference. This process plays the guest's part with
// the host-side code (64 KiB reads when receiving, as HostSink does).
func (r *runner) unixCell(c cell, seq uint32) (sample, error) {
	s := sample{Backend: "af_unix", Dir: c.dir, Payload: c.payload, Kind: c.kind}
	path := filepath.Join(r.tmp, fmt.Sprintf("af%d.sock", seq))
	self0, _ := processCPU(os.Getpid())
	host0, guest0, err := r.readParties()
	if err != nil {
		return s, err
	}
	var l *net.UnixListener
	var cmd vhufront.PeerCmd
	if c.dir == h2g {
		if l, err = vhufront.ListenUnix(path); err != nil {
			return s, err
		}
		defer l.Close()
		cmd = r.peerCmd(c, path, "", 0)
	} else {
		cmd = r.peerCmd(c, "", path, 0)
	}
	if err := r.peer.Begin(cmd); err != nil {
		return s, err
	}
	var conn *net.UnixConn
	if l != nil {
		conn, err = vhufront.AcceptOne(l, r.timeout)
	} else {
		conn, err = vhufront.DialUnix(path, r.timeout)
	}
	if err != nil {
		return s, err
	}
	var local vhufront.Transfer
	var rtts []int64
	switch c.dir + c.kind {
	case h2g + kindTput:
		local, err = vhufront.HostSink(conn, vhufront.MaxPayload, r.dur+r.timeout)
	case g2h + kindTput:
		local, err = vhufront.HostSource(conn, c.payload, r.dur, r.timeout)
	case h2g + kindRTT:
		err = vhufront.HostEcho(conn, r.rttDur+r.timeout)
	case g2h + kindRTT:
		rtts, err = vhufront.HostPing(conn, c.payload, r.rttDur, r.rttMax, r.timeout)
	}
	conn.Close()
	if err != nil {
		return s, fmt.Errorf("local side: %w%s", err, r.peerSide())
	}
	res, err := r.peer.End(max(r.dur, r.rttDur) + r.timeout)
	if err != nil {
		return s, err
	}
	self1, _ := processCPU(os.Getpid())
	host1, guest1, err := r.readParties()
	if err != nil {
		return s, err
	}
	s.GeneratorCPU = (self1 - self0).Seconds()
	if err := r.fill(&s, c, local, res, rtts); err != nil {
		return s, err
	}
	// Per MiB of the bytes that crossed the socket: a stream's, or both
	// ways of a ping-pong's, as the device rows count their rings.
	moved := float64(s.Bytes)
	if c.kind == kindRTT {
		moved = float64(2 * int64(s.RTTs) * int64(c.payload))
	}
	s.setParties(host1.since(host0), guest1.since(guest0), moved/(1<<20))
	return s, nil
}
