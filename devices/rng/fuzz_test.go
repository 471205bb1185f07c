package rng_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/microvm/microvm/devices/rng"
	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
)

// fzFill marks the guest's buffers before the device fills them.
const fzFill = 0xa5

// fzChain is a request chain made available: its buffers and the room in
// their writable ones.
type fzChain struct {
	bufs []virtiotest.Buf
	room uint64
}

// FuzzRequestChains makes request chains of any shape available on the
// queue and kicks, a batch at a time (a batch ends at the first chain that
// may be malformed, or when the ring is full). A chain is a spec byte
// (bits 0-1: one to four buffers; bit 2: through an indirect table; bit 3:
// the first buffer is 80 KiB, over MaxRequest) and one byte per buffer
// (bit 7: device-readable; bits 0-6: length in 96-byte units). Checked:
// every chain with only writable buffers and some room comes back with
// min(room, MaxRequest) bytes, and not one byte written past that count
// (the rest keeps its fill); a malformed chain (a readable buffer, or no
// room) may stop the device, through Fail with a virtio.ErrGuest and only
// then; nothing panics, and a batch is answered within the wait bound.
func FuzzRequestChains(f *testing.F) {
	f.Add([]byte{0, 10, 1, 10, 20, 2, 1, 2, 3})
	f.Add([]byte{4, 5, 7, 1, 2, 3, 4, 8, 0})
	f.Add([]byte{1, 0x80, 10})
	f.Add([]byte{1, 10, 0x80})
	f.Add([]byte{0, 0})
	f.Add([]byte{5, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		e := newEnv(t, rng.Config{})
		sent := map[uint16]fzChain{}
		total := 0
		for len(in) > 0 && total < 32 {
			batch := 0
			mayFail := false
			for len(in) > 0 && total < 32 && !mayFail {
				spec := in[0]
				in = in[1:]
				var c fzChain
				n := int(spec&3) + 1
				if (spec&4 != 0 && e.q.Free() < 1) || (spec&4 == 0 && e.q.Free() < n) {
					break
				}
				for i := 0; i < n; i++ {
					var b byte
					if len(in) > 0 {
						b = in[0]
						in = in[1:]
					}
					size := uint32(b&0x7f) * 96
					if i == 0 && spec&8 != 0 {
						size = 80 << 10
					}
					a := e.mem.Alloc(uint64(max(size, 1)), 8)
					if err := e.mem.Write(a, bytes.Repeat([]byte{fzFill}, int(size))); err != nil {
						t.Fatal(err)
					}
					w := b&0x80 == 0
					c.bufs = append(c.bufs, virtiotest.Buf{Addr: a, Len: size, Writable: w})
					if w {
						c.room += uint64(size)
					} else {
						mayFail = true
					}
				}
				if c.room == 0 {
					mayFail = true
				}
				var head uint16
				var ok bool
				if spec&4 != 0 {
					head, ok = e.q.AddIndirect(c.bufs...)
				} else {
					head, ok = e.q.Add(c.bufs...)
				}
				if !ok {
					t.Fatal("queue full after the free check")
				}
				sent[head] = c
				batch++
				total++
			}
			if batch == 0 {
				break
			}
			_ = e.kick.Signal()
			if failed := fzWait(t, e, sent, batch, mayFail); failed {
				return
			}
		}
		if f := e.failures(); len(f) > 0 {
			t.Fatalf("the device failed on well-formed chains: %v", f)
		}
	})
}

// fzWait reaps the batch, checking each chain, until all are back or the
// device failed (allowed only when the batch's last chain may be
// malformed). It reports whether the device failed.
func fzWait(t *testing.T, e *env, sent map[uint16]fzChain, batch int, mayFail bool) bool {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for got := 0; got < batch; {
		for _, u := range e.q.Reap() {
			got++
			c, ok := sent[u.ID]
			if !ok {
				t.Fatalf("used head %d was never made available", u.ID)
			}
			delete(sent, u.ID)
			if want := min(c.room, rng.MaxRequest); uint64(u.Len) != want {
				t.Fatalf("chain of %d writable bytes: used length %d; want %d", c.room, u.Len, want)
			}
			// Past the count, the writable buffers keep their fill.
			skip := uint64(u.Len)
			for _, b := range c.bufs {
				if !b.Writable {
					continue
				}
				if skip >= uint64(b.Len) {
					skip -= uint64(b.Len)
					continue
				}
				rest := make([]byte, uint64(b.Len)-skip)
				if err := e.mem.Read(b.Addr+skip, rest); err != nil {
					t.Fatal(err)
				}
				if bytes.Count(rest, []byte{fzFill}) != len(rest) {
					t.Fatalf("the device wrote past the %d bytes it reported", u.Len)
				}
				skip = 0
			}
		}
		if got == batch {
			return false
		}
		if f := e.failures(); len(f) > 0 {
			if !mayFail {
				t.Fatalf("the device failed on well-formed chains: %v", f)
			}
			if !errors.Is(f[0], virtio.ErrGuest) {
				t.Fatalf("Fail(%v): not a guest error", f[0])
			}
			return true
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d chains back after %v", got, batch, waitTimeout)
		}
		select {
		case <-e.irq:
		case <-time.After(time.Millisecond):
		}
	}
	return false
}
