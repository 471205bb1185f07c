package guestmem

import (
	"errors"
	"sync"
	"testing"
)

func twoRegions(t *testing.T) *Memory {
	t.Helper()
	m, err := New(
		Region{GPA: 0x1000, Data: make([]byte, 0x1000)},
		Region{GPA: 0x2000, Data: make([]byte, 0x1000)}, // adjacent
		Region{GPA: 0x10000, Data: make([]byte, 0x1000)},
	)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestBounds(t *testing.T) {
	m := twoRegions(t)
	tests := []struct {
		name string
		gpa  uint64
		n    int
		ok   bool
	}{
		{"start", 0x1000, 16, true},
		{"below", 0xfff, 1, false},
		{"span adjacent", 0x1ff8, 16, true},
		{"end of adjacent", 0x2ff0, 16, true},
		{"into hole", 0x2ff8, 16, false},
		{"hole", 0x5000, 1, false},
		{"last region end", 0x10ff0, 16, true},
		{"past end", 0x10ff1, 16, false},
		{"wrap", ^uint64(0) - 3, 16, false},
		{"empty at end", 0x11000, 0, false},
		{"empty inside", 0x1000, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := make([]byte, tc.n)
			for i := range p {
				p[i] = byte(i + 1)
			}
			err := m.Write(tc.gpa, p)
			if (err == nil) != tc.ok {
				t.Fatalf("Write(%#x, %d) = %v, want ok=%v", tc.gpa, tc.n, err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrOutOfBounds) {
				t.Fatalf("error %v is not ErrOutOfBounds", err)
			}
			q := make([]byte, tc.n)
			if err := m.Read(tc.gpa, q); (err == nil) != tc.ok {
				t.Fatalf("Read: %v", err)
			}
			if tc.ok && string(p) != string(q) {
				t.Fatalf("read back %x, wrote %x", q, p)
			}
		})
	}
}

func TestFailedWriteHasNoEffect(t *testing.T) {
	m := twoRegions(t)
	p := []byte{1, 2, 3, 4}
	if err := m.Write(0x2ffe, p); err == nil {
		t.Fatal("write into hole succeeded")
	}
	v, err := m.Read16(0x2ffe)
	if err != nil || v != 0 {
		t.Fatalf("partial write left %#x (%v)", v, err)
	}
}

func TestSliceStaysInRegion(t *testing.T) {
	m := twoRegions(t)
	if _, err := m.Slice(0x1ff8, 16); err == nil {
		t.Fatal("Slice across regions succeeded")
	}
	b, err := m.Slice(0x1ff8, 8)
	if err != nil {
		t.Fatal(err)
	}
	if cap(b) != 8 {
		t.Fatalf("view capacity %d lets callers grow past the range", cap(b))
	}
}

func TestOverlapRejected(t *testing.T) {
	_, err := New(Region{GPA: 0, Data: make([]byte, 8192)}, Region{GPA: 4096, Data: make([]byte, 4096)})
	if err == nil {
		t.Fatal("overlapping regions accepted")
	}
	if _, err := New(Region{GPA: ^uint64(0) - 10, Data: make([]byte, 4096)}); err == nil {
		t.Fatal("wrapping region accepted")
	}
}

func TestFixedWidth(t *testing.T) {
	m := twoRegions(t)
	if err := m.Write64(0x1ffc, 0x0102030405060708); err != nil {
		t.Fatal(err)
	}
	if v, _ := m.Read64(0x1ffc); v != 0x0102030405060708 {
		t.Fatalf("Read64 = %#x", v)
	}
	if v, _ := m.Read32(0x1ffc); v != 0x05060708 {
		t.Fatalf("Read32 = %#x (want little endian)", v)
	}
}

func TestAtomic16(t *testing.T) {
	m := twoRegions(t)
	if err := m.Write32(0x1100, 0xaaaabbbb); err != nil {
		t.Fatal(err)
	}
	if err := m.Store16Release(0x1102, 0x1234); err != nil {
		t.Fatal(err)
	}
	if v, _ := m.Read32(0x1100); v != 0x1234bbbb {
		t.Fatalf("word = %#x, neighbour clobbered", v)
	}
	if v, _ := m.Load16Acquire(0x1100); v != 0xbbbb {
		t.Fatalf("Load16Acquire = %#x", v)
	}
	if _, err := m.Load16Acquire(0x1101); !errors.Is(err, ErrMisaligned) {
		t.Fatalf("odd address: %v", err)
	}
	if _, err := m.Load16Acquire(0x3000); !errors.Is(err, ErrOutOfBounds) {
		t.Fatalf("hole: %v", err)
	}
	// Concurrent stores to both halves never lose either.
	var wg sync.WaitGroup
	for half := uint64(0); half < 2; half++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10000; i++ {
				if err := m.Store16Release(0x1200+2*half, uint16(i)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if v, _ := m.Read32(0x1200); v != 9999<<16|9999 {
		t.Fatalf("word = %#x after concurrent stores", v)
	}
}

func TestTranslateUser(t *testing.T) {
	m, err := New(
		Region{GPA: 0, Data: make([]byte, 0x1000), UserAddr: 0x7f0000000000},
		Region{GPA: 0x100000, Data: make([]byte, 0x1000), UserAddr: 0x7f1000000000},
	)
	if err != nil {
		t.Fatal(err)
	}
	if g, err := m.TranslateUser(0x7f1000000010, 16); err != nil || g != 0x100010 {
		t.Fatalf("TranslateUser = %#x, %v", g, err)
	}
	if _, err := m.TranslateUser(0x7f1000000ff8, 16); err == nil {
		t.Fatal("range past region end translated")
	}
}

func TestAnonymous(t *testing.T) {
	m, err := NewAnonymous(Range{GPA: 0, Size: 1 << 20}, Range{GPA: 1 << 32, Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Write32(1<<32+8, 7); err != nil {
		t.Fatal(err)
	}
	if a, err := m.HostAddr(1 << 32); err != nil || a == 0 {
		t.Fatalf("HostAddr = %#x, %v", a, err)
	}
	if _, err := NewAnonymous(Range{GPA: 0, Size: 100}); err == nil {
		t.Fatal("unaligned size accepted")
	}
}
