package virtio_test

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/microvm/microvm/kvm/guestmem"
	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
)

// Guest memory layout of FuzzDescriptorChain.
const (
	fzMem   = 0x10000
	fzDesc  = 0x1000 // up to 256 descriptors
	fzAvail = 0x2000
	fzUsed  = 0x3000
	fzData  = 0x4000 // buffers and indirect tables, from the input
)

// FuzzDescriptorChain decodes its input as a queue: byte 0 is log2 of the
// size (mod 9), byte 1 bit 0 negotiates INDIRECT_DESC and bit 1 EVENT_IDX,
// bytes 2-3 are the available index and 4-5 the device's starting index
// (little endian), then come size*16 bytes of descriptor table, size*2 of
// available ring, and the rest is copied to fzData. The device pops until
// the ring is empty or an error; every chain must match an independent walk
// of the same descriptors, view for view, with each view pointing into the
// guest memory array.
func FuzzDescriptorChain(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		data := make([]byte, fzMem)
		mem, err := guestmem.New(guestmem.Region{GPA: 0, Data: data})
		if err != nil {
			t.Fatal(err)
		}
		take := func(n int) []byte {
			n = min(n, len(in))
			p := in[:n]
			in = in[n:]
			return p
		}
		hdr := make([]byte, 6)
		copy(hdr, take(6))
		size := uint16(1) << (hdr[0] % 9)
		indirect, eventIdx := hdr[1]&1 != 0, hdr[1]&2 != 0
		availIdx := binary.LittleEndian.Uint16(hdr[2:])
		start := binary.LittleEndian.Uint16(hdr[4:])
		copy(data[fzDesc:], take(16*int(size)))
		copy(data[fzAvail+4:], take(2*int(size)))
		copy(data[fzData:], in)
		binary.LittleEndian.PutUint16(data[fzAvail+2:], availIdx)
		binary.LittleEndian.PutUint16(data[fzUsed+2:], start)

		cfg := virtio.QueueConfig{Size: size, Desc: fzDesc, Avail: fzAvail, Used: fzUsed}
		if err := cfg.Validate(mem, virtio.MaxQueueSize); err != nil {
			t.Fatal(err)
		}
		q := virtio.NewQueue(mem, cfg, eventIdx, indirect)
		if err := q.SetIndices(start); err != nil {
			t.Fatal(err)
		}
		var c virtio.Chain
		for i := 0; i <= int(size); i++ {
			last := q.LastAvail()
			var want refChain
			ahead := availIdx - last
			wantErr := ahead > size
			if !wantErr && ahead != 0 {
				head := binary.LittleEndian.Uint16(data[fzAvail+4+2*int(last%size):])
				want, wantErr = refWalk(data, fzDesc, size, indirect, head)
			}
			ok, err := q.Pop(&c)
			if err != nil {
				if !errors.Is(err, virtio.ErrGuest) {
					t.Fatalf("Pop error %v does not wrap ErrGuest", err)
				}
				if !wantErr {
					t.Fatalf("Pop rejected a chain the reference walk accepts (%+v): %v", want, err)
				}
				if q.LastAvail() != last {
					t.Fatalf("a failed Pop moved LastAvail")
				}
				return
			}
			if wantErr {
				t.Fatalf("Pop = %v, nil; the reference walk rejects the chain", ok)
			}
			if !ok {
				if ahead != 0 {
					t.Fatalf("Pop found nothing %d entries ahead", ahead)
				}
				break
			}
			checkChain(t, data, &c, want)
			if err := q.Push(c.Head, uint32(min(c.WritableLen(), 1<<32-1))); err != nil {
				t.Fatal(err)
			}
			if _, err := q.NeedsNotification(); err != nil {
				t.Fatal(err)
			}
			if i%2 == 0 {
				_ = q.DisableNotification()
			} else if _, err := q.EnableNotification(); err != nil {
				t.Fatal(err)
			}
		}
	})
}

type refBuf struct {
	addr  uint64
	n     uint32
	write bool
}

type refChain []refBuf

// refWalk is an independent reading of virtio 1.2 2.7.5 with this
// package's limits, over the raw memory array. It reports whether the
// chain is to be rejected.
func refWalk(mem []byte, desc uint64, size uint16, indirect bool, head uint16) (refChain, bool) {
	inside := func(addr, n uint64) bool { return addr <= uint64(len(mem)) && n <= uint64(len(mem))-addr }
	if head >= size {
		return nil, true
	}
	var out refChain
	table, limit, nested := desc, uint64(size), false
	i, steps := uint64(head), uint64(0)
	writing, total := false, uint64(0)
	for {
		if steps >= limit {
			return nil, true
		}
		steps++
		d := mem[table+16*i:]
		addr := binary.LittleEndian.Uint64(d)
		n := binary.LittleEndian.Uint32(d[8:])
		flags := binary.LittleEndian.Uint16(d[12:])
		next := binary.LittleEndian.Uint16(d[14:])
		if flags&^7 != 0 {
			return nil, true
		}
		if flags&4 != 0 {
			// A table holds at most max(queue size, 1024) descriptors.
			if !indirect || nested || flags&1 != 0 || n == 0 || n%16 != 0 || n/16 > max(uint32(size), 1024) || !inside(addr, uint64(n)) {
				return nil, true
			}
			table, limit, nested, i, steps = addr, uint64(n/16), true, 0, 0
			continue
		}
		w := flags&2 != 0
		if !w && writing {
			return nil, true
		}
		writing = writing || w
		if n > 0 {
			if !inside(addr, uint64(n)) {
				return nil, true
			}
			out = append(out, refBuf{addr, n, w})
			if total += uint64(n); total > 1<<32 {
				return nil, true
			}
		}
		if flags&1 == 0 {
			return out, false
		}
		if uint64(next) >= limit {
			return nil, true
		}
		i = uint64(next)
	}
}

// checkChain compares c with the reference walk: same buffers, each view
// exactly mem[addr:addr+n] (the same array element, capacity bounded).
func checkChain(t *testing.T, mem []byte, c *virtio.Chain, want refChain) {
	t.Helper()
	var rlen, wlen uint64
	views := append(append([][]byte(nil), c.Readable()...), c.Writable()...)
	if len(views) != len(want) {
		t.Fatalf("chain has %d buffers; the reference walk %d", len(views), len(want))
	}
	for k, v := range views {
		b := want[k]
		if (k >= len(c.Readable())) != b.write {
			t.Fatalf("buffer %d: writable %v; want %v", k, !b.write, b.write)
		}
		if len(v) != int(b.n) || cap(v) != len(v) || &v[0] != &mem[b.addr] {
			t.Fatalf("buffer %d: view of %d (cap %d) not at guest %#x+%d", k, len(v), cap(v), b.addr, b.n)
		}
		if b.write {
			wlen += uint64(b.n)
		} else {
			rlen += uint64(b.n)
		}
	}
	if c.ReadableLen() != rlen || c.WritableLen() != wlen {
		t.Fatalf("lengths %d/%d; buffers add up to %d/%d", c.ReadableLen(), c.WritableLen(), rlen, wlen)
	}
}

// FuzzMMIORegisters runs a sequence of register accesses of any width from
// its input, 8 bytes per step: byte 0 selects the kind (bits 0-1: read,
// write, write, action) and the width (bits 2-4: 4, 1, 2, 8, 4, 0, 3, 4),
// bytes 1-2 the offset (mod 0x200; word-aligned and below 0x110 unless bit
// 7 of byte 2 is set), bytes 3-6 the value. An action, chosen by byte 4 mod
// 4, fails the device, raises the interrupt of queue byte 3, pops and pushes
// that queue, or has the guest store bytes 5-6 at guest address bytes 1-2.
// After every step the status invariants must hold.
func FuzzMMIORegisters(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		mem := virtiotest.NewMemory(t, fzMem)
		dev := &fakeDevice{typ: virtio.DeviceVsock, features: 1, sizes: []uint16{16, 8}, config: make([]byte, 8)}
		m, err := virtio.NewMMIO(dev, mem.Memory, func() {}, quietLog())
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		widths := [8]int{4, 1, 2, 8, 4, 0, 3, 4}
		var c virtio.Chain
		for ; len(in) >= 8; in = in[8:] {
			op := in[:8]
			off := uint64(binary.LittleEndian.Uint16(op[1:])) % 0x200
			if op[2]&0x80 == 0 {
				off = off &^ 3 % 0x110
			}
			val := op[3:7]
			p := make([]byte, widths[op[0]>>2&7])
			copy(p, val)
			switch op[0] & 3 {
			case 0:
				m.Read(off, p)
			case 1, 2:
				m.Write(off, p)
			case 3:
				if val[1]%4 == 3 { // the guest writes its memory
					_ = mem.Write(uint64(binary.LittleEndian.Uint16(op[1:])), val[2:4])
					break
				}
				if _, _, live := dev.counts(); live == 0 {
					break
				}
				a := dev.lastActivation(t)
				aq := a.Queues[int(val[0])%len(a.Queues)]
				switch val[1] % 4 {
				case 0:
					a.Fail(errors.New("fuzz"))
				case 1:
					if aq != nil {
						aq.Interrupt()
					}
				case 2:
					if aq == nil {
						break
					}
					if ok, err := aq.Pop(&c); err != nil {
						a.Fail(err)
					} else if ok {
						if err := aq.Push(c.Head, 0); err != nil {
							a.Fail(err)
						} else if err := aq.Notify(); err != nil {
							a.Fail(err)
						}
					}
				}
			}
			checkMMIOInvariants(t, m, dev)
		}
	})
}

func checkMMIOInvariants(t *testing.T, m *virtio.MMIO, dev *fakeDevice) {
	t.Helper()
	st := m.Status()
	var b [4]byte
	m.Read(virtio.RegStatus, b[:])
	if r := binary.LittleEndian.Uint32(b[:]); r != st {
		t.Fatalf("status register %#x, Status() %#x", r, st)
	}
	if st&virtio.StatusNeedsReset != 0 && m.GuestErrors() == 0 {
		t.Fatalf("NEEDS_RESET without a counted guest error")
	}
	switch st &^ (virtio.StatusNeedsReset | virtio.StatusFailed) {
	case 0, 1, 3, 11, 15:
	default:
		t.Fatalf("status %s is not on the initialisation path", virtio.StatusString(st))
	}
	_, _, live := dev.counts()
	if live > 1 {
		t.Fatalf("Activate called %d times since the last reset", live)
	}
	if (st&virtio.StatusDriverOK != 0) != (live == 1) {
		t.Fatalf("status %s with %d live activations", virtio.StatusString(st), live)
	}
	m.Read(virtio.RegInterruptStatus, b[:])
	if is := binary.LittleEndian.Uint32(b[:]); is&^3 != 0 {
		t.Fatalf("InterruptStatus %#x has undefined bits", is)
	}
}
