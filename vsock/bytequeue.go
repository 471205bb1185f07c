package vsock

// byteQueue is a FIFO of bytes: guest data the host socket has not taken
// yet. Taking a prefix only moves an offset; the unread bytes move to the
// front when an append would otherwise grow the array and at least half of
// it is already consumed, so every byte is moved O(1) times on average:
// draining a large buffer by many partial writes costs linear, not
// quadratic, time (the old flush memmoved the whole rest on each write).
type byteQueue struct {
	buf []byte // buf[off:] is queued
	off int
}

// Len is the number of queued bytes.
func (q *byteQueue) Len() int { return len(q.buf) - q.off }

// Bytes returns the queued bytes, valid until the next Append or Consume.
func (q *byteQueue) Bytes() []byte { return q.buf[q.off:] }

// Append queues a copy of b.
func (q *byteQueue) Append(b []byte) {
	if q.off > 0 && len(q.buf)+len(b) > cap(q.buf) && q.off >= len(q.buf)/2 {
		n := copy(q.buf, q.buf[q.off:])
		q.buf, q.off = q.buf[:n], 0
	}
	q.buf = append(q.buf, b...)
}

// Consume drops the first n queued bytes (n <= Len). An emptied queue lets
// go of a large array, so that an idle connection does not keep it.
func (q *byteQueue) Consume(n int) {
	q.off += n
	if q.off == len(q.buf) {
		q.off = 0
		if cap(q.buf) > idleQueueCap {
			q.buf = nil
		} else {
			q.buf = q.buf[:0]
		}
	}
}

// Reset drops everything and the array.
func (q *byteQueue) Reset() { q.buf, q.off = nil, 0 }

// idleQueueCap is the largest array an empty queue keeps.
const idleQueueCap = 4096
