package vhufront

import (
	"bytes"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/virtio"
)

// ringPair is a driver Ring and the project's device-side virtio.Queue on
// the same shared memory: the seam the back-end sees.
func ringPair(t *testing.T, size uint16, eventIdx bool, regions int) (*Memory, *allocator, *Ring, *virtio.Queue) {
	t.Helper()
	m, err := NewMemory(1<<20, regions)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	a := newAllocator(m)
	r, err := newRing(m.Memory, a, size, eventIdx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := virtio.QueueConfig{Size: size, Desc: r.Desc, Avail: r.Avail, Used: r.Used}
	if err := cfg.Validate(m.Memory, size); err != nil {
		t.Fatal(err)
	}
	return m, a, r, virtio.NewQueue(m.Memory, cfg, eventIdx, false)
}

// TestRingAgainstDevice: chains the driver offers reach the device intact,
// used entries come back in order with their lengths, and the indices
// wrap past 65535.
func TestRingAgainstDevice(t *testing.T) {
	for _, eventIdx := range []bool{false, true} {
		m, a, r, q := ringPair(t, 8, eventIdx, 2)
		buf := make([]uint64, 8)
		for i := range buf {
			var err error
			if buf[i], err = a.alloc(64, 64); err != nil {
				t.Fatal(err)
			}
		}
		for round := range 70000 / 8 {
			// The driver offers two-descriptor chains: readable then writable.
			for i := uint16(0); i < 8; i += 2 {
				must(t, r.SetDesc(i, buf[i], 16, descNext, i+1))
				must(t, r.SetDesc(i+1, buf[i+1], 32, descWrite, 0))
				must(t, m.Write(buf[i], bytes.Repeat([]byte{byte(round + int(i))}, 16)))
				must(t, r.Offer(i))
			}
			if _, err := r.Publish(); err != nil {
				t.Fatal(err)
			}
			var c virtio.Chain
			for i := uint16(0); i < 8; i += 2 {
				ok, err := q.Pop(&c)
				if err != nil || !ok || c.Head != i || c.ReadableLen() != 16 || c.WritableLen() != 32 {
					t.Fatalf("round %d: pop = %v, %v, head %d, %d/%d bytes", round, ok, err, c.Head, c.ReadableLen(), c.WritableLen())
				}
				if got := c.Readable()[0][0]; got != byte(round+int(i)) {
					t.Fatalf("round %d: device read %#x", round, got)
				}
				must(t, q.Push(c.Head, uint32(i)))
			}
			for i := uint16(0); i < 8; i += 2 {
				id, n, ok, err := r.NextUsed()
				if err != nil || !ok || id != i || n != uint32(i) {
					t.Fatalf("round %d: used = %d, %d, %v, %v; want %d", round, id, n, ok, err, i)
				}
			}
			if _, _, ok, _ := r.NextUsed(); ok {
				t.Fatalf("round %d: an extra used entry", round)
			}
		}
	}
}

// TestRingNotifications: kick decisions follow the device's avail_event or
// NO_NOTIFY, and interrupt requests reach the device's decision.
func TestRingNotifications(t *testing.T) {
	for _, eventIdx := range []bool{false, true} {
		_, a, r, q := ringPair(t, 16, eventIdx, 1)
		addr, _ := a.alloc(64, 64)
		for i := range uint16(16) {
			must(t, r.SetDesc(i, addr, 64, descWrite, 0))
		}
		offer := func(n int) bool {
			for range n {
				must(t, r.Offer(r.AvailIdx()%16))
			}
			kick, err := r.Publish()
			must(t, err)
			return kick
		}
		// The device wants kicks: EnableNotification (avail_event = its
		// next entry, or NO_NOTIFY cleared).
		if _, err := q.EnableNotification(); err != nil {
			t.Fatal(err)
		}
		if !offer(1) {
			t.Errorf("event idx %v: no kick while the device asked for them", eventIdx)
		}
		// Without a new EnableNotification the device wants no more (with
		// EVENT_IDX the index has passed avail_event).
		if err := q.DisableNotification(); err != nil {
			t.Fatal(err)
		}
		if offer(2) {
			t.Errorf("event idx %v: kick while the device suppressed them", eventIdx)
		}
		var c virtio.Chain
		for range 3 {
			if ok, err := q.Pop(&c); !ok || err != nil {
				t.Fatal(ok, err)
			}
			must(t, q.PushNoPublish(c.Head, 0))
		}
		// Interrupts: disabled, the device does not signal...
		must(t, r.DisableInterrupts())
		must(t, q.Publish())
		need, err := q.NeedsNotification()
		must(t, err)
		if eventIdx {
			// used_event was never written: 0, which the first entry passes.
			if !need {
				t.Error("event idx: no interrupt for the first used entries")
			}
		} else if need {
			t.Error("interrupt while the driver disabled them")
		}
		for range 3 {
			r.NextUsed()
		}
		// ...enabled, the next used entry is signalled, and a pending entry
		// makes EnableInterrupts say so.
		pending, err := r.EnableInterrupts()
		if err != nil || pending {
			t.Fatalf("EnableInterrupts = %v, %v with nothing used", pending, err)
		}
		offer(1)
		q.Pop(&c)
		must(t, q.Push(c.Head, 0))
		if need, _ := q.NeedsNotification(); !need {
			t.Errorf("event idx %v: no interrupt after EnableInterrupts", eventIdx)
		}
		if pending, _ := r.EnableInterrupts(); !pending {
			t.Errorf("event idx %v: EnableInterrupts missed a used entry", eventIdx)
		}
	}
}

// TestRingRejectsBadDevice: a used index too far ahead or a descriptor
// index beyond the ring is an error, not a panic.
func TestRingRejectsBadDevice(t *testing.T) {
	m, _, r, _ := ringPair(t, 8, false, 1)
	must(t, m.Store16Release(r.Used+2, 9))
	if _, _, _, err := r.NextUsed(); err == nil || !strings.Contains(err.Error(), "9 entries ahead") {
		t.Errorf("used index 9 on a ring of 8: %v", err)
	}
	must(t, m.Store16Release(r.Used+2, 1))
	must(t, m.Write32(r.Used+4, 8))
	if _, _, _, err := r.NextUsed(); err == nil || !strings.Contains(err.Error(), "descriptor 8") {
		t.Errorf("used id 8 on a ring of 8: %v", err)
	}
}

// TestMemory: the memfd is sealed against shrinking, the two regions map
// the two halves of the file at their guest addresses, and user addresses
// translate back.
func TestMemory(t *testing.T) {
	m, err := NewMemory(3<<20, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	seals, err := unix.FcntlInt(uintptr(m.FD()), unix.F_GET_SEALS, 0)
	if err != nil || seals&unix.F_SEAL_SHRINK == 0 || seals&unix.F_SEAL_SEAL == 0 {
		t.Errorf("seals %#x, %v; want SHRINK and SEAL", seals, err)
	}
	if err := unix.Ftruncate(m.FD(), 4096); err == nil {
		t.Error("the memfd could be shrunk")
	}
	regs := m.Regions()
	if len(regs) != 2 || regs[0].GPA != 0 || regs[1].GPA != HighGPA || regs[1].Offset != regs[0].Size ||
		regs[1].UserAddr != regs[0].UserAddr+regs[0].Size || regs[0].Size+regs[1].Size < 3<<20 {
		t.Fatalf("regions %+v", regs)
	}
	// A write through the high region lands in the second half of the file.
	must(t, m.Write(HighGPA+5, []byte("high")))
	got := make([]byte, 4)
	if _, err := unix.Pread(m.FD(), got, int64(regs[1].Offset+5)); err != nil || string(got) != "high" {
		t.Errorf("file at the high region's offset: %q, %v", got, err)
	}
	if ua, err := m.UserAddr(HighGPA + 5); err != nil || ua != regs[1].UserAddr+5 {
		t.Errorf("UserAddr = %#x, %v", ua, err)
	}
	if _, err := m.UserAddr(regs[0].Size); err == nil {
		t.Error("an address in the hole translated")
	}
	// The allocator moves to the second region when the first is full.
	a := newAllocator(m)
	p1, err1 := a.alloc(regs[0].Size/2, 64)
	p2, err2 := a.alloc(regs[0].Size/2, 64)
	if err1 != nil || err2 != nil || p1 >= regs[0].Size || p2 != HighGPA {
		t.Errorf("allocations at %#x, %#x (%v, %v)", p1, p2, err1, err2)
	}
	if _, err := a.alloc(regs[1].Size, 1); err == nil {
		t.Error("allocated past the end of memory")
	}
	if _, err := NewMemory(1<<20, 3); err == nil {
		t.Error("three regions accepted")
	}
}

func TestPattern(t *testing.T) {
	var stream []byte
	for off := int64(0); off < 3*PatternPeriod; off += 4096 {
		stream = append(stream, PatternAt(off, 4096)...)
	}
	if !bytes.Equal(stream[:1000], stream[PatternPeriod:PatternPeriod+1000]) {
		t.Error("pattern does not repeat with its period")
	}
	if bytes.Equal(stream[:1000], stream[65536:66536]) {
		t.Error("pattern repeats at 64 KiB")
	}
	if err := CheckPattern(0, stream); err != nil {
		t.Error(err)
	}
	if err := CheckPattern(100, stream[100:190000]); err != nil {
		t.Error(err)
	}
	stream[150000] ^= 0x40
	if err := CheckPattern(0, stream); err == nil || !strings.Contains(err.Error(), "stream byte 150000") {
		t.Errorf("corrupted byte: %v", err)
	}
	// Data at the wrong offset (a lost or repeated chunk) does not match.
	if err := CheckPattern(4096, stream[:4096]); err == nil {
		t.Error("a chunk at the wrong offset matched")
	}
	if a, b := Mono(), Mono(); b < a || a <= 0 {
		t.Errorf("Mono %d then %d", a, b)
	}
}

// TestPatternFullChunks is the regression test for the table's tail: it
// was filled with one overlapping copy, so its last 15 bytes were zero
// and a 64 KiB chunk starting in the last 15 bytes of a period was wrong
// on both ends (a mismatch a few hundred MB into a stream).
func TestPatternFullChunks(t *testing.T) {
	for off := int64(0); off < 2*PatternPeriod; off++ {
		if off%PatternPeriod > 64 && off%PatternPeriod < PatternPeriod-64 {
			continue
		}
		c := PatternAt(off, MaxPayload)
		for j := range c {
			if want := pattern[(off+int64(j))%PatternPeriod]; c[j] != want {
				t.Fatalf("PatternAt(%d)[%d] = %#x, want %#x", off, j, c[j], want)
			}
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
