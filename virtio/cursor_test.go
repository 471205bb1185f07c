package virtio

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// randomBufs splits n bytes into buffers of random sizes, empty ones
// included, as a chain may hold.
func randomBufs(r *rand.Rand, n int) [][]byte {
	var bufs [][]byte
	for n > 0 {
		k := min(n, r.IntN(40))
		bufs = append(bufs, make([]byte, k))
		n -= k
	}
	return bufs
}

func concat(bufs [][]byte) []byte { return bytes.Join(bufs, nil) }

// TestReaderModel: random Reads and Views over random buffer layouts give
// the bytes in order, stop at the end, and keep Len right.
func TestReaderModel(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for iter := 0; iter < 2000; iter++ {
		n := r.IntN(300)
		bufs := randomBufs(r, n)
		for i, b := range bufs {
			for j := range b {
				b[j] = byte(i*31 + j)
			}
		}
		want := concat(bufs)
		c := &Chain{readable: bufs, rlen: uint64(n)}
		rd := c.Reader()
		var got []byte
		for rd.Len() > 0 {
			k := r.IntN(50)
			before := rd.Len()
			if r.IntN(2) == 0 {
				p := make([]byte, k)
				m := rd.Read(p)
				if m != min(k, int(before)) {
					t.Fatalf("Read(%d) with %d left = %d", k, before, m)
				}
				got = append(got, p[:m]...)
			} else {
				v := rd.Views(nil, uint64(k))
				part := concat(v)
				if len(part) != min(k, int(before)) {
					t.Fatalf("Views(%d) with %d left covered %d", k, before, len(part))
				}
				got = append(got, part...)
			}
			if rd.Len() != before-uint64(min(k, int(before))) {
				t.Fatalf("Len %d after consuming %d of %d", rd.Len(), k, before)
			}
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("layout %v: read %x, want %x", bufs, got, want)
		}
		if rd.Read(make([]byte, 1)) != 0 || len(rd.Views(nil, 1)) != 0 {
			t.Fatal("read past the end")
		}
	}
}

// TestWriterModel: random Writes and Views+Advance fill the buffers in
// order, never past the end, and count Written.
func TestWriterModel(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for iter := 0; iter < 2000; iter++ {
		n := r.IntN(300)
		bufs := randomBufs(r, n)
		c := &Chain{writable: bufs, wlen: uint64(n)}
		w := c.Writer()
		var want []byte
		next := byte(1)
		for w.Len() > 0 {
			k := r.IntN(50)
			room := w.Len()
			take := min(k, int(room))
			src := make([]byte, k)
			for j := range src {
				src[j] = next
				next++
			}
			if r.IntN(2) == 0 {
				if m := w.Write(src); m != take {
					t.Fatalf("Write(%d) with %d room = %d", k, room, m)
				}
			} else {
				v := w.Views(nil, uint64(k))
				if w.Len() != room {
					t.Fatal("Views consumed room")
				}
				filled := 0
				for _, b := range v {
					filled += copy(b, src[filled:])
				}
				if filled != take {
					t.Fatalf("Views(%d) with %d room covered %d", k, room, filled)
				}
				w.Advance(uint64(take))
			}
			want = append(want, src[:take]...)
			if w.Len() != room-uint64(take) || w.Written() != uint64(len(want)) {
				t.Fatalf("Len %d Written %d after %d of %d", w.Len(), w.Written(), take, room)
			}
		}
		if !bytes.Equal(concat(bufs), want) {
			t.Fatalf("buffers %x, want %x", concat(bufs), want)
		}
		if w.Write([]byte{9}) != 0 {
			t.Fatal("wrote past the end")
		}
	}
}
