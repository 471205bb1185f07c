package rng

import (
	"testing"
	"time"
)

func TestBucket(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := newBucket(100, 50, t0)
	if n := b.refill(t0); n != 50 {
		t.Fatalf("a new bucket holds %d; want its burst 50", n)
	}
	b.take(50)
	if w := b.wait(1); w != 10*time.Millisecond {
		t.Errorf("empty bucket: wait %v for 1 byte; want 10ms", w)
	}
	if w := b.wait(50); w != 500*time.Millisecond {
		t.Errorf("empty bucket: wait %v for 50 bytes; want 500ms", w)
	}
	if n := b.refill(t0.Add(5 * time.Millisecond)); n != 0 {
		t.Errorf("after 5ms at 100 B/s: %d tokens; want 0 (half a byte)", n)
	}
	if w := b.wait(1); w != 5*time.Millisecond {
		t.Errorf("half a byte in: wait %v; want 5ms", w)
	}
	if n := b.refill(t0.Add(10 * time.Millisecond)); n != 1 {
		t.Errorf("after 10ms: %d tokens; want 1 (the half bytes add up)", n)
	}
	if n := b.refill(t0.Add(time.Hour)); n != 50 {
		t.Errorf("after an hour: %d tokens; want the burst 50", n)
	}
	if w := b.wait(50); w != 0 {
		t.Errorf("full bucket: wait %v; want 0", w)
	}
	// Extremes stay in range: the largest rate and burst over a long gap.
	b = newBucket(MaxRate, MaxRate, t0)
	b.take(MaxRate)
	if n := b.refill(t0.Add(1000 * time.Hour)); n != MaxRate {
		t.Errorf("max bucket refilled to %d; want %d", n, MaxRate)
	}
	b = newBucket(1, MaxRate, t0)
	b.take(MaxRate)
	if n := b.refill(t0.Add(1 << 62)); n != MaxRate {
		t.Errorf("slow bucket refilled to %d; want %d", n, MaxRate)
	}
}
