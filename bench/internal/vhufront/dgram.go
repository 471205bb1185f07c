package vhufront

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/microvm/microvm/kvm/eventfd"
)

// Experimental vsock datagrams (microvm's own feature bit 23,
// vsock.FeatureDgram, not the RFC series' VIRTIO_VSOCK_F_DGRAM, bit 3): when
// the back-end offers the feature and Config.Dgram asks for it, the guest also drives the datagram queues, vhost-user rings 2 and 3
// (device queues 3 and 4: the front-end keeps the event queue). One packet
// of type 3, op RW, is one datagram; there is no connection and no credit.
// The datagram path polls its rings (interrupts off) and is driven by the
// Dgram* methods, not by Run.
const (
	// FeatureDgram is microvm's datagram feature (vsock.FeatureDgram).
	FeatureDgram = 1 << 23
	typeDgram    = 3
	// DgramPrefixSize is the host-side address prefix of microvm's
	// datagram sockets: guest port, host port, u32 little endian.
	DgramPrefixSize = 8
	ringDgramRX     = 2
	ringDgramTX     = 3
	dgramTxSlots    = 64
)

// dgramRings is the guest side of the datagram queues.
type dgramRings struct {
	rx, tx     *Ring
	kick, call [2]*eventfd.EventFD
	rxBuf      []uint64 // descriptor i's buffer
	txSlot     []uint64 // slot s: descriptor s, header then payload
	txBusy     []bool
	txFree     []uint16
	hb         [HdrSize]byte
	sent, rcvd uint64
}

// dgramMemory is the guest memory the datagram rings need.
func dgramMemory(cfg Config) uint64 {
	n := uint64(cfg.QueueSize)
	return 2*(16*n+6+2*n+6+8*n+64) + n*uint64(HdrSize+cfg.RXBufSize+64) + dgramTxSlots*uint64(HdrSize+MaxPayload+64)
}

// setupDgram allocates the datagram rings and buffers and posts every RX
// buffer; startDgram hands them to the back-end.
func (g *Guest) setupDgram(a *allocator) error {
	d := &dgramRings{}
	var err error
	if d.rx, err = newRing(g.mem.Memory, a, g.cfg.QueueSize, g.client.Features&FeatureEventIdx != 0); err != nil {
		return err
	}
	if d.tx, err = newRing(g.mem.Memory, a, dgramTxSlots, g.client.Features&FeatureEventIdx != 0); err != nil {
		return err
	}
	for i := range g.cfg.QueueSize {
		addr, err := a.alloc(uint64(HdrSize+g.cfg.RXBufSize), 64)
		if err != nil {
			return err
		}
		if err := d.rx.SetDesc(i, addr, uint32(HdrSize+g.cfg.RXBufSize), descWrite, 0); err != nil {
			return err
		}
		d.rxBuf = append(d.rxBuf, addr)
		if err := d.rx.Offer(i); err != nil {
			return err
		}
	}
	if _, err := d.rx.Publish(); err != nil {
		return err
	}
	for s := range uint16(dgramTxSlots) {
		addr, err := a.alloc(HdrSize+MaxPayload, 64)
		if err != nil {
			return err
		}
		d.txSlot = append(d.txSlot, addr)
		d.txBusy = append(d.txBusy, false)
		d.txFree = append(d.txFree, dgramTxSlots-1-s)
	}
	for q := range 2 {
		if d.kick[q], err = eventfd.NewNonblocking(); err != nil {
			return err
		}
		if d.call[q], err = eventfd.NewNonblocking(); err != nil {
			return err
		}
	}
	g.dg = d
	return nil
}

func (g *Guest) startDgram() error {
	d := g.dg
	for i, r := range []*Ring{d.rx, d.tx} {
		if err := g.client.StartRing(uint32(ringDgramRX+i), r, g.mem, d.kick[i].FD(), d.call[i].FD()); err != nil {
			return err
		}
		_ = r.DisableInterrupts() // the datagram path polls
	}
	return nil
}

func (g *Guest) closeDgram(stop bool) []error {
	d := g.dg
	if d == nil {
		return nil
	}
	var errs []error
	if stop {
		for _, ring := range []uint32{ringDgramRX, ringDgramTX} {
			if _, err := g.client.StopRing(ring); err != nil {
				errs = append(errs, err)
				break
			}
		}
	}
	for q := range 2 {
		for _, e := range []*eventfd.EventFD{d.kick[q], d.call[q]} {
			if e != nil {
				errs = append(errs, e.Close())
			}
		}
	}
	g.dg = nil
	return errs
}

// DgramEnabled reports whether datagrams were negotiated.
func (g *Guest) DgramEnabled() bool { return g.dg != nil }

// ErrNoDgram: the back-end did not offer FeatureDgram (or
// Config.Dgram did not ask for it).
var ErrNoDgram = errors.New("vhufront: datagrams not negotiated")

// publishDgram publishes ring q of the datagram pair and kicks if asked.
func (g *Guest) publishDgram(q int) error {
	d := g.dg
	r := []*Ring{d.rx, d.tx}[q]
	kick, err := r.Publish()
	if err != nil || !kick {
		return err
	}
	return d.kick[q].Signal()
}

// reapDgramTX takes back the TX slots the device is done with.
func (g *Guest) reapDgramTX() error {
	d := g.dg
	for {
		id, _, ok, err := d.tx.NextUsed()
		if err != nil || !ok {
			return err
		}
		if int(id) >= len(d.txSlot) || !d.txBusy[id] {
			return fmt.Errorf("vhufront: device returned datagram TX descriptor %d, which it does not hold", id)
		}
		d.txBusy[id] = false
		d.txFree = append(d.txFree, id)
	}
}

// DgramSend offers one datagram from guest port src to host port dst
// (published by the next DgramFlush). It reports false when every TX slot
// is in flight.
func (g *Guest) DgramSend(src, dst uint32, payload []byte) (bool, error) {
	d := g.dg
	if d == nil {
		return false, ErrNoDgram
	}
	if len(payload) > MaxPayload {
		return false, fmt.Errorf("vhufront: datagram of %d bytes", len(payload))
	}
	if len(d.txFree) == 0 {
		if err := g.reapDgramTX(); err != nil {
			return false, err
		}
		if len(d.txFree) == 0 {
			return false, nil
		}
	}
	s := d.txFree[len(d.txFree)-1]
	d.txFree = d.txFree[:len(d.txFree)-1]
	h := Hdr{SrcCID: g.cfg.CID, DstCID: HostCID, SrcPort: src, DstPort: dst, Len: uint32(len(payload)), Type: typeDgram, Op: OpRW}
	h.encode(d.hb[:])
	a := d.txSlot[s]
	if err := g.mem.Write(a, d.hb[:]); err != nil {
		return false, err
	}
	if err := g.mem.Write(a+HdrSize, payload); err != nil {
		return false, err
	}
	if err := d.tx.SetDesc(s, a, uint32(HdrSize+len(payload)), 0, 0); err != nil {
		return false, err
	}
	if err := d.tx.Offer(s); err != nil {
		return false, err
	}
	d.txBusy[s] = true
	d.sent++
	return true, nil
}

// DgramFlush publishes offered datagrams and kicks if the device asks.
func (g *Guest) DgramFlush() error {
	if g.dg == nil {
		return ErrNoDgram
	}
	return g.publishDgram(1)
}

// DgramRecv hands each datagram the device delivered to fn (the data is
// valid only during the call), reposts the buffers and reports how many.
func (g *Guest) DgramRecv(fn func(h Hdr, data []byte) error) (int, error) {
	d := g.dg
	if d == nil {
		return 0, ErrNoDgram
	}
	n := 0
	buf := make([]byte, 0, HdrSize+g.cfg.RXBufSize)
	for {
		id, l, ok, err := d.rx.NextUsed()
		if err != nil {
			return n, err
		}
		if !ok {
			break
		}
		if int(id) >= len(d.rxBuf) || l < HdrSize || l > uint32(HdrSize+g.cfg.RXBufSize) {
			return n, fmt.Errorf("vhufront: datagram RX descriptor %d used with %d bytes", id, l)
		}
		buf = buf[:l]
		if err := g.mem.Read(d.rxBuf[id], buf); err != nil {
			return n, err
		}
		var h Hdr
		h.decode(buf)
		if h.Type != typeDgram || h.Op != OpRW || h.Len != l-HdrSize || h.DstCID != g.cfg.CID {
			return n, fmt.Errorf("vhufront: bad datagram %v in %d bytes", h, l)
		}
		if fn != nil {
			if err := fn(h, buf[HdrSize:]); err != nil {
				return n, err
			}
		}
		if err := d.rx.Offer(id); err != nil {
			return n, err
		}
		d.rcvd++
		n++
	}
	if n > 0 {
		return n, g.publishDgram(0)
	}
	return n, nil
}

// DgramSource sends datagrams of payload bytes from guest port src to host
// port dst as fast as the TX ring takes them, for dur. It returns how many
// went to the device.
func (g *Guest) DgramSource(src, dst uint32, payload int, dur time.Duration) (uint64, error) {
	if g.dg == nil {
		return 0, ErrNoDgram
	}
	p := PatternAt(0, payload)
	var sent uint64
	end := time.Now().Add(dur)
	for i := 0; ; i++ {
		if i%64 == 0 && time.Now().After(end) {
			break
		}
		ok, err := g.DgramSend(src, dst, p)
		if err != nil {
			return sent, err
		}
		if ok {
			sent++
			continue
		}
		if err := g.DgramFlush(); err != nil {
			return sent, err
		}
	}
	if err := g.DgramFlush(); err != nil {
		return sent, err
	}
	// Wait for the device to take the last ones.
	for deadline := time.Now().Add(5 * time.Second); len(g.dg.txFree) < dgramTxSlots; {
		if err := g.reapDgramTX(); err != nil {
			return sent, err
		}
		if time.Now().After(deadline) {
			return sent, errors.New("vhufront: the device did not consume the last datagrams")
		}
	}
	return sent, nil
}

// DgramSink receives datagrams until quiet passes without one (after at
// least until), checking each payload's size, and returns how many came.
func (g *Guest) DgramSink(payload int, until time.Time, quiet time.Duration) (uint64, error) {
	if g.dg == nil {
		return 0, ErrNoDgram
	}
	var got uint64
	last := time.Now()
	check := func(h Hdr, data []byte) error {
		if len(data) != payload {
			return fmt.Errorf("vhufront: datagram of %d bytes, want %d", len(data), payload)
		}
		return nil
	}
	for {
		n, err := g.DgramRecv(check)
		if err != nil {
			return got, err
		}
		got += uint64(n)
		now := time.Now()
		if n > 0 {
			last = now
		} else if now.After(until) && now.Sub(last) > quiet {
			return got, nil
		}
	}
}

// HostDgramSource sends datagrams of payload bytes to the back-end's
// datagram socket path (addressed to guest port guestPort from host port
// hostPort, microvm's prefix) for dur, and returns how many it sent. A
// full socket blocks the sender, as it would any host application.
func HostDgramSource(path string, guestPort, hostPort uint32, payload int, dur time.Duration) (uint64, error) {
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	msg := make([]byte, DgramPrefixSize+payload)
	binary.LittleEndian.PutUint32(msg[0:], guestPort)
	binary.LittleEndian.PutUint32(msg[4:], hostPort)
	copy(msg[DgramPrefixSize:], PatternAt(0, payload))
	var sent uint64
	end := time.Now().Add(dur)
	_ = c.SetWriteDeadline(end.Add(time.Second))
	for i := 0; ; i++ {
		if i%64 == 0 && time.Now().After(end) {
			return sent, nil
		}
		if _, err := c.Write(msg); err != nil {
			return sent, err
		}
		sent++
	}
}

// HostDgramSink is a bound datagram socket that counts what arrives, on a
// goroutine of its own, until Close.
type HostDgramSink struct {
	c    *net.UnixConn
	n    atomic.Uint64
	bad  atomic.Uint64
	done chan struct{}
}

// ListenHostDgram binds path and starts counting datagrams of
// DgramPrefixSize+payload bytes.
func ListenHostDgram(path string, payload int) (*HostDgramSink, error) {
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return nil, err
	}
	_ = c.SetReadBuffer(4 << 20)
	s := &HostDgramSink{c: c, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		buf := make([]byte, DgramPrefixSize+MaxPayload+1)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			if n != DgramPrefixSize+payload {
				s.bad.Add(1)
			}
			s.n.Add(1)
		}
	}()
	return s, nil
}

// Count is how many datagrams arrived, and how many of them had the wrong
// size.
func (s *HostDgramSink) Count() (n, bad uint64) { return s.n.Load(), s.bad.Load() }

// Close stops counting and removes nothing (the caller's directory goes).
func (s *HostDgramSink) Close() error {
	err := s.c.Close()
	<-s.done
	return err
}
