package virtio

import (
	"encoding/binary"

	"github.com/microvm/microvm/kvm/guestmem"
)

// Descriptor flags (virtio 1.2, 2.7.5).
const (
	descFlagNext     = 1 // VIRTQ_DESC_F_NEXT
	descFlagWrite    = 2 // VIRTQ_DESC_F_WRITE
	descFlagIndirect = 4 // VIRTQ_DESC_F_INDIRECT
	descFlagsKnown   = descFlagNext | descFlagWrite | descFlagIndirect

	// minIndirectLimit: an indirect table may hold as many descriptors as
	// the queue size (2.7.5.3.1: no chain is longer than the queue), but
	// never fewer than this, because QEMU accepts longer tables and drivers
	// with small queues and long scatter lists rely on it. The bound also
	// caps the views a Chain collects, host memory a guest controls.
	minIndirectLimit = 1024

	// maxChainBytes bounds the total length of a chain's buffers.
	maxChainBytes = 1 << 32
)

// Chain is a walked descriptor chain: the buffers the driver made available
// under one head, as bounded views of guest memory, split into the part the
// device reads (driver-written) and the part it writes.
type Chain struct {
	// Head is the chain's first descriptor index: the id Queue.Push
	// returns to the driver.
	Head     uint16
	readable [][]byte
	writable [][]byte
	rlen     uint64
	wlen     uint64
}

// Readable returns the device-readable buffers in order.
func (c *Chain) Readable() [][]byte { return c.readable }

// Writable returns the device-writable buffers in order.
func (c *Chain) Writable() [][]byte { return c.writable }

// ReadableLen is the total size of the readable buffers.
func (c *Chain) ReadableLen() uint64 { return c.rlen }

// WritableLen is the total size of the writable buffers.
func (c *Chain) WritableLen() uint64 { return c.wlen }

func (c *Chain) reset(head uint16) {
	c.Head = head
	clear(c.readable)
	clear(c.writable)
	c.readable = c.readable[:0]
	c.writable = c.writable[:0]
	c.rlen, c.wlen = 0, 0
}

// Walker follows descriptor chains. It is the only code that interprets
// descriptors, and it trusts none of their fields.
type Walker struct {
	mem      *guestmem.Memory
	desc     uint64 // descriptor table address
	size     uint16 // queue size
	indirect bool   // VIRTIO_F_INDIRECT_DESC negotiated
}

type descriptor struct {
	addr  uint64
	len   uint32
	flags uint16
	next  uint16
}

func readDesc(mem *guestmem.Memory, table uint64, i uint64) (descriptor, error) {
	var b [descSize]byte
	if err := mem.Read(table+descSize*i, b[:]); err != nil {
		return descriptor{}, guestErr("descriptor %d at %#x: %v", i, table+descSize*i, err)
	}
	return descriptor{
		addr:  binary.LittleEndian.Uint64(b[0:]),
		len:   binary.LittleEndian.Uint32(b[8:]),
		flags: binary.LittleEndian.Uint16(b[12:]),
		next:  binary.LittleEndian.Uint16(b[14:]),
	}, nil
}

// Walk reads the chain starting at head into c. It rejects: heads and next
// indices outside the table, chains longer than the table (loops), unknown
// flags, indirect descriptors when not negotiated or inside an indirect
// table or combined with NEXT, indirect tables of bad size or outside
// memory, readable descriptors after writable ones, buffers outside guest
// memory, and chains longer than 4 GiB in total.
func (w *Walker) Walk(head uint16, c *Chain) error {
	c.reset(head)
	if head >= w.size {
		return guestErr("chain head %d >= queue size %d", head, w.size)
	}
	table, limit := w.desc, uint64(w.size)
	inIndirect := false
	// writing is set by the first writable descriptor, empty or not; no
	// readable one may follow (2.7.4.2).
	writing := false
	i := uint64(head)
	for n := uint64(0); ; n++ {
		if n >= limit {
			return guestErr("chain from head %d is longer than its table (%d): a loop", head, limit)
		}
		d, err := readDesc(w.mem, table, i)
		if err != nil {
			return err
		}
		if d.flags&^descFlagsKnown != 0 {
			return guestErr("descriptor %d has unknown flags %#x", i, d.flags)
		}
		if d.flags&descFlagIndirect != 0 {
			switch {
			case !w.indirect:
				return guestErr("indirect descriptor %d without VIRTIO_F_INDIRECT_DESC", i)
			case inIndirect:
				return guestErr("nested indirect descriptor %d", i)
			case d.flags&descFlagNext != 0:
				return guestErr("indirect descriptor %d also has NEXT", i)
			case d.len == 0 || d.len%descSize != 0 || uint64(d.len)/descSize > max(uint64(w.size), minIndirectLimit):
				return guestErr("indirect table of %d bytes (queue size %d)", d.len, w.size)
			}
			if err := w.mem.Check(d.addr, uint64(d.len)); err != nil {
				return guestErr("indirect table at %#x+%d: %v", d.addr, d.len, err)
			}
			// Continue in the indirect table at its entry 0; the loop
			// bound restarts at the table's size (n wraps to 0).
			table, limit, inIndirect, i, n = d.addr, uint64(d.len)/descSize, true, 0, ^uint64(0)
			continue
		}
		if d.flags&descFlagWrite != 0 {
			writing = true
		} else if writing {
			return guestErr("readable descriptor %d after a writable one", i)
		}
		if d.len > 0 {
			view, err := w.mem.Slice(d.addr, uint64(d.len))
			if err != nil {
				// A buffer spanning two adjacent memory regions is legal
				// but never produced by a real driver for our layouts.
				return guestErr("descriptor %d buffer %#x+%d: %v", i, d.addr, d.len, err)
			}
			if d.flags&descFlagWrite != 0 {
				c.writable = append(c.writable, view)
				c.wlen += uint64(d.len)
			} else {
				c.readable = append(c.readable, view)
				c.rlen += uint64(d.len)
			}
			if c.rlen+c.wlen > maxChainBytes {
				return guestErr("chain from head %d is longer than 4 GiB", head)
			}
		}
		if d.flags&descFlagNext == 0 {
			return nil
		}
		if uint64(d.next) >= limit {
			return guestErr("descriptor %d: next %d is outside its table of %d", i, d.next, limit)
		}
		i = uint64(d.next)
	}
}

// CopyFrom copies bytes from the buffers bufs, starting off bytes in, into
// dst, and returns the number copied.
func CopyFrom(bufs [][]byte, off uint64, dst []byte) int {
	n := 0
	for _, b := range bufs {
		if n == len(dst) {
			break
		}
		if off >= uint64(len(b)) {
			off -= uint64(len(b))
			continue
		}
		n += copy(dst[n:], b[off:])
		off = 0
	}
	return n
}

// CopyTo copies src into the buffers bufs, starting off bytes in, and
// returns the number copied.
func CopyTo(bufs [][]byte, off uint64, src []byte) int {
	n := 0
	for _, b := range bufs {
		if n == len(src) {
			break
		}
		if off >= uint64(len(b)) {
			off -= uint64(len(b))
			continue
		}
		n += copy(b[off:], src[n:])
		off = 0
	}
	return n
}

// Slice returns the views covering bytes [off, off+n) of bufs, appended to
// dst (for scatter-gather I/O); it returns fewer bytes if bufs is shorter.
func Slice(dst [][]byte, bufs [][]byte, off, n uint64) [][]byte {
	for _, b := range bufs {
		if n == 0 {
			break
		}
		if off >= uint64(len(b)) {
			off -= uint64(len(b))
			continue
		}
		seg := b[off:]
		if uint64(len(seg)) > n {
			seg = seg[:n]
		}
		dst = append(dst, seg)
		n -= uint64(len(seg))
		off = 0
	}
	return dst
}
