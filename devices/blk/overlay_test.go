package blk_test

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/microvm/microvm/devices/blk"
	"github.com/microvm/microvm/kvm/eventfd"
	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
)

const bs = blk.CopyOnWriteBlockSize

// cowEnv is an env whose device is a CopyOnWrite disk over a size-byte
// image (pattern bytes) with its overlay in a directory of its own, which
// it also returns. The image's modification time is set in the past, so
// that any write to it would move it.
func cowEnv(t *testing.T, size int, cfg blk.Config) (*env, string) {
	t.Helper()
	cfg.Path = image(t, size)
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	if err := os.Chtimes(cfg.Path, old, old); err != nil {
		t.Fatal(err)
	}
	cfg.CopyOnWrite = true
	if cfg.OverlayDir == "" {
		cfg.OverlayDir = t.TempDir()
	}
	return newEnv(t, cfg), cfg.OverlayDir
}

// baseState is an image's bytes and modification time.
type baseState struct {
	b     []byte
	mtime time.Time
}

func statBase(t *testing.T, path string) baseState {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return baseState{b, fi.ModTime()}
}

func (s baseState) check(t *testing.T, path string) {
	t.Helper()
	now := statBase(t, path)
	if !bytes.Equal(now.b, s.b) {
		t.Error("the base image's bytes changed")
	}
	if !now.mtime.Equal(s.mtime) {
		t.Errorf("the base image's modification time moved from %v to %v", s.mtime, now.mtime)
	}
}

// readDisk reads n bytes at byte offset off through the device.
func (e *env) readDisk(off, n int) []byte {
	e.t.Helper()
	r, st, used := e.do(tIn, uint64(off/blk.SectorSize), nil, n)
	if st != sOK || used != uint32(n)+1 {
		e.t.Fatalf("read %d bytes at %d: status %d, used %d", n, off, st, used)
	}
	return e.read(r.data, n)
}

func (e *env) writeDisk(off int, data []byte) {
	e.t.Helper()
	if _, st, _ := e.do(tOut, uint64(off/blk.SectorSize), data, 0); st != sOK {
		e.t.Fatalf("write %d bytes at %d: status %d", len(data), off, st)
	}
}

func fill(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }

// TestCopyOnWriteReadsBase: blocks the guest has not written are read from
// the image itself, not from a copy: bytes changed in the image behind the
// device's back show through, and the overlay holds nothing.
func TestCopyOnWriteReadsBase(t *testing.T) {
	e, _ := cowEnv(t, 1<<20, blk.Config{})
	if got := e.readDisk(0, 64<<10); !bytes.Equal(got, e.file()[:64<<10]) {
		t.Fatal("a fresh copy-on-write disk does not read as its image")
	}
	// Another writer of the image (flock is advisory): an untouched block
	// must come from the image as it is now.
	f, err := os.OpenFile(e.path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(fill(bs, 0x5a), 8*bs); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if got := e.readDisk(8*bs, bs); !bytes.Equal(got, fill(bs, 0x5a)) {
		t.Error("an untouched block was not read from the image")
	}
	if info, ok := e.dev.Overlay(); !ok || info.Written != 0 || info.BlockSize != bs {
		t.Errorf("overlay %+v, %v after reads only; want 0 blocks written", info, ok)
	}
}

// TestCopyOnWritePartialBlock: a write of part of a block keeps the rest
// of the block (it is copied from the image first), at the start, in the
// middle and at the end of blocks, and in a last block shorter than 4 KiB.
func TestCopyOnWritePartialBlock(t *testing.T) {
	const size = 16*bs + 3*blk.SectorSize // the last block has 3 sectors
	e, _ := cowEnv(t, size, blk.Config{})
	model := e.file()
	for _, w := range []struct{ off, n int }{
		{0, 512},                  // head of block 0
		{bs + 3*512, 1024},        // middle of block 1
		{3*bs - 512, 512},         // tail of block 2
		{4*bs + 512, 2 * bs},      // tail of 4, all of 5, head of 6
		{16*bs + 512, 512},        // middle of the short last block
		{10*bs + 1024, bs - 1024}, // the rest of block 10 after its head
	} {
		data := fill(w.n, byte(0xa0+w.off/bs))
		e.writeDisk(w.off, data)
		copy(model[w.off:], data)
	}
	if got := e.readDisk(0, size); !bytes.Equal(got, model) {
		for i := range got {
			if got[i] != model[i] {
				t.Fatalf("disk differs from the model first at byte %d (block %d): %#x, want %#x", i, i/bs, got[i], model[i])
			}
		}
	}
	// Block 5 was covered whole and needed no copy; the others were copied.
	if info, _ := e.dev.Overlay(); info.Written != 8 {
		t.Errorf("%d blocks in the overlay; want 8", info.Written)
	}
}

// TestCopyOnWriteBaseUnchanged: writes, write-zeroes, discards and flushes
// leave the image's bytes and modification time as they were, and the
// device reads the guest's writes back.
func TestCopyOnWriteBaseUnchanged(t *testing.T) {
	e, dir := cowEnv(t, 1<<20, blk.Config{})
	before := statBase(t, e.path)
	data := bytes.Repeat([]byte("overlay!"), 3*bs/8)
	e.writeDisk(7*512, data)
	e.writeDisk(100*bs, fill(bs, 1))
	if _, st, _ := e.do(tWriteZeroes, 0, append(segment(40, 8, 0), segment(97, 11, 1)...), 0); st != sOK {
		t.Fatalf("write zeroes: status %d", st)
	}
	if _, st, _ := e.do(tDiscard, 0, segment(256, 64, 0), 0); st != sOK {
		t.Fatalf("discard: status %d", st)
	}
	if _, st, _ := e.do(tFlush, 0, nil, 0); st != sOK {
		t.Fatalf("flush: status %d", st)
	}
	if got := e.readDisk(7*512, len(data)); !bytes.Equal(got, data) {
		t.Error("the write does not read back")
	}
	before.check(t, e.path)
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
		t.Errorf("the overlay directory holds %v (%v); the overlay must have no name", ents, err)
	}
	if s := e.dev.Stats(); s.Writes != 2 || s.Flushes != 1 || s.WriteZeroes != 1 || s.Discards != 1 || s.HostErrors != 0 {
		t.Errorf("stats %+v", s)
	}
}

// TestCopyOnWriteSpanningRuns: one read over blocks alternating between
// the overlay and the image, into buffers whose edges fall anywhere,
// returns each byte from the right layer.
func TestCopyOnWriteSpanningRuns(t *testing.T) {
	e, _ := cowEnv(t, 1<<20, blk.Config{})
	model := e.file()
	for _, w := range []struct{ off, n int }{{bs, bs}, {3 * bs, 2 * bs}, {6*bs + 512, 512}, {9 * bs, bs}} {
		data := fill(w.n, byte(0x10+w.off/bs))
		e.writeDisk(w.off, data)
		copy(model[w.off:], data)
	}
	const off, n = 512, 11*bs - 1024 // from inside block 0 to inside block 10
	hdr := e.put(header(tIn, off/512))
	bufs := []virtiotest.Buf{{Addr: hdr, Len: 16}}
	var addrs []uint64
	var lens []int
	for done, i := 0, 0; done < n; i++ {
		l := min([]int{700, 5000, 1, 4096, 3333}[i%5], n-done)
		a := e.mem.Alloc(uint64(l), 1)
		bufs = append(bufs, virtiotest.Buf{Addr: a, Len: uint32(l), Writable: true})
		addrs, lens = append(addrs, a), append(lens, l)
		done += l
	}
	status := e.put([]byte{noStatus})
	bufs = append(bufs, virtiotest.Buf{Addr: status, Len: 1, Writable: true})
	e.q.AddIndirect(bufs...)
	_ = e.kick.Signal()
	if u := e.reap(1)[0]; u.Len != n+1 || e.read(status, 1)[0] != sOK {
		t.Fatalf("read: used %d, status %d", u.Len, e.read(status, 1)[0])
	}
	var got []byte
	for i, a := range addrs {
		got = append(got, e.read(a, lens[i])...)
	}
	if !bytes.Equal(got, model[off:off+n]) {
		t.Error("a read over overlay and image runs returned other bytes than the model")
	}
}

// TestCopyOnWriteZeroesAndDiscard: write-zeroes (with and without unmap)
// reads back as zeros over blocks of the image and of the overlay, whole
// and in part, and keeps the bytes around it; discard makes the whole
// blocks of its range read as zeros and leaves the blocks it covers in
// part alone.
func TestCopyOnWriteZeroesAndDiscard(t *testing.T) {
	e, _ := cowEnv(t, 1<<20, blk.Config{})
	model := e.file()
	e.writeDisk(20*bs, fill(2*bs, 0xee))
	copy(model[20*bs:], fill(2*bs, 0xee))
	zero := func(sector, n uint64, flags uint32) {
		t.Helper()
		if _, st, _ := e.do(tWriteZeroes, 0, segment(sector, uint32(n), flags), 0); st != sOK {
			t.Fatalf("write zeroes: status %d", st)
		}
		clear(model[sector*512 : (sector+n)*512])
	}
	zero(3, 2, 0)       // inside block 0, from the image
	zero(8*8+5, 8+2, 1) // tail of block 8, head of 10: unmap
	zero(20*8+1, 8, 0)  // across blocks 20 and 21, from the overlay
	zero(30*8, 16, 1)   // blocks 30 and 31 whole, from the image
	discard := func(sector, n uint64) {
		t.Helper()
		if _, st, _ := e.do(tDiscard, 0, segment(sector, uint32(n), 0), 0); st != sOK {
			t.Fatalf("discard: status %d", st)
		}
		first, end := (sector*512+bs-1)/bs, (sector+n)*512/bs
		for b := first; b < end; b++ {
			clear(model[b*bs : (b+1)*bs])
		}
	}
	discard(40*8, 24)   // blocks 40-42 whole
	discard(50*8+1, 14) // part of 50, 51 whole, part of 52
	discard(21*8, 8)    // block 21 whole, which the overlay held
	if got := e.readDisk(0, 64*bs); !bytes.Equal(got, model[:64*bs]) {
		for i := range got {
			if got[i] != model[i] {
				t.Fatalf("disk differs from the model first at byte %d (block %d): %#x, want %#x", i, i/bs, got[i], model[i])
			}
		}
	}
}

// TestCopyOnWriteRandom drives random reads, writes, write-zeroes,
// discards and flushes of random ranges through the device, several in
// flight at once (ranges in flight together do not overlap, though they
// share blocks, so that concurrent copy-ups of one block are exercised),
// and checks every read and the whole disk against a byte slice model.
func TestCopyOnWriteRandom(t *testing.T) {
	const size = 96*bs + 5*blk.SectorSize
	const sectors = size / blk.SectorSize
	const maxSectors = 24
	e, _ := cowEnv(t, size, blk.Config{InFlight: 4})
	before := statBase(t, e.path)
	model := e.file()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))

	// Guest memory for 4 requests, reused by every batch: the harness's
	// allocator never frees.
	type area struct{ hdr, data, status uint64 }
	var areas [4]area
	for i := range areas {
		areas[i] = area{e.mem.Alloc(16, 8), e.mem.Alloc(maxSectors*512, 8), e.mem.Alloc(1, 1)}
	}
	type op struct {
		typ       uint32
		sector, n uint64
		flags     uint32
		data      []byte
	}
	overlaps := func(ops []op, s, n uint64) bool {
		for _, o := range ops {
			if s < o.sector+o.n && o.sector < s+n {
				return true
			}
		}
		return false
	}
	for batch := range 400 {
		var ops []op
		for len(ops) < 1+rng.IntN(4) {
			s := rng.Uint64N(sectors)
			n := 1 + rng.Uint64N(min(maxSectors, sectors-s))
			if overlaps(ops, s, n) {
				continue
			}
			o := op{sector: s, n: n}
			switch p := rng.IntN(100); {
			case p < 40:
				o.typ = tIn
			case p < 75:
				o.typ = tOut
				o.data = make([]byte, n*512)
				for i := range o.data {
					o.data[i] = byte(rng.Uint32())
				}
			case p < 85:
				o.typ, o.flags = tWriteZeroes, uint32(rng.IntN(2))
			case p < 95:
				o.typ = tDiscard
			default:
				o.typ, o.sector, o.n = tFlush, 0, 0
			}
			ops = append(ops, o)
		}
		for i := range ops {
			o, a := &ops[i], areas[i]
			mustWrite(t, e, a.hdr, header(o.typ, o.sector))
			mustWrite(t, e, a.status, []byte{noStatus})
			bufs := []virtiotest.Buf{{Addr: a.hdr, Len: 16}}
			switch o.typ {
			case tIn, tOut:
				if o.typ == tOut {
					mustWrite(t, e, a.data, o.data)
				}
				// The data in one or two descriptors, split anywhere.
				l := uint32(o.n * 512)
				cut := uint32(rng.IntN(int(l)))
				for _, b := range [][2]uint32{{0, cut}, {cut, l}} {
					if b[1] > b[0] {
						bufs = append(bufs, virtiotest.Buf{Addr: a.data + uint64(b[0]), Len: b[1] - b[0], Writable: o.typ == tIn})
					}
				}
			case tWriteZeroes, tDiscard:
				mustWrite(t, e, a.data, segment(o.sector, uint32(o.n), o.flags))
				bufs = append(bufs, virtiotest.Buf{Addr: a.data, Len: 16})
			}
			bufs = append(bufs, virtiotest.Buf{Addr: a.status, Len: 1, Writable: true})
			if _, ok := e.q.Add(bufs...); !ok {
				t.Fatal("queue full")
			}
		}
		_ = e.kick.Signal()
		e.reap(len(ops))
		for i, o := range ops {
			if st := e.read(areas[i].status, 1)[0]; st != sOK {
				t.Fatalf("batch %d: type %d at sector %d+%d: status %d", batch, o.typ, o.sector, o.n, st)
			}
			lo, hi := o.sector*512, (o.sector+o.n)*512
			switch o.typ {
			case tIn:
				if got := e.read(areas[i].data, int(hi-lo)); !bytes.Equal(got, model[lo:hi]) {
					t.Fatalf("batch %d: read of sectors %d+%d differs from the model", batch, o.sector, o.n)
				}
			case tOut:
				copy(model[lo:], o.data)
			case tWriteZeroes:
				clear(model[lo:hi])
			case tDiscard:
				// This device's discard: the whole blocks of the range
				// read as zeros, the rest keeps its bytes. The disk's
				// short last block is whole when the range reaches the
				// end.
				first, end := (lo+bs-1)/bs*bs, hi/bs*bs
				if hi == size {
					end = size
				}
				if first < end {
					clear(model[first:end])
				}
			}
		}
	}
	if got := e.readDisk(0, size); !bytes.Equal(got, model) {
		t.Error("the disk differs from the model at the end")
	}
	before.check(t, e.path)
}

func mustWrite(t *testing.T, e *env, addr uint64, b []byte) {
	t.Helper()
	if err := e.mem.Write(addr, b); err != nil {
		t.Fatal(err)
	}
}

// TestCopyOnWriteBitmapBound: the overlay's bitmap is 1 bit per 4 KiB
// block, sized at Open (128 KiB for 4 GiB), and stays that size however
// much the guest writes.
func TestCopyOnWriteBitmapBound(t *testing.T) {
	for _, tc := range []struct {
		size   int64
		blocks uint64
		bitmap int
	}{
		{512, 1, 8},
		{bs + 512, 2, 8},
		{64 * bs, 64, 8},
		{65 * bs, 65, 16},
		{1 << 20, 256, 32},
		{4 << 30, 1 << 20, 128 << 10},
	} {
		p := filepath.Join(t.TempDir(), "sparse.img")
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, tc.size); err != nil {
			t.Fatal(err)
		}
		cfg := blk.Config{Path: p, CopyOnWrite: true, OverlayDir: t.TempDir(), Log: quietLog()}
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		d, err := blk.Open(cfg)
		runtime.ReadMemStats(&m1)
		if err != nil {
			t.Fatal(err)
		}
		info, ok := d.Overlay()
		if !ok || info.Blocks != tc.blocks || info.BitmapBytes != tc.bitmap {
			t.Errorf("%d-byte disk: overlay %+v; want %d blocks, a %d-byte bitmap", tc.size, info, tc.blocks, tc.bitmap)
		}
		// What Open allocates is the bitmap and a few small things.
		if alloc := m1.TotalAlloc - m0.TotalAlloc; alloc < uint64(tc.bitmap) || alloc > uint64(tc.bitmap)+32<<10 {
			t.Errorf("%d-byte disk: Open allocated %d bytes; want the %d-byte bitmap and under 32 KiB more", tc.size, alloc, tc.bitmap)
		}
		d.Close()
	}

	// Writes all over a disk leave the bitmap its size.
	e, _ := cowEnv(t, 1<<20, blk.Config{})
	for b := 0; b < 256; b += 3 {
		e.writeDisk(b*bs+512, fill(512, byte(b)))
	}
	if info, _ := e.dev.Overlay(); info.Written != 86 || info.BitmapBytes != 32 {
		t.Errorf("after 86 block writes: overlay %+v; want 86 written, a 32-byte bitmap", info)
	}
	if _, ok := (&blk.Device{}).Overlay(); ok {
		t.Error("a device without CopyOnWrite reports an overlay")
	}
}

// TestCopyOnWriteSnapshot: through the transport, a CopyOnWrite disk
// saves no state while its overlay is empty; once written, its state
// counts the overlay's blocks and its data is the overlay, and a fresh
// device over the same image, given both, reads as the saved disk did
// (written, partly written, zeroed, discarded and untouched blocks, and a
// short last block) while the original goes on with its own writes.
func TestCopyOnWriteSnapshot(t *testing.T) {
	const size = 64<<10 + 3*512 // 16 blocks and a short 17th
	e, d := newMMIOEnv(t, blk.Config{Path: image(t, size), CopyOnWrite: true, OverlayDir: t.TempDir()})
	if err := d.m.Quiesce(); err != nil {
		t.Fatal(err)
	}
	if s, err := d.m.SaveState(); err != nil || len(s.Device) != 0 {
		t.Fatalf("SaveState of a copy-on-write disk nothing was written to: %q, %v; want no state", s.Device, err)
	}
	if r, err := d.m.SaveData(); r != nil || err != nil {
		t.Fatalf("SaveData of an empty overlay: %v, %v; want none", r, err)
	}
	if err := d.m.Resume(); err != nil {
		t.Fatal(err)
	}
	e.writeDisk(0, fill(bs, 1))         // block 0 whole
	e.writeDisk(5*bs+512, fill(512, 2)) // block 5 in part
	e.writeDisk(6*bs, fill(2*bs, 0))    // blocks 6, 7: written zeros
	e.writeDisk(size-512, fill(512, 3)) // the short last block
	if _, st, _ := e.do(tDiscard, 0, segment(9*bs/512, 2*bs/512, 0), 0); st != sOK {
		t.Fatalf("discard: status %d", st)
	}
	want := e.readDisk(0, size)
	if err := d.m.Quiesce(); err != nil {
		t.Fatal(err)
	}
	s, err := d.m.SaveState()
	if err != nil {
		t.Fatalf("SaveState after writes: %v", err)
	}
	if string(s.Device) != `{"OverlayBlocks":7}` {
		t.Errorf("device state %s; want 7 overlay blocks", s.Device)
	}
	r, err := d.m.SaveData()
	if err != nil || r == nil {
		t.Fatalf("SaveData: %v, %v", r, err)
	}
	data, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	// Header, a one-word bitmap, 6 whole blocks and the 1.5 KiB last one.
	if wantLen := 32 + 8 + 6*bs + 3*512; len(data) != wantLen {
		t.Errorf("saved overlay of %d bytes; want %d", len(data), wantLen)
	}
	if err := d.m.Resume(); err != nil {
		t.Fatal(err)
	}
	e.writeDisk(bs, fill(bs, 4)) // the original goes on: not in the snapshot

	// A fresh device over the same image, restored.
	f := openEnv(t, blk.Config{Path: e.path, CopyOnWrite: true, OverlayDir: t.TempDir()})
	if err := f.dev.RestoreDeviceState(s.Device); !errors.Is(err, virtio.ErrBadState) {
		t.Errorf("state without its data: %v; want ErrBadState", err)
	}
	if err := f.dev.RestoreDeviceData(bytes.NewReader(data)); err != nil {
		t.Fatalf("RestoreDeviceData: %v", err)
	}
	if err := f.dev.RestoreDeviceState(s.Device); err != nil {
		t.Fatalf("RestoreDeviceState: %v", err)
	}
	kick, err := eventfd.NewNonblocking()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kick.Close() })
	f.kick = kick
	f.activate(nil)
	if got := f.readDisk(0, size); !bytes.Equal(got, want) {
		t.Error("the restored disk reads differently from the saved one")
	}
	if info, _ := f.dev.Overlay(); info.Written != 7 {
		t.Errorf("restored overlay holds %d blocks; want 7", info.Written)
	}

	// A plain disk saves no state or data and takes neither.
	plain, pd := newMMIOEnv(t, blk.Config{})
	plain.writeDisk(0, fill(512, 1))
	if err := pd.m.Quiesce(); err != nil {
		t.Fatal(err)
	}
	if s, err := pd.m.SaveState(); err != nil || len(s.Device) != 0 {
		t.Errorf("plain disk: SaveState %q, %v; want no device state", s.Device, err)
	}
	if r, err := pd.m.SaveData(); r != nil || err != nil {
		t.Errorf("plain disk: SaveData %v, %v; want none", r, err)
	}
	for _, st := range []string{"", "null"} {
		if err := plain.dev.RestoreDeviceState([]byte(st)); err != nil {
			t.Errorf("RestoreDeviceState(%q): %v", st, err)
		}
	}
	if err := plain.dev.RestoreDeviceState([]byte(`{"OverlayBlocks":1}`)); !errors.Is(err, virtio.ErrBadState) {
		t.Errorf("plain disk: RestoreDeviceState of a state: %v; want ErrBadState", err)
	}
	if err := plain.dev.RestoreDeviceData(bytes.NewReader(data)); !errors.Is(err, virtio.ErrBadState) {
		t.Errorf("plain disk: RestoreDeviceData: %v; want ErrBadState", err)
	}
}

// TestCopyOnWriteOpen: the image is shared with other readers and
// copy-on-write users (each with its own writes) and kept from writers;
// read-only together with copy-on-write, and an overlay directory that
// does not exist, are refused.
func TestCopyOnWriteOpen(t *testing.T) {
	p := image(t, 64<<10)
	dir := t.TempDir()
	open := func(cfg blk.Config) (*blk.Device, error) {
		cfg.Path, cfg.Log = p, quietLog()
		return blk.Open(cfg)
	}
	for _, tc := range []struct {
		cfg  blk.Config
		want string
	}{
		{blk.Config{CopyOnWrite: true, ReadOnly: true}, "read-only and copy-on-write"},
		{blk.Config{CopyOnWrite: true, OverlayDir: filepath.Join(dir, "none")}, "no such file"},
		{blk.Config{CopyOnWrite: true, OverlayDir: p}, "overlay in " + p},
	} {
		if d, err := open(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			if d != nil {
				d.Close()
			}
			t.Errorf("Open(%+v): %v; want it to say %q", tc.cfg, err, tc.want)
		}
	}
	a, err := open(blk.Config{CopyOnWrite: true, OverlayDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if a.Features()&blk.FeatureRO != 0 || a.Features()&blk.FeatureWriteZeroes == 0 {
		t.Errorf("copy-on-write features %#x: want a writable disk", a.Features())
	}
	b, err := open(blk.Config{CopyOnWrite: true, OverlayDir: dir})
	if err != nil {
		t.Fatalf("a second copy-on-write Open of one image: %v", err)
	}
	defer b.Close()
	r, err := open(blk.Config{ReadOnly: true})
	if err != nil {
		t.Fatalf("a read-only Open beside copy-on-write ones: %v", err)
	}
	r.Close()
	if w, err := open(blk.Config{}); err == nil || !strings.Contains(err.Error(), "locked by another process") {
		if w != nil {
			w.Close()
		}
		t.Errorf("a writer's Open of an image copy-on-write disks use: %v; want a lock error", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("overlay directory holds %d entries; want none", len(ents))
	}
}

// TestCopyOnWriteSharedBase: two copy-on-write disks over one image keep
// their writes apart.
func TestCopyOnWriteSharedBase(t *testing.T) {
	p := image(t, 64<<10)
	dir := t.TempDir()
	e1 := newEnv(t, blk.Config{Path: p, CopyOnWrite: true, OverlayDir: dir})
	e2 := newEnv(t, blk.Config{Path: p, CopyOnWrite: true, OverlayDir: dir})
	e1.writeDisk(bs, fill(bs, 1))
	e2.writeDisk(bs+512, fill(512, 2))
	want1 := fill(bs, 1)
	want2 := append(append(e2.file()[bs:bs+512:bs+512], fill(512, 2)...), e2.file()[bs+1024:2*bs]...)
	if got := e1.readDisk(bs, bs); !bytes.Equal(got, want1) {
		t.Error("the first disk does not read its own write")
	}
	if got := e2.readDisk(bs, bs); !bytes.Equal(got, want2) {
		t.Error("the second disk does not read its own write over the image")
	}
}
