package blk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/bits"
	"testing"

	"github.com/microvm/microvm/virtio"
)

// savedOverlay writes a few blocks into a fresh overlay of size bytes and
// returns it with its saved form.
func savedOverlay(t testing.TB, size int) (*overlay, []byte) {
	o, _ := testOverlay(t, size)
	block := make([]byte, CopyOnWriteBlockSize)
	for _, w := range []struct {
		off uint64
		b   byte
		n   int
	}{{0, 1, 512}, {3 * CopyOnWriteBlockSize, 2, CopyOnWriteBlockSize}, {uint64(size) - 512, 3, 512}} {
		if err := o.write([][]byte{bytes.Repeat([]byte{w.b}, w.n)}, w.off, uint64(w.n), block); err != nil {
			t.Fatal(err)
		}
	}
	data, err := io.ReadAll(o.saved())
	if err != nil {
		t.Fatal(err)
	}
	return o, data
}

// diskBytes reads the whole disk through the overlay.
func diskBytes(t testing.TB, o *overlay) []byte {
	got := make([]byte, o.size)
	if _, err := o.read([][]byte{got}, 0, o.size, nil); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestOverlayRestoreRefusals: a saved overlay cut anywhere, with a byte
// more, with a header or bitmap that does not fit the disk, is refused
// with ErrBadState and leaves the fresh overlay unwritten (reading as the
// base); the saved form itself restores to the same disk.
func TestOverlayRestoreRefusals(t *testing.T) {
	const size = 9*CopyOnWriteBlockSize + 1024
	src, data := savedOverlay(t, size)
	fresh := func() *overlay { o, _ := testOverlay(t, size); return o }

	o := fresh()
	if err := o.restore(bytes.NewReader(data)); err != nil {
		t.Fatalf("restore: %v", err)
	}
	if !bytes.Equal(diskBytes(t, o), diskBytes(t, src)) || o.written.Load() != src.written.Load() {
		t.Fatal("the restored overlay differs from the saved one")
	}
	if err := o.restore(bytes.NewReader(data)); err == nil {
		t.Error("restore into a written overlay: accepted")
	}

	refuse := func(what string, b []byte) {
		t.Helper()
		o := fresh()
		base := diskBytes(t, o)
		err := o.restore(bytes.NewReader(b))
		if !errors.Is(err, virtio.ErrBadState) {
			t.Errorf("%s: %v; want ErrBadState", what, err)
		}
		if o.written.Load() != 0 || !bytes.Equal(diskBytes(t, o), base) {
			t.Errorf("%s: the refused overlay does not read as the base", what)
		}
	}
	// Every cut in the header and bitmap, then cuts through the data.
	for n := 0; n < len(data); n++ {
		if n < 48 || n%997 == 0 || n == len(data)-1 {
			refuse("cut short", data[:n])
		}
	}
	refuse("a byte more", append(bytes.Clone(data), 0))
	mutate := func(what string, f func(b []byte)) {
		b := bytes.Clone(data)
		f(b)
		refuse(what, b)
	}
	mutate("magic", func(b []byte) { b[7] = '2' })
	mutate("block size", func(b []byte) { binary.LittleEndian.PutUint32(b[8:], 512) })
	mutate("disk size", func(b []byte) { binary.LittleEndian.PutUint64(b[16:], size+512) })
	mutate("count", func(b []byte) { binary.LittleEndian.PutUint64(b[24:], 2) })
	mutate("bit past the end", func(b []byte) {
		w := binary.LittleEndian.Uint64(b[32:])
		binary.LittleEndian.PutUint64(b[32:], w|1<<12)
		binary.LittleEndian.PutUint64(b[24:], uint64(bits.OnesCount64(w|1<<12)))
	})
}

// FuzzOverlayRestore: whatever the bytes, restore refuses them with
// ErrBadState or leaves an overlay whose count matches its bitmap and
// whose disk reads whole; it never panics.
func FuzzOverlayRestore(f *testing.F) {
	const size = 5*CopyOnWriteBlockSize + 512
	_, data := savedOverlay(f, size)
	f.Add(data)
	f.Add(data[:40])
	f.Fuzz(func(t *testing.T, b []byte) {
		o, _ := testOverlay(t, size)
		if err := o.restore(bytes.NewReader(b)); err != nil {
			if !errors.Is(err, virtio.ErrBadState) {
				t.Fatalf("refused without ErrBadState: %v", err)
			}
			return
		}
		var n uint64
		for i := range o.present {
			n += uint64(bits.OnesCount64(o.present[i].Load()))
		}
		if n != o.written.Load() {
			t.Fatalf("bitmap has %d blocks, count %d", n, o.written.Load())
		}
		diskBytes(t, o)
	})
}

// TestOverlayHeaderSize: the saved header's layout is fixed.
func TestOverlayHeaderSize(t *testing.T) {
	if n := binary.Size(overlayHeader{}); n != overlayHeaderSize {
		t.Errorf("overlayHeader is %d bytes; the format says %d", n, overlayHeaderSize)
	}
}
