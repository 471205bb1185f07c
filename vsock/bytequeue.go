package vsock

import "sync"

// byteQueue is a FIFO of bytes: guest data the host socket has not taken
// yet. It keeps its bytes in fixed-size chunks taken from pools shared by
// every connection and given back as soon as they are drained, so:
//
//   - appending never moves queued bytes (each byte is copied once, in);
//     taking a prefix only moves an offset; draining by many partial
//     writes costs linear time;
//   - a busy connection that fills and drains its window over and over
//     reuses the same chunks instead of growing a fresh array each time
//     (the single growing array this replaces was let go of at every
//     drain, and refilling it cost more CPU than the data itself:
//     docs/notes/performance.md, "Buffered guest data");
//   - an empty queue holds nothing, and a queue under 64 KiB holds 4 KiB
//     chunks only, so the memory a connection pins beyond its queued bytes
//     is at most one partly used chunk: 4 KiB while it is small.
type byteQueue struct {
	chunks [][]byte // each of cap smallChunk or largeChunk; bytes live in [0:len]
	head   int      // offset of the first queued byte in chunks[0]
	n      int      // queued bytes
}

const (
	smallChunk = 4 << 10
	largeChunk = 64 << 10
)

var (
	smallChunks = sync.Pool{New: func() any { return new([smallChunk]byte) }}
	largeChunks = sync.Pool{New: func() any { return new([largeChunk]byte) }}
)

// Len is the number of queued bytes.
func (q *byteQueue) Len() int { return q.n }

// Append queues a copy of b.
func (q *byteQueue) Append(b []byte) {
	for len(b) > 0 {
		last := len(q.chunks) - 1
		if last < 0 || len(q.chunks[last]) == cap(q.chunks[last]) {
			q.chunks = append(q.chunks, q.newChunk())
			last++
		}
		c := q.chunks[last]
		k := copy(c[len(c):cap(c)], b)
		q.chunks[last] = c[:len(c)+k]
		q.n += k
		b = b[k:]
	}
}

// newChunk takes an empty chunk: a small one while the queue holds less
// than a large chunk's worth, a large one after.
func (q *byteQueue) newChunk() []byte {
	if q.n < largeChunk {
		return smallChunks.Get().(*[smallChunk]byte)[:0]
	}
	return largeChunks.Get().(*[largeChunk]byte)[:0]
}

// Views appends to dst views of the first n queued bytes (n <= Len), in
// order, one per chunk; they are valid until the next Consume or Reset.
func (q *byteQueue) Views(dst [][]byte, n int) [][]byte {
	off := q.head
	for _, c := range q.chunks {
		if n == 0 {
			break
		}
		v := c[off:]
		if len(v) > n {
			v = v[:n]
		}
		dst = append(dst, v)
		n -= len(v)
		off = 0
	}
	return dst
}

// Consume drops the first k queued bytes (k <= Len), giving drained chunks
// back to their pool.
func (q *byteQueue) Consume(k int) {
	q.n -= k
	q.head += k
	if q.n == 0 {
		q.Reset()
		return
	}
	// Every chunk but the last is full (Append starts a chunk only when
	// the last one is), so one that head has passed is drained.
	for len(q.chunks) > 1 && q.head >= len(q.chunks[0]) {
		q.head -= len(q.chunks[0])
		putChunk(q.chunks[0])
		q.chunks[0] = nil
		q.chunks = q.chunks[1:]
	}
}

// Reset drops everything and gives the chunks back.
func (q *byteQueue) Reset() {
	for i, c := range q.chunks {
		putChunk(c)
		q.chunks[i] = nil
	}
	q.chunks, q.head, q.n = q.chunks[:0], 0, 0
	if cap(q.chunks) > 16 {
		q.chunks = nil
	}
}

func putChunk(c []byte) {
	switch cap(c) {
	case smallChunk:
		smallChunks.Put((*[smallChunk]byte)(c[:smallChunk]))
	case largeChunk:
		largeChunks.Put((*[largeChunk]byte)(c[:largeChunk]))
	default:
		panic("vsock: byteQueue chunk of a foreign size") // host invariant
	}
}
