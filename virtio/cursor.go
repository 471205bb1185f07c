package virtio

// Reader is a cursor over a chain's device-readable buffers: what the
// driver wrote, consumed in order. Devices use it instead of offset
// arithmetic on the views: a header is Read, the payload after it taken as
// Views for scatter-gather I/O. It never reads past the chain.
type Reader struct {
	bufs [][]byte
	i    int    // current buffer
	off  uint64 // offset in bufs[i]
	left uint64 // bytes not yet consumed
}

// Reader returns a cursor at the start of the chain's readable buffers.
func (c *Chain) Reader() Reader {
	r := Reader{bufs: c.readable, left: c.rlen}
	r.advance(0) // step over leading empty buffers
	return r
}

// Len is the number of bytes not yet consumed.
func (r *Reader) Len() uint64 { return r.left }

// Read copies the next bytes into p and returns how many: len(p), or
// fewer at the end of the chain. It never fails (io.Reader minus the
// error: a short count is the end).
func (r *Reader) Read(p []byte) int {
	n := 0
	for n < len(p) && r.i < len(r.bufs) {
		k := copy(p[n:], r.bufs[r.i][r.off:])
		n += k
		r.advance(uint64(k))
	}
	return n
}

// Views appends views of the next n bytes to dst and consumes them; at the
// end of the chain they cover fewer bytes, which Len tells beforehand.
func (r *Reader) Views(dst [][]byte, n uint64) [][]byte {
	for n > 0 && r.i < len(r.bufs) {
		seg := r.bufs[r.i][r.off:]
		if uint64(len(seg)) > n {
			seg = seg[:n]
		}
		dst = append(dst, seg)
		n -= uint64(len(seg))
		r.advance(uint64(len(seg)))
	}
	return dst
}

// advance consumes k bytes of the current buffer (k <= what it has left)
// and moves past buffers that are used up, empty ones included.
func (r *Reader) advance(k uint64) {
	r.off += k
	r.left -= k
	for r.i < len(r.bufs) && r.off == uint64(len(r.bufs[r.i])) {
		r.i++
		r.off = 0
	}
}

// Writer is a cursor over a chain's device-writable buffers: what the
// device fills for the driver, in order. Written is what Queue.Push is
// told. It never writes past the chain.
type Writer struct {
	r       Reader // the same walk over the writable buffers
	written uint64
}

// Writer returns a cursor at the start of the chain's writable buffers.
func (c *Chain) Writer() Writer {
	w := Writer{r: Reader{bufs: c.writable, left: c.wlen}}
	w.r.advance(0) // step over leading empty buffers
	return w
}

// Len is the room left.
func (w *Writer) Len() uint64 { return w.r.left }

// Written is the number of bytes written (or skipped) so far.
func (w *Writer) Written() uint64 { return w.written }

// Write copies p into the next bytes and returns how many: len(p), or
// fewer when the chain is full.
func (w *Writer) Write(p []byte) int {
	n := 0
	for n < len(p) && w.r.i < len(w.r.bufs) {
		k := copy(w.r.bufs[w.r.i][w.r.off:], p[n:])
		n += k
		w.r.advance(uint64(k))
	}
	w.written += uint64(n)
	return n
}

// Views appends views of the next n bytes of room to dst without
// consuming them, for a read(v) that fills them; Advance then consumes what
// was filled.
func (w *Writer) Views(dst [][]byte, n uint64) [][]byte {
	r := w.r // a copy: looking ahead consumes nothing
	return r.Views(dst, n)
}

// Advance consumes n bytes of room (n <= Len), counting them as written.
func (w *Writer) Advance(n uint64) {
	for n > 0 && w.r.i < len(w.r.bufs) {
		k := min(n, uint64(len(w.r.bufs[w.r.i]))-w.r.off)
		w.r.advance(k)
		n -= k
		w.written += k
	}
}
