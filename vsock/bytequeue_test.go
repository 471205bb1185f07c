package vsock

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestByteQueueFIFO: random appends and partial consumes come out in
// order, byte for byte, against a plain slice model.
func TestByteQueueFIFO(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var q byteQueue
	var model []byte
	next := byte(0)
	for i := 0; i < 20000; i++ {
		if r.IntN(2) == 0 {
			b := make([]byte, r.IntN(3000))
			for j := range b {
				b[j] = next
				next++
			}
			q.Append(b)
			model = append(model, b...)
		} else if q.Len() > 0 {
			n := r.IntN(q.Len() + 1)
			if !bytes.Equal(q.Bytes()[:n], model[:n]) {
				t.Fatalf("step %d: queue front differs from the model", i)
			}
			q.Consume(n)
			model = model[n:]
		}
		if q.Len() != len(model) {
			t.Fatalf("step %d: Len %d, model %d", i, q.Len(), len(model))
		}
	}
	if !bytes.Equal(q.Bytes(), model) {
		t.Fatal("queue differs from the model at the end")
	}
	q.Reset()
	if q.Len() != 0 || q.buf != nil {
		t.Error("Reset kept bytes or the array")
	}
}

// TestByteQueueDrainIsLinear: a 1 MiB buffer drained by 4 KiB partial
// writes, with appends in between, moves each byte a bounded number of
// times (the old flush moved the rest on every write: 128 MiB here).
func TestByteQueueDrainIsLinear(t *testing.T) {
	var q byteQueue
	q.Append(make([]byte, 1<<20))
	moved := 0
	for q.Len() > 0 {
		before := q.off
		q.Append(make([]byte, 16))
		if q.off < before {
			moved += q.Len() - 16
		}
		q.Consume(min(4096, q.Len()))
	}
	if moved > 2<<20 {
		t.Errorf("moved %d bytes to drain 1 MiB; want at most 2 MiB", moved)
	}
	if q.buf != nil {
		t.Error("an emptied queue kept its 1 MiB array")
	}
}
