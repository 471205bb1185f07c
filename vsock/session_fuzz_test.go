package vsock_test

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/vsocktest"
)

// The session fuzz targets drive one vsock device through whole sequences
// of guest (and host) actions over the in-process guest driver, and check
// the device's promises after every step. An input is three configuration
// bytes, then steps of three bytes (an opcode byte and two arguments; a
// hostile packet takes six more):
//
//	config 0  bit 0 KickSuppress, 1 DirectEnqueue, 2 BatchLock, 3 EVENT_IDX,
//	          4 indirect descriptors, 5 SEQPACKET negotiated,
//	          bits 6-7 descriptors per TX packet and RX buffer (1-3)
//	config 1  bits 0-1 queue size (16, 32, 64, 256), 2-3 ConnBuffer (4K,
//	          16K, 64K, 256K), 4-5 MaxBuffered (the default, or the
//	          reserve MaxConns x 4 KiB plus 0, 12K or 32K: no pool, or
//	          one small enough to run dry), 6 MaxConns 3 (else 8),
//	          7 64-byte RX buffers (else 4 KiB)
//	config 2  bit 0 small host socket buffers, 1 guest buffer 2 KiB (else
//	          256 KiB), 2 guest packets of 1 KiB (else 4 KiB)
//
//	op & 15   what (fz* constants below); op >> 4 picks a connection or
//	          a host end
//
// Guest connections run from guest ports 1024-1027 to host ports
// 5000-5003 (5003 refuses), so keys collide often. Time never decides
// anything: the connect timeout is an hour, and fzTimers fires the armed
// timers when the input says so. After each step the harness waits until
// the device is quiet (settle), so an input replays the same way.
//
// Checked after every step:
//   - the packet stream per connection (fzKeyState): no REQUEST for a live
//     connection, RESPONSE only to a REQUEST, nothing but RST for a
//     connection after its RST (or before it opened), nothing but RST
//     after SHUTDOWN(BOTH), no data after SHUTDOWN(SEND), one type;
//   - credit (honest connections): buf_alloc never shrinks, fwd_cnt never
//     goes back nor counts bytes never sent, and the guest's credit
//     buf_alloc - (tx_cnt - fwd_cnt) is never negative; the device never
//     sends more than the guest's credit (vsocktest.Conn);
//   - data: every byte the host reads is the guest's byte at that offset,
//     every SEQPACKET record one whole guest message, and the same host to
//     guest;
//   - memory: connections <= MaxConns, queued RSTs <= MaxConns+256, the
//     budget in use equals the sum of the connections' exposures and
//     stays <= MaxBuffered, no connection holds more guest bytes than its
//     exposure (vsock.Probe);
//   - an honest step (one a Linux guest could take) adds no GuestErrors;
//   - the device is serving or has called Fail with a virtio.ErrGuest,
//     and only after a hostile step (a too-small RX buffer may make it
//     fail later); it settles within fzSettleTimeout.
//
// At the end: every connection closed leaves the table empty and the
// budget at zero; a failed device comes back after a reset; a fresh
// connection each way carries data; no goroutine or descriptor is left.

// Opcodes (op & 15).
const (
	fzDial      = iota // guest REQUEST to host port 5000+(a1>>2&3) from 1024+(a1&3); a1&16 SEQPACKET
	fzAccept           // answer a pending device REQUEST: a1&1 refuse (RST), else RESPONSE
	fzWrite            // honest RW of (a1<<8|a2)%(4 packets)+1 bytes within the credit; SEQPACKET: a2&1 whole message, a2&2 EOR
	fzConsume          // the guest application reads (a1<<8|a2)+1 bytes, or one message
	fzCredit           // a1&1 CREDIT_REQUEST, else CREDIT_UPDATE; a1&2 grow buf_alloc by (a2+1)*256 first
	fzShutdown         // SHUTDOWN(a1%3+1)
	fzReset            // guest RST
	fzRaw              // a hostile packet: see raw
	fzOverrun          // RW of credit+1+a1 bytes (hostile)
	fzRX               // a1&3: 0 stop reposting RX buffers, 1 repost and refill, 2 post a2%8+1, 3 post one of a2%45 bytes (hostile)
	fzHostWrite        // host writes (a1<<8|a2)%32K+1 bytes or a record (FuzzHostPeer; FuzzTXRing: host reads)
	fzHostRead         // host reads (a1<<8|a2)+1 bytes or a record
	fzHostShut         // a1&3: 0 shutdown(SHUT_WR), 1 shutdown(SHUT_RD), 2-3 close
	fzConnect          // host CONNECT to guest port 1024+(a1&3), line form a1>>2&3, a2%48 bytes after it; a1&16 SEQPACKET
	fzTimers           // every armed connect/close timeout fires
	fzDevReset         // the driver resets the device and activates it again
)

const (
	fzGuestPort   = 1024
	fzHostPort    = 5000
	fzRefusedPort = fzHostPort + 3
	fzMaxSteps    = 48
	// fzSettleTimeout bounds every wait of the harness. Go's fuzzer kills
	// a worker whose execution takes 10 s ("deadlocked!", reported only
	// as a lost worker: golang/go#56238), so a device that hangs must be
	// caught well before that, with the harness's own message and the
	// device's probe. Settling takes milliseconds even on a loaded
	// 2-core machine (every corpus input runs in under 0.05 s).
	fzSettleTimeout = 4 * time.Second
	fzLongTimeout   = time.Hour
)

// fzKey is a connection as the packets name it: host port, guest port.
type fzKey struct{ host, guest uint32 }

func (k fzKey) String() string { return fmt.Sprintf("%d<->%d", k.host, k.guest) }

// fzKeyState is the checker's view of the device's packets for one key.
type fzKeyState struct {
	open bool // the device opened it (REQUEST or RESPONSE) and sent no RST since
	// guestInit: the open connection was opened by a RESPONSE (the guest
	// asked for it).
	guestInit bool
	reqOut    int    // guest REQUESTs not answered by a RESPONSE yet
	typ       uint16 // the open connection's type
	shut      uint32 // SHUTDOWN flags the device sent on the open connection
	// stale: the guest reset the connection in this step; what the device
	// had pushed before it saw the RST may still arrive until the step
	// settles.
	stale bool
	// wild: a hostile packet left the device's state for the key unknown;
	// anything goes until the device's next RST.
	wild bool
	// The credit last advertised on the open connection.
	haveCredit       bool
	bufAlloc, fwdCnt uint32
}

// fzMsg is a message or record of a pattern stream: n bytes from offset off.
type fzMsg struct{ off, n uint64 }

// fzInst is one connection the guest knows.
type fzInst struct {
	key      fzKey
	typ      uint16
	c        *vsocktest.Conn
	host     *fzHost
	seed     uint32
	hostInit bool
	// Guest -> host: the stream offset of the next byte, the SEQPACKET
	// message being sent (bytes so far, its offset), complete messages
	// not yet read by the host.
	sent    uint64
	msgOpen fzMsg
	msgs    []fzMsg
	// Host -> guest: bytes the guest application consumed.
	got uint64
	// creditTaint: the guest broke the credit rules on it (overrun), so
	// the credit checks are off; dataTaint: hostile payload, so the data
	// checks are off.
	creditTaint, dataTaint bool
	shutSent               uint32
}

// fzHost is the host end of a connection.
type fzHost struct {
	fd       int
	typ      uint16
	inst     *fzInst // nil until known
	hostInit bool
	port     uint32 // host-initiated: the guest port it asked for
	okLine   []byte
	ok       bool // host-initiated: the OK line was read
	seed     uint32
	sent     uint64  // host -> guest stream offset
	recs     []fzMsg // SEQPACKET records written, not yet read by the guest
	recv     uint64  // guest -> host bytes read
}

// fzDialer is the device's Dialer: a socketpair per dial, non-blocking on
// both ends, the host end kept for the harness. Host port fzRefusedPort
// refuses.
type fzDialer struct {
	small bool
	mu    sync.Mutex
	ends  []fzDialed
}

type fzDialed struct {
	key fzKey
	fd  int
	typ uint16
}

var errFzRefused = errors.New("refused")

func (d *fzDialer) Dial(guestPort, port uint32, _ time.Duration) (int, error) {
	return d.dial(guestPort, port, vsock.TypeStream)
}

func (d *fzDialer) DialSeqpacket(guestPort, port uint32, _ time.Duration) (int, error) {
	return d.dial(guestPort, port, vsock.TypeSeqpacket)
}

func (d *fzDialer) dial(guestPort, port uint32, typ uint16) (int, error) {
	if port == fzRefusedPort {
		return -1, errFzRefused
	}
	dev, host, err := fzSocketpair(typ, d.small)
	if err != nil {
		return -1, err
	}
	d.mu.Lock()
	d.ends = append(d.ends, fzDialed{fzKey{port, guestPort}, host, typ})
	d.mu.Unlock()
	return dev, nil
}

func (d *fzDialer) take() []fzDialed {
	d.mu.Lock()
	defer d.mu.Unlock()
	e := d.ends
	d.ends = nil
	return e
}

func fzSocketpair(typ uint16, small bool) (dev, host int, err error) {
	st := unix.SOCK_STREAM
	if typ == vsock.TypeSeqpacket {
		st = unix.SOCK_SEQPACKET
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, st|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return -1, -1, err
	}
	if small {
		for _, fd := range fds {
			_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4096)
			_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4096)
		}
	}
	return fds[0], fds[1], nil
}

// fzPat returns n bytes of pattern stream seed from offset off: a shifted,
// dropped or repeated byte shows.
func fzPat(seed uint32, off uint64, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		x := off + uint64(i)
		b[i] = byte(uint64(seed)*29 + x*131 + (x>>8)*7 + (x>>16)*13)
	}
	return b
}

// fzMachine is one fuzz input's device, guest and host.
type fzMachine struct {
	t        *testing.T
	hostOps  bool // FuzzHostPeer: the host writes, shuts down and connects
	cfg      vsock.Config
	gopts    vsocktest.Options
	maxPkt   int
	guestBuf uint32
	small    bool
	dev      *vsock.Device
	g        *vsocktest.Guest
	dial     *fzDialer

	keys     map[fzKey]*fzKeyState
	keyOrder []fzKey
	insts    []*fzInst // connections the guest knows, in creation order
	accepted map[fzKey]*fzInst
	hosts    []*fzHost // host ends, in creation order
	seed     uint32

	in       []byte // the rest of the input
	hostile  bool   // the current step broke the protocol on purpose
	poisoned bool   // a too-small RX buffer is posted: data to the guest fails the device
	step     int
	what     string // the current step, for messages
}

func newFzMachine(t *testing.T, in []byte, hostOps bool) *fzMachine {
	var c [3]byte
	in = in[copy(c[:], in):]
	opts := &vsock.Options{KickSuppress: c[0]&1 != 0, DirectEnqueue: c[0]&2 != 0, BatchLock: c[0]&4 != 0,
		ShortReadDrains: c[0]&8 != 0, ReadinessGate: c[0]&64 != 0, IRQCoalesce: c[2]&8 != 0} // SendBuffer stays off: it would undo the small socket buffers
	m := &fzMachine{t: t, hostOps: hostOps, in: in, keys: map[fzKey]*fzKeyState{}, accepted: map[fzKey]*fzInst{}}
	m.small = c[2]&1 != 0
	m.dial = &fzDialer{small: m.small}
	m.cfg = vsock.Config{
		CID:            vsocktest.DefaultCID,
		QueueSize:      []uint16{16, 32, 64, 256}[c[1]&3],
		ConnBuffer:     []uint32{4 << 10, 16 << 10, 64 << 10, 256 << 10}[c[1]>>2&3],
		MaxConns:       8,
		ConnectTimeout: fzLongTimeout,
		Options:        opts,
		Dialer:         m.dial,
		Log:            quietLog(),
	}
	if c[1]&64 != 0 {
		m.cfg.MaxConns = 3
	}
	if sel := c[1] >> 4 & 3; sel != 0 {
		// Every ConnBuffer here is at least the 4 KiB minimum window.
		m.cfg.MaxBuffered = uint64(m.cfg.MaxConns)*4096 + []uint64{0, 0, 12 << 10, 32 << 10}[sel]
	}
	split := 1 + int(c[0]>>6)%3
	m.guestBuf = vsocktest.DefaultGuestBuf
	if c[2]&2 != 0 {
		m.guestBuf = 2048
	}
	m.maxPkt = 4096
	if c[2]&4 != 0 {
		m.maxPkt = 1024
	}
	m.gopts = vsocktest.Options{
		QueueSize: m.cfg.QueueSize, EventIdx: c[0]&8 != 0, Indirect: c[0]&16 != 0,
		Seqpacket: c[0]&32 != 0, TxSplit: split, RxSplit: split, GuestBuf: m.guestBuf, SharedInterrupt: c[2]&16 != 0,
		Timeout: fzSettleTimeout, MemSize: 3 << 20,
	}
	if c[1]&128 != 0 {
		m.gopts.RxBufLen = vsock.HeaderSize + 64
	}
	return m
}

func (m *fzMachine) fatalf(format string, args ...any) {
	m.t.Helper()
	m.t.Fatalf("step %d (%s): %s", m.step, m.what, fmt.Sprintf(format, args...))
}

func (m *fzMachine) key(k fzKey) *fzKeyState {
	ks := m.keys[k]
	if ks == nil {
		ks = &fzKeyState{}
		m.keys[k] = ks
		m.keyOrder = append(m.keyOrder, k)
	}
	return ks
}

func (m *fzMachine) inst(k fzKey) *fzInst {
	for _, in := range m.insts {
		if in.key == k {
			return in
		}
	}
	return nil
}

func (m *fzMachine) nextSeed() uint32 {
	m.seed++
	return m.seed
}

// observe checks every packet the device sends, in ring order.
func (m *fzMachine) observe(p vsocktest.Packet) {
	h := &p.Hdr
	k := fzKey{h.SrcPort, h.DstPort}
	ks := m.key(k)
	if ks.wild || ks.stale {
		if h.Op == vsock.OpRst {
			ks.open, ks.shut, ks.haveCredit = false, 0, false
			ks.wild = false
		}
		return
	}
	switch h.Op {
	case vsock.OpRst:
		ks.open, ks.shut, ks.haveCredit = false, 0, false
		return
	case vsock.OpRequest:
		if ks.open {
			m.fatalf("device sent %v for %v, a connection it has open", h, k)
		}
		ks.open, ks.typ, ks.shut, ks.haveCredit = true, h.Type, 0, false
		ks.guestInit = false
	case vsock.OpResponse:
		if ks.open || ks.reqOut == 0 {
			m.fatalf("device sent %v for %v: open %v, guest REQUESTs unanswered %d", h, k, ks.open, ks.reqOut)
		}
		ks.reqOut--
		ks.open, ks.typ, ks.shut, ks.haveCredit = true, h.Type, 0, false
		ks.guestInit = true
	default:
		switch {
		case !ks.open:
			m.fatalf("device sent %v for %v, which it reset or never opened", h, k)
		case ks.shut == vsock.ShutdownBoth:
			m.fatalf("device sent %v for %v after SHUTDOWN(BOTH)", h, k)
		case h.Op == vsock.OpRW && ks.shut&vsock.ShutdownSend != 0:
			m.fatalf("device sent %v for %v after SHUTDOWN(SEND)", h, k)
		case h.Type != ks.typ:
			m.fatalf("device sent %v for %v, a connection of type %d", h, k, ks.typ)
		}
		if h.Op == vsock.OpShutdown {
			ks.shut |= h.Flags & vsock.ShutdownBoth
		}
	}
	// Credit, on connections the guest keeps honestly.
	in := m.inst(k)
	if in == nil || in.c == nil || in.creditTaint {
		return
	}
	if ks.haveCredit {
		if h.BufAlloc < ks.bufAlloc {
			m.fatalf("%v: buf_alloc shrank from %d (credit withdrawn)", h, ks.bufAlloc)
		}
		if int32(h.FwdCnt-ks.fwdCnt) < 0 {
			m.fatalf("%v: fwd_cnt went back from %d", h, ks.fwdCnt)
		}
	}
	ks.haveCredit, ks.bufAlloc, ks.fwdCnt = true, h.BufAlloc, h.FwdCnt
	if int32(in.c.TxCnt-h.FwdCnt) < 0 {
		m.fatalf("%v: fwd_cnt %d counts bytes the guest never sent (it sent %d)", h, h.FwdCnt, in.c.TxCnt)
	}
	if in.c.TxCnt-h.FwdCnt > h.BufAlloc {
		m.fatalf("%v: the guest's credit is negative: %d bytes in flight, buf_alloc %d", h, in.c.TxCnt-h.FwdCnt, h.BufAlloc)
	}
}

// settle polls the guest until the device is quiet: every TX chain
// returned, nothing in flight inside it (vsock.Probe.Idle), nothing new in
// the used rings. A device that failed stops using its rings, so settling
// ends there.
// fzYield lets the device's goroutines run while settle waits: a few
// Go-level yields, then sched_yield so that their threads get this CPU
// (on a busy machine a spinning harness otherwise delays every wake-up by
// a time slice; Go's timers are coarser still), then short sleeps.
func fzYield(i int) {
	switch {
	case i < 5:
		runtime.Gosched()
	case i < 2000:
		_, _, _ = unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
	default:
		_ = unix.Nanosleep(&unix.Timespec{Nsec: 50_000}, nil)
	}
}

func (m *fzMachine) settle() {
	m.t.Helper()
	deadline := time.Now().Add(fzSettleTimeout)
	quiet := 0
	for i := 0; ; i++ {
		if len(m.g.Fails()) > 0 {
			m.g.Poll()
			return
		}
		got := m.g.Poll()
		// Without EVENT_IDX the guest asks for every TX interrupt: a
		// device that held one back and never sent it does not settle.
		announced := m.gopts.EventIdx || m.g.UnannouncedTX() == 0
		if !got && m.g.TxInFlight() == 0 && announced && m.dev.Probe().Idle {
			// Idle three times, with a poll and a yield in between:
			// nothing was published after the first look, and a worker
			// that had just taken an event from epoll (Idle cannot see
			// that) has had its turn to run. Nothing checked depends on
			// this being exact (see serving); it keeps replays the same.
			if quiet++; quiet == 3 {
				return
			}
		} else {
			quiet = 0
		}
		if time.Now().After(deadline) {
			m.fatalf("the device did not settle within %v: %d TX chains out, %d TX completions unannounced, probe %+v",
				fzSettleTimeout, m.g.TxInFlight(), m.g.UnannouncedTX(), m.dev.Probe())
		}
		fzYield(i)
	}
}

// arg takes the next input byte (0 when the input is spent).
func (m *fzMachine) arg() byte {
	if len(m.in) == 0 {
		return 0
	}
	b := m.in[0]
	m.in = m.in[1:]
	return b
}

// pick returns the live connection sel chooses, or nil.
func (m *fzMachine) pick(sel byte) *fzInst {
	if len(m.insts) == 0 {
		return nil
	}
	return m.insts[int(sel)%len(m.insts)]
}

// honest returns the connection sel chooses if the guest can use it
// honestly: established, not reset, not poked by hostile packets.
func (m *fzMachine) honest(sel byte) *fzInst {
	in := m.pick(sel)
	if in == nil || in.c == nil || !in.c.Established || in.c.Rst || m.key(in.key).wild {
		return nil
	}
	return in
}

func (m *fzMachine) run() {
	t := m.t
	dev, err := vsock.New(m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	m.dev = dev
	m.g = vsocktest.New(t, m.dev, m.gopts)
	m.g.Observe = m.observe
	m.what = "activation"
	m.settle()
	failed := false
	for m.step = 1; m.step <= fzMaxSteps && len(m.in) >= 3; m.step++ {
		op, a1, a2 := m.arg(), m.arg(), m.arg()
		before := m.dev.Stats().GuestErrors
		m.hostile = false
		m.doStep(op, a1, a2)
		m.settle()
		m.endStep()
		if t.Failed() {
			t.FailNow()
		}
		if f := m.g.Fails(); len(f) > 0 {
			if !errors.Is(f[0], virtio.ErrGuest) {
				m.fatalf("the device failed with %v, not a guest error", f[0])
			}
			if !m.hostile && !m.poisoned {
				m.fatalf("the device failed after honest steps only: %v", f[0])
			}
			failed = true
			break
		}
		if after := m.dev.Stats().GuestErrors; after != before && !m.hostile {
			m.fatalf("an honest step counted %d guest errors", after-before)
		}
		m.checkProbe()
	}
	m.what = "the end"
	if failed || m.poisoned {
		// NEEDS_RESET: the driver resets the device, which must serve
		// again.
		m.devReset()
	}
	m.closeAll()
	m.serving()
	m.g.Reset()
	m.dev.Close()
	for _, h := range m.hosts {
		unix.Close(h.fd)
	}
	m.hosts = nil
}

// checkProbe checks the device's memory bounds and accounting.
func (m *fzMachine) checkProbe() {
	p := m.dev.Probe()
	lim := m.cfg.MaxBuffered
	if lim == 0 {
		lim = vsock.DefaultMaxBuffered
	}
	switch {
	case len(p.Problems) > 0:
		m.fatalf("connection invariants: %q", p.Problems)
	case p.Conns > m.cfg.MaxConns:
		m.fatalf("%d connections, MaxConns %d", p.Conns, m.cfg.MaxConns)
	case p.ClosedInTable > 0:
		m.fatalf("%d closed connections left in the table", p.ClosedInTable)
	case int64(p.Conns) != p.ConnsOpenStat:
		m.fatalf("%d connections in the table, Stats.ConnsOpen %d", p.Conns, p.ConnsOpenStat)
	case p.Rsts > m.cfg.MaxConns+256:
		m.fatalf("%d RSTs queued", p.Rsts)
	case p.BudgetUsed > lim || p.BudgetLimit != lim:
		m.fatalf("budget %d of %d in use (MaxBuffered %d)", p.BudgetUsed, p.BudgetLimit, lim)
	case p.BudgetUsed != p.Exposure:
		m.fatalf("budget in use %d, but the connections' exposures add up to %d", p.BudgetUsed, p.Exposure)
	case p.Buffered > lim:
		m.fatalf("%d guest bytes buffered, MaxBuffered %d", p.Buffered, lim)
	case p.Active && !p.Failed && p.Idle && p.RxOut != p.RxSpare:
		m.fatalf("the device popped %d RX buffers it did not return, but keeps %d on its spare list (probe %+v)",
			p.RxOut, p.RxSpare, p)
	}
}

func (m *fzMachine) doStep(op, a1, a2 byte) {
	sel := op >> 4
	n16 := int(a1)<<8 | int(a2)
	switch op & 15 {
	case fzDial:
		m.what = "dial"
		m.dialOp(fzKey{fzHostPort + uint32(a1>>2&3), fzGuestPort + uint32(a1&3)}, a1&16 != 0)
	case fzAccept:
		m.what = "accept"
		m.accept(sel, a1&1 != 0)
	case fzWrite:
		m.what = "write"
		m.write(sel, n16%(4*m.maxPkt)+1, a2)
	case fzConsume:
		m.what = "consume"
		m.consume(sel, n16+1)
	case fzCredit:
		m.what = "credit"
		if in := m.honest(sel); in != nil {
			if a1&2 != 0 && in.c.BufAlloc < 1<<20 {
				in.c.BufAlloc += (uint32(a2) + 1) * 256
			}
			if a1&1 != 0 {
				in.c.CreditRequest()
			} else {
				in.c.CreditUpdate()
			}
		}
	case fzShutdown:
		m.what = "shutdown"
		if in := m.honest(sel); in != nil {
			flags := uint32(a1%3) + 1
			in.c.Shutdown(flags)
			in.shutSent |= flags
			if flags&vsock.ShutdownSend != 0 {
				in.msgOpen = fzMsg{} // the device drops an unfinished message
			}
		}
	case fzReset:
		m.what = "guest RST"
		if in := m.pick(sel); in != nil && in.c != nil {
			in.c.Reset()
			m.key(in.key).stale = true
			m.drop(in)
		}
	case fzRaw:
		m.what = "hostile packet"
		m.raw(sel, a1, a2)
	case fzOverrun:
		m.what = "overrun"
		m.overrun(sel, a1)
	case fzRX:
		m.what = "rx buffers"
		switch a1 & 3 {
		case 0:
			m.g.AutoRepost = false
		case 1:
			m.g.AutoRepost = true
			m.g.PostRX(int(m.cfg.QueueSize))
		case 2:
			m.g.PostRX(int(a2%8) + 1)
		case 3:
			// A Linux driver never posts a buffer this small; the device
			// fails when it needs it for data, now or at the end.
			m.hostile, m.poisoned = true, true
			m.g.PostRXSized(1, uint32(a2)%(vsock.HeaderSize+1), 1)
		}
	case fzHostWrite:
		if !m.hostOps {
			m.what = "host read"
			m.hostRead(sel, 1<<20)
			return
		}
		m.what = "host write"
		m.hostWrite(sel, n16%(32<<10)+1)
	case fzHostRead:
		m.what = "host read"
		m.hostRead(sel, n16+1)
	case fzHostShut:
		if !m.hostOps {
			m.what = "host read"
			m.hostRead(sel, n16+1)
			return
		}
		m.what = "host shutdown"
		m.hostShut(sel, a1&3)
	case fzConnect:
		if !m.hostOps {
			m.what = "host read"
			m.hostRead(sel, 1<<20)
			return
		}
		m.what = "host CONNECT"
		m.connect(fzGuestPort+uint32(a1&3), a1>>2&3, int(a2%48), a1&16 != 0)
	case fzTimers:
		m.what = "timers"
		m.dev.FireTimers()
	case fzDevReset:
		m.what = "device reset"
		m.devReset()
	}
}

// dialOp sends a guest REQUEST; one for a connection the guest has open is
// hostile. The device resets that connection, or, if it had already reset
// it (an RST the guest has not read yet), opens a new one the guest never
// asked for honestly: either way the guest no longer knows the device's
// state for the key, as after raw.
func (m *fzMachine) dialOp(k fzKey, seq bool) {
	ks := m.key(k)
	if in := m.inst(k); in != nil {
		m.hostile = true
		in.c.Send(vsock.OpRequest, 0, nil)
		ks.reqOut++
		ks.wild = true
		in.creditTaint, in.dataTaint = true, true
		if in.host != nil {
			in.host.inst = nil
		}
		m.drop(in)
		return
	}
	if ks.wild {
		return
	}
	in := &fzInst{key: k, typ: vsock.TypeStream, seed: m.nextSeed()}
	if seq && m.gopts.Seqpacket {
		in.typ = vsock.TypeSeqpacket
		in.c = m.g.DialSeqpacket(k.host, k.guest)
	} else {
		in.c = m.g.Dial(k.host, k.guest)
	}
	in.c.MaxPacket = m.maxPkt
	ks.reqOut++
	m.insts = append(m.insts, in)
}

// accept answers a pending device REQUEST.
func (m *fzMachine) accept(sel byte, refuse bool) {
	var reqs []vsocktest.Packet
	for _, p := range m.g.Pending() {
		if p.Hdr.Op == vsock.OpRequest {
			reqs = append(reqs, p)
		}
	}
	if len(reqs) == 0 {
		return
	}
	want := reqs[int(sel)%len(reqs)].Hdr
	p := m.g.Expect("a pending REQUEST", func(h *vsock.Header) bool { return *h == want })
	k := fzKey{want.SrcPort, want.DstPort}
	if refuse || m.inst(k) != nil || m.key(k).wild {
		h := m.g.Header(vsock.OpRst, want.DstPort, want.SrcPort)
		h.Type = want.Type
		m.g.Send(h, nil)
		m.key(k).stale = true
		return
	}
	in := &fzInst{key: k, typ: want.Type, seed: m.nextSeed(), hostInit: true}
	in.c = m.g.AcceptPacket(p)
	in.c.MaxPacket = m.maxPkt
	m.insts = append(m.insts, in)
	m.accepted[k] = in
}

// write sends n honest bytes (as far as the credit goes).
func (m *fzMachine) write(sel byte, n int, a2 byte) {
	in := m.honest(sel)
	if in == nil || in.shutSent&vsock.ShutdownSend != 0 || in.c.Shut&vsock.ShutdownRcv != 0 {
		return
	}
	c := in.c
	n = min(n, int(c.Credit()))
	if n == 0 {
		return
	}
	if in.typ == vsock.TypeStream {
		sent := c.TryWrite(fzPat(in.seed, in.sent, n))
		in.sent += uint64(sent)
		return
	}
	// SEQPACKET: packets of at most MaxPacket bytes; the last carries
	// EOM when a2 asks for the end of the message.
	if in.msgOpen.n == 0 {
		in.msgOpen.off = in.sent
	}
	for left := n; left > 0; {
		k := min(left, c.MaxPacket)
		var flags uint32
		if k == left && a2&1 != 0 {
			flags = vsock.SeqEOM
			if a2&2 != 0 {
				flags |= vsock.SeqEOR
			}
		}
		c.Send(vsock.OpRW, flags, fzPat(in.seed, in.sent, k))
		in.sent += uint64(k)
		in.msgOpen.n += uint64(k)
		left -= k
	}
	if a2&1 != 0 {
		in.msgs = append(in.msgs, in.msgOpen)
		in.msgOpen = fzMsg{}
	}
}

// consume has the guest application read n bytes, or one message, and
// checks them against what the host wrote.
func (m *fzMachine) consume(sel byte, n int) {
	in := m.honest(sel)
	if in == nil {
		return
	}
	c := in.c
	h := in.host
	if in.typ == vsock.TypeSeqpacket {
		if c.Msgs() == 0 {
			return
		}
		msg := c.ReadMsg()
		if h == nil || in.dataTaint {
			return
		}
		if len(h.recs) == 0 {
			m.fatalf("%v: the guest got a %d-byte message the host never wrote", in.key, len(msg.Data))
		}
		r := h.recs[0]
		h.recs = h.recs[1:]
		if uint64(len(msg.Data)) != r.n || !bytes.Equal(msg.Data, fzPat(h.seed, r.off, int(r.n))) || !msg.EOR {
			m.fatalf("%v: the guest got a %d-byte message (EOR %v); the host wrote a %d-byte record", in.key, len(msg.Data), msg.EOR, r.n)
		}
		return
	}
	n = min(n, c.Buffered())
	if n == 0 {
		return
	}
	data := c.Consume(n)
	if h != nil && !in.dataTaint {
		if in.got+uint64(n) > h.sent {
			m.fatalf("%v: the guest read %d bytes; the host wrote %d", in.key, in.got+uint64(n), h.sent)
		}
		if !bytes.Equal(data, fzPat(h.seed, in.got, n)) {
			m.fatalf("%v: the guest read other bytes than the host wrote at offset %d", in.key, in.got)
		}
	}
	in.got += uint64(n)
}

// raw sends a hostile packet: a1 bits 0-2 op, 3-4 type (stream,
// SEQPACKET, 3, 0), 5 ports of a random key rather than a connection's,
// 6 len off by one, 7 len of 0x8000_0000; a2 payload bytes; then six more
// input bytes: flags, buf_alloc (two bytes, times 16), fwd_cnt delta (two
// bytes, signed), CID damage (bit 0 source, bit 1 destination).
func (m *fzMachine) raw(sel, a1, a2 byte) {
	m.hostile = true
	e := [6]byte{m.arg(), m.arg(), m.arg(), m.arg(), m.arg(), m.arg()}
	in := m.pick(sel)
	k := fzKey{fzHostPort + uint32(sel&3), fzGuestPort + uint32(sel>>2&3)}
	if in != nil && a1&32 == 0 {
		k = in.key
	}
	h := m.g.Header(vsock.Op(a1&7), k.guest, k.host)
	h.Type = []uint16{vsock.TypeStream, vsock.TypeSeqpacket, 3, 0}[a1>>3&3]
	h.Flags = uint32(e[0])
	h.BufAlloc = (uint32(e[1])<<8 | uint32(e[2])) * 16
	var txCnt uint32
	if in != nil && in.key == k && in.c != nil {
		txCnt = in.c.TxCnt
	}
	h.FwdCnt = txCnt + uint32(int32(int16(uint16(e[3])<<8|uint16(e[4]))))
	if e[5]&1 != 0 {
		h.SrcCID++
	}
	if e[5]&2 != 0 {
		h.DstCID = 7
	}
	payload := fzPat(0, 0, int(a2))
	h.Len = uint32(len(payload))
	if a1&64 != 0 {
		h.Len++
	}
	if a1&128 != 0 {
		h.Len = 0x8000_0000
	}
	m.g.Send(h, payload)
	ks := m.key(k)
	ks.wild = true
	if h.Op == vsock.OpRequest {
		ks.reqOut++
	}
	// The guest no longer knows what the device thinks of the connection.
	if in := m.inst(k); in != nil {
		in.creditTaint, in.dataTaint = true, true
		if in.host != nil {
			in.host.inst = nil
		}
		m.drop(in)
	}
}

// overrun sends one RW of credit+1+extra bytes: more than the device
// granted, as far as the guest knows (the device may have granted more
// without saying so yet, then it takes them).
func (m *fzMachine) overrun(sel, extra byte) {
	in := m.honest(sel)
	if in == nil || in.shutSent&vsock.ShutdownSend != 0 {
		return
	}
	n := int(in.c.Credit()) + 1 + int(extra)
	if n > vsock.MaxPacketPayload {
		return
	}
	m.hostile = true
	in.creditTaint = true
	if in.typ == vsock.TypeSeqpacket {
		in.dataTaint = true // the message model ignores this fragment
	}
	in.c.Send(vsock.OpRW, 0, fzPat(in.seed, in.sent, n))
	in.sent += uint64(n)
}

// drop forgets a connection on the guest side.
func (m *fzMachine) drop(in *fzInst) {
	if in.c != nil {
		in.c.Forget()
		in.c = nil
	}
	m.insts = slices.DeleteFunc(m.insts, func(x *fzInst) bool { return x == in })
}

func (m *fzMachine) pickHost(sel byte) *fzHost {
	if len(m.hosts) == 0 {
		return nil
	}
	return m.hosts[int(sel)%len(m.hosts)]
}

// hostWrite writes n pattern bytes, or a record of n bytes, without
// blocking.
func (m *fzMachine) hostWrite(sel byte, n int) {
	h := m.pickHost(sel)
	if h == nil {
		return
	}
	b := fzPat(h.seed, h.sent, n)
	w, err := unix.Write(h.fd, b)
	if err != nil || w <= 0 {
		return
	}
	if h.typ == vsock.TypeSeqpacket {
		h.recs = append(h.recs, fzMsg{h.sent, uint64(w)})
	}
	h.sent += uint64(w)
}

// hostRead reads up to n bytes (or one record) and checks them against
// what the guest sent.
func (m *fzMachine) hostRead(sel byte, n int) {
	h := m.pickHost(sel)
	if h == nil {
		return
	}
	m.readHost(h, n)
}

func (m *fzMachine) readHost(h *fzHost, n int) {
	if h.hostInit && !h.ok {
		m.readOK(h)
		if !h.ok {
			return
		}
	}
	// A SEQPACKET read takes one whole record (a longer one would be
	// truncated: the buffer is larger than any the device sends).
	buf := make([]byte, 256<<10)
	for n > 0 {
		b := buf
		if h.typ == vsock.TypeStream {
			b = buf[:min(n, len(buf))]
		}
		r, err := unix.Read(h.fd, b)
		if err == unix.EINTR {
			continue
		}
		if r <= 0 {
			return
		}
		m.hostGot(h, b[:r])
		n -= r
	}
}

// hostGot checks bytes the host read.
func (m *fzMachine) hostGot(h *fzHost, b []byte) {
	in := h.inst
	if in == nil || in.dataTaint {
		h.recv += uint64(len(b))
		return
	}
	if h.typ == vsock.TypeSeqpacket {
		if len(in.msgs) == 0 {
			m.fatalf("%v: the host got a %d-byte record the guest never finished", in.key, len(b))
		}
		msg := in.msgs[0]
		in.msgs = in.msgs[1:]
		if uint64(len(b)) != msg.n || !bytes.Equal(b, fzPat(in.seed, msg.off, len(b))) {
			m.fatalf("%v: the host got a %d-byte record; the guest sent a %d-byte message", in.key, len(b), msg.n)
		}
		return
	}
	if h.recv+uint64(len(b)) > in.sent {
		m.fatalf("%v: the host read %d bytes; the guest sent %d", in.key, h.recv+uint64(len(b)), in.sent)
	}
	if !bytes.Equal(b, fzPat(in.seed, h.recv, len(b))) {
		m.fatalf("%v: the host read other bytes than the guest sent at offset %d", in.key, h.recv)
	}
	h.recv += uint64(len(b))
}

// readOK reads a host-initiated connection's OK line (a record for
// SEQPACKET) and ties the host end to the guest's connection.
func (m *fzMachine) readOK(h *fzHost) {
	if h.typ == vsock.TypeSeqpacket {
		buf := make([]byte, 64)
		r, err := unix.Read(h.fd, buf)
		if err != nil || r <= 0 {
			return
		}
		h.okLine = buf[:r]
	} else {
		var b [1]byte
		for len(h.okLine) < 32 && (len(h.okLine) == 0 || h.okLine[len(h.okLine)-1] != '\n') {
			r, err := unix.Read(h.fd, b[:])
			if err != nil || r <= 0 {
				return
			}
			h.okLine = append(h.okLine, b[0])
		}
	}
	s, ok := bytes.CutPrefix(h.okLine, []byte("OK "))
	s, nl := bytes.CutSuffix(s, []byte("\n"))
	port, err := strconv.ParseUint(string(s), 10, 32)
	if !ok || !nl || err != nil || port < 1<<30 || port >= 1<<31 {
		m.fatalf("host end for guest port %d: %q is no OK line", h.port, h.okLine)
	}
	h.ok = true
	k := fzKey{uint32(port), h.port}
	in := m.accepted[k]
	if in == nil || in.typ != h.typ {
		m.fatalf("OK %d for %v, which the guest never accepted", port, k)
	}
	if in.host != nil {
		m.fatalf("OK for %v came twice", k)
	}
	in.host, h.inst = h, in
	if in.dataTaint {
		h.inst = nil
	}
}

// hostShut shuts down or closes a host end.
func (m *fzMachine) hostShut(sel, how byte) {
	h := m.pickHost(sel)
	if h == nil {
		return
	}
	switch how {
	case 0:
		_ = unix.Shutdown(h.fd, unix.SHUT_WR)
	case 1:
		_ = unix.Shutdown(h.fd, unix.SHUT_RD)
	default:
		unix.Close(h.fd)
		if h.inst != nil && h.inst.host == h {
			h.inst.host = nil
		}
		m.hosts = slices.DeleteFunc(m.hosts, func(x *fzHost) bool { return x == h })
	}
}

// connect is a host client's CONNECT, parsed as UDS does (in two reads),
// handed to the device with the bytes that came after the line.
func (m *fzMachine) connect(port uint32, form byte, extra int, seq bool) {
	seed := m.nextSeed()
	var typ uint16 = vsock.TypeStream
	rest := []byte(nil)
	if seq {
		typ = vsock.TypeSeqpacket
	} else {
		line := []string{"CONNECT %d\n", "connect %d\n", " Connect\t%d \n", "CONNECT %d x\n"}[form]
		stream := append(fmt.Appendf(nil, line, port), fzPat(seed, 0, extra)...)
		var p vsock.ConnectParser
		cut := len(stream) / 2
		got, r, done, err := p.Feed(stream[:cut])
		if !done && err == nil {
			got, r, done, err = p.Feed(stream[cut:])
		}
		if err != nil || !done {
			return // the client is closed before the device hears of it
		}
		if got != port {
			m.fatalf("CONNECT %d parsed as %d", port, got)
		}
		rest = r
	}
	dev, host, err := fzSocketpair(typ, m.small)
	if err != nil {
		m.t.Fatal(err)
	}
	h := &fzHost{fd: host, typ: typ, hostInit: true, port: port, seed: seed, sent: uint64(len(rest))}
	m.hosts = append(m.hosts, h)
	deadline := time.Now().Add(fzLongTimeout)
	if seq {
		_ = m.dev.ConnectSeqpacketFromHost(dev, port, deadline)
	} else {
		_ = m.dev.ConnectFromHost(dev, port, rest, deadline)
	}
}

// devReset resets the device (every host end must see its end close) and
// activates it again.
func (m *fzMachine) devReset() {
	m.g.Reset()
	for _, h := range m.hosts {
		if !m.hostClosed(h) {
			m.fatalf("a host end is still open after the device reset")
		}
		unix.Close(h.fd)
	}
	m.hosts = nil
	m.insts = nil
	m.keys = map[fzKey]*fzKeyState{}
	m.keyOrder = nil
	m.accepted = map[fzKey]*fzInst{}
	for _, d := range m.dial.take() {
		unix.Close(d.fd)
	}
	m.g.Activate()
	m.g.AutoRepost = true
	m.poisoned = false
}

// hostClosed drains a host end and reports whether the device closed its
// side.
func (m *fzMachine) hostClosed(h *fzHost) bool {
	buf := make([]byte, 64<<10)
	for {
		r, err := unix.Read(h.fd, buf)
		switch {
		case err == unix.EINTR:
		case r == 0 && err == nil, err == unix.ECONNRESET:
			return true
		case err != nil:
			return false
		}
	}
}

// endStep takes in what the step produced: dialled host ends, OK lines,
// the guest's view of connections the device reset.
func (m *fzMachine) endStep() {
	for _, d := range m.dial.take() {
		h := &fzHost{fd: d.fd, typ: d.typ, seed: m.nextSeed()}
		if in := m.inst(d.key); in != nil && in.host == nil && in.typ == d.typ && !in.hostInit && !in.dataTaint {
			in.host, h.inst = h, in
		}
		m.hosts = append(m.hosts, h)
	}
	for _, h := range m.hosts {
		if h.hostInit && !h.ok {
			m.readOK(h)
		}
	}
	for _, in := range slices.Clone(m.insts) {
		if in.c != nil && in.c.Rst {
			m.drop(in)
		}
	}
	m.resetOrphans()
	for _, k := range m.keyOrder {
		if ks := m.keys[k]; ks.stale {
			ks.stale, ks.open, ks.shut, ks.haveCredit = false, false, 0, false
		}
	}
	m.g.PrunePending(func(p *vsocktest.Packet) bool {
		ks := m.keys[fzKey{p.Hdr.SrcPort, p.Hdr.DstPort}]
		return p.Hdr.Op == vsock.OpRequest && (ks == nil || !ks.wild)
	})
}

// resetOrphans resets connections the device opened for a guest REQUEST
// the guest no longer tracks. A hostile REQUEST (dialOp, raw) on a key
// whose connection the device had already reset, with the RST not yet
// read, opens a new one; the key's state is unknown (wild) until the next
// RST, but that RST may be the older connection's, which leaves the new
// one open with no instance to use or close it. The guest answers it with
// RST, as Linux answers a packet for no socket, and lets the device settle.
func (m *fzMachine) resetOrphans() {
	sent := false
	for _, k := range m.keyOrder {
		ks := m.keys[k]
		if !ks.open || !ks.guestInit || ks.wild || ks.stale || m.inst(k) != nil {
			continue
		}
		h := m.g.Header(vsock.OpRst, k.guest, k.host)
		h.Type = ks.typ
		m.g.Send(h, nil)
		ks.stale, sent = true, true
	}
	if sent {
		m.settle()
	}
}

// closeAll closes every connection from both sides: the table must end
// empty and the budget at zero.
func (m *fzMachine) closeAll() {
	m.what = "closing everything"
	m.g.AutoRepost = true
	m.g.PostRX(int(m.cfg.QueueSize))
	for round := 0; ; round++ {
		m.dev.FireTimers()
		for _, k := range m.keyOrder {
			m.keys[k].stale = true
			for _, typ := range []uint16{vsock.TypeStream, vsock.TypeSeqpacket} {
				if typ == vsock.TypeSeqpacket && !m.gopts.Seqpacket {
					continue
				}
				h := m.g.Header(vsock.OpRst, k.guest, k.host)
				h.Type = typ
				m.g.Send(h, nil)
			}
		}
		for _, in := range m.insts {
			in.c.Forget()
		}
		m.insts = nil
		m.settle()
		m.endStep()
		m.insts = nil
		p := m.dev.Probe()
		if p.Conns == 0 {
			if p.BudgetUsed != 0 || p.ConnsOpenStat != 0 {
				m.fatalf("no connection left, yet budget %d in use and Stats.ConnsOpen %d", p.BudgetUsed, p.ConnsOpenStat)
			}
			break
		}
		if round == 2 {
			m.fatalf("%d connections left after every known one was reset", p.Conns)
		}
	}
	for _, h := range m.hosts {
		unix.Close(h.fd)
	}
	m.hosts = nil
	// REQUESTs still pending are for connections reset since.
	m.g.PrunePending(func(*vsocktest.Packet) bool { return false })
	m.keys = map[fzKey]*fzKeyState{}
	m.keyOrder = nil
	m.accepted = map[fzKey]*fzInst{}
}

// serving checks that the device still carries a connection each way.
func (m *fzMachine) serving() {
	m.what = "serving"
	k := fzKey{6000, 2000}
	m.dialOp(k, false)
	m.settle()
	m.endStep()
	in := m.inst(k)
	if in == nil || !in.c.Established || in.host == nil {
		m.fatalf("a fresh guest connection was not accepted (probe %+v)", m.dev.Probe())
	}
	// The waits below are not settles: whether data moved is checked
	// under a deadline, not by the device looking idle.
	m.write(0, 100, 0)
	m.g.WaitFor("100 bytes to the host", func() bool {
		m.readHost(in.host, 1<<20)
		return in.host.recv == 100
	})
	m.hosts = []*fzHost{in.host}
	m.hostWrite(0, 100)
	m.g.WaitFor("100 bytes to the guest", func() bool {
		m.consume(0, 100)
		return in.got == 100
	})
	m.connect(2001, 0, 5, false)
	m.g.WaitFor("a REQUEST from the host", func() bool { return len(m.g.Pending()) > 0 })
	m.accept(0, false)
	h := m.hosts[len(m.hosts)-1]
	m.g.WaitFor("the host's OK line", func() bool {
		m.readOK(h)
		return h.ok
	})
	if f := m.g.Fails(); len(f) > 0 {
		m.fatalf("the device failed: %v", f)
	}
	m.settle()
	m.closeAll()
}

func fuzzSession(t *testing.T, in []byte, hostOps bool) {
	base := runtime.NumGoroutine()
	fds := openFDs(t)
	m := newFzMachine(t, in, hostOps)
	m.run()
	checkGoroutines(t, base)
	if n := openFDs(t); n != fds {
		t.Fatalf("%d descriptors open before the input, %d after", fds, n)
	}
}

// FuzzTXRing drives the device from the guest side with sequences of
// honest and hostile packets over whole rings, the host ends passive
// readers (see the comment at the top of the file for the encoding and
// the invariants).
func FuzzTXRing(f *testing.F) {
	for _, s := range fzSeeds(false) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in []byte) { fuzzSession(t, in, false) })
}

// FuzzHostPeer is FuzzTXRing with the host acting too: writes, reads,
// half-closes, closes and CONNECT lines interleaved with the guest's
// packets, so the RX side (host data, credit stalls, EOF, hang-ups,
// host-initiated connections) is driven as hard as the TX side.
func FuzzHostPeer(f *testing.F) {
	for _, s := range fzSeeds(true) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in []byte) { fuzzSession(t, in, true) })
}

// fzSeeds are hand-written inputs that reach the interesting states.
func fzSeeds(host bool) [][]byte {
	op := func(code, sel byte, a1, a2 byte) []byte { return []byte{code | sel<<4, a1, a2} }
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	plain := []byte{7 | 32, 0, 0} // all options, SEQPACKET, 1 descriptor
	tight := []byte{7 | 32 | 64, 2<<2 | 1<<4, 1 | 2}
	seeds := [][]byte{
		cat(plain, op(fzDial, 0, 0, 0), op(fzWrite, 0, 0, 200), op(fzHostRead, 0, 0, 255), op(fzShutdown, 0, 1, 0), op(fzReset, 0, 0, 0)),
		cat(tight, op(fzDial, 0, 0, 0), op(fzWrite, 0, 255, 255), op(fzWrite, 0, 255, 255), op(fzHostRead, 0, 0, 10), op(fzCredit, 0, 1, 0), op(fzWrite, 0, 255, 255)),
		cat(plain, op(fzDial, 0, 16, 0), op(fzWrite, 0, 1, 3), op(fzWrite, 0, 0, 100), op(fzWrite, 0, 0, 101), op(fzHostRead, 0, 0, 0), op(fzHostRead, 0, 0, 0)),
		cat(plain, op(fzDial, 0, 0, 0), op(fzDial, 0, 0, 0), op(fzRaw, 0, byte(vsock.OpRW), 10), []byte{0, 0, 1, 0, 0, 0}, op(fzOverrun, 0, 5, 0)),
		cat(plain, op(fzDial, 0, 3<<2, 0), op(fzDial, 0, 1, 0), op(fzRX, 0, 0, 0), op(fzWrite, 1, 0, 50), op(fzReset, 1, 0, 0), op(fzRX, 0, 1, 0)),
		cat(tight, op(fzDial, 0, 0, 0), op(fzShutdown, 0, 2, 0), op(fzTimers, 0, 0, 0), op(fzDevReset, 0, 0, 0), op(fzDial, 0, 0, 0)),
		cat(plain, op(fzDial, 0, 0, 0), op(fzRX, 0, 3, 44), op(fzWrite, 0, 0, 10)),
	}
	if host {
		seeds = append(seeds,
			cat(plain, op(fzConnect, 0, 0, 7), op(fzAccept, 0, 0, 0), op(fzHostWrite, 0, 0, 100), op(fzConsume, 0, 0, 200), op(fzWrite, 0, 0, 30), op(fzHostRead, 0, 0, 255), op(fzHostShut, 0, 0, 0), op(fzConsume, 0, 0, 0)),
			cat(plain, op(fzConnect, 0, 16, 0), op(fzAccept, 0, 0, 0), op(fzHostWrite, 0, 0, 100), op(fzConsume, 0, 0, 0), op(fzWrite, 0, 0, 3), op(fzHostRead, 0, 0, 0)),
			cat(tight, op(fzDial, 0, 0, 0), op(fzHostWrite, 0, 255, 255), op(fzHostWrite, 0, 255, 255), op(fzConsume, 0, 255, 255), op(fzHostShut, 0, 2, 0), op(fzConsume, 0, 255, 255), op(fzTimers, 0, 0, 0)),
			cat(plain, op(fzConnect, 0, 1, 0), op(fzConnect, 0, 1<<2, 3), op(fzTimers, 0, 0, 0), op(fzAccept, 0, 0, 0), op(fzAccept, 0, 1, 0)),
			cat(plain, op(fzDial, 0, 0, 0), op(fzShutdown, 0, 0, 0), op(fzHostWrite, 0, 0, 10), op(fzHostShut, 0, 1, 0), op(fzWrite, 0, 0, 10)),
			cat(plain, op(fzDial, 0, 0, 0), op(fzReset, 0, 0, 0), op(fzHostWrite, 0, 0, 50), op(fzDial, 0, 0, 0), op(fzHostWrite, 1, 0, 50)),
		)
	}
	return seeds
}
