package virtio_test

import (
	"fmt"
	"testing"
)

// BenchmarkQueuePopPush measures the device side of one chain: Pop (walk),
// Push (used entry and index) and NeedsNotification.
func BenchmarkQueuePopPush(b *testing.B) {
	for _, ndesc := range []int{1, 2, 4} {
		for _, eventIdx := range []bool{false, true} {
			b.Run(fmt.Sprintf("desc=%d/eventidx=%v", ndesc, eventIdx), func(b *testing.B) {
				r := newRing(b, 256, ndesc, eventIdx, false)
				r.step(b)
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					r.step(b)
				}
			})
		}
	}
}

// BenchmarkWalkIndirect is BenchmarkQueuePopPush over one indirect
// descriptor whose table holds n buffers.
func BenchmarkWalkIndirect(b *testing.B) {
	for _, n := range []int{1, 4, 16, 64} {
		b.Run(fmt.Sprintf("entries=%d", n), func(b *testing.B) {
			r := newRing(b, 256, n, false, true)
			r.step(b)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				r.step(b)
			}
		})
	}
}
