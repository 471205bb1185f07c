package vsock

import (
	"bytes"
	"math/rand/v2"
	"runtime"
	"testing"
)

// front reads the first n queued bytes through Views.
func front(q *byteQueue, n int) []byte {
	var out []byte
	for _, v := range q.Views(nil, n) {
		out = append(out, v...)
	}
	return out
}

// TestByteQueueFIFO: random appends (small ones and ones that span
// chunks of both sizes) and partial consumes come out in order, byte for
// byte, against a plain slice model.
func TestByteQueueFIFO(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var q byteQueue
	var model []byte
	next := byte(0)
	for i := 0; i < 20000; i++ {
		if r.IntN(2) == 0 {
			size := r.IntN(3000)
			if r.IntN(10) == 0 {
				size = r.IntN(200 << 10)
			}
			b := make([]byte, size)
			for j := range b {
				b[j] = next
				next++
			}
			q.Append(b)
			model = append(model, b...)
		} else if q.Len() > 0 {
			n := r.IntN(q.Len() + 1)
			if !bytes.Equal(front(&q, n), model[:n]) {
				t.Fatalf("step %d: queue front differs from the model", i)
			}
			q.Consume(n)
			model = model[n:]
		}
		if q.Len() != len(model) {
			t.Fatalf("step %d: Len %d, model %d", i, q.Len(), len(model))
		}
		if len(model) > 1<<20 {
			q.Consume(q.Len() - 1000)
			model = model[len(model)-1000:]
		}
	}
	if !bytes.Equal(front(&q, q.Len()), model) {
		t.Fatal("queue differs from the model at the end")
	}
	q.Reset()
	if q.Len() != 0 || len(q.chunks) != 0 {
		t.Error("Reset kept bytes or chunks")
	}
}

// TestByteQueueNeverMoves: queued bytes stay where they were copied in,
// however much is appended behind them or consumed before them, so a
// drain by many partial writes costs linear time.
func TestByteQueueNeverMoves(t *testing.T) {
	var q byteQueue
	q.Append(make([]byte, 3000))
	q.Consume(1000)
	a := &q.Views(nil, 1)[0][0]
	q.Append(make([]byte, 1<<20))
	if b := &q.Views(nil, 1)[0][0]; a != b {
		t.Error("appending 1 MiB moved the queued bytes")
	}
}

// TestByteQueueMemory: an empty queue holds no chunk; a small one holds
// small chunks only; a drained one gives everything back.
func TestByteQueueMemory(t *testing.T) {
	var q byteQueue
	q.Append(make([]byte, 100))
	if len(q.chunks) != 1 || cap(q.chunks[0]) != smallChunk {
		t.Fatalf("100 bytes: %d chunks, first of cap %d; want one small chunk", len(q.chunks), cap(q.chunks[0]))
	}
	q.Append(make([]byte, 1<<20))
	held := 0
	for _, c := range q.chunks {
		held += cap(c)
	}
	if held > q.Len()+largeChunk {
		t.Errorf("%d bytes queued in %d bytes of chunks; want at most one chunk of slack", q.Len(), held)
	}
	q.Consume(q.Len() - 10)
	if len(q.chunks) != 1 {
		t.Errorf("10 bytes left in %d chunks; want 1", len(q.chunks))
	}
	q.Consume(10)
	if len(q.chunks) != 0 || q.head != 0 {
		t.Errorf("drained queue keeps %d chunks, head %d", len(q.chunks), q.head)
	}
}

// TestByteQueueReuse: a connection that fills and drains a 1 MiB window
// over and over reuses pooled chunks instead of allocating them. Without
// reuse each cycle allocates at least the 1 MiB of chunks (the growing
// array this replaced: some 30 arrays, 4 MiB in all). The bound leaves
// room for the race detector, under which sync.Pool drops a quarter of
// what is put back on purpose (about 256 KiB a cycle here).
func TestByteQueueReuse(t *testing.T) {
	var q byteQueue
	piece := make([]byte, 4096)
	cycle := func() {
		for range 256 {
			q.Append(piece)
		}
		for q.Len() > 0 {
			q.Consume(min(q.Len(), 48<<10))
		}
	}
	cycle()
	const runs = 20
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		cycle()
	}
	runtime.ReadMemStats(&after)
	if perCycle := (after.TotalAlloc - before.TotalAlloc) / runs; perCycle > 512<<10 {
		t.Errorf("%d bytes allocated per 1 MiB fill and drain; want the chunks reused", perCycle)
	}
}
