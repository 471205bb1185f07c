package blk_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/microvm/microvm/devices/blk"
	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
)

func TestReadWrite(t *testing.T) {
	e := newEnv(t, blk.Config{})
	// Read: the image's pattern lands in guest memory.
	r, st, n := e.do(tIn, 3, nil, 8192)
	if st != sOK || n != 8192+1 {
		t.Fatalf("read: status %d, used %d; want 0 and 8193", st, n)
	}
	want := e.file()[3*512 : 3*512+8192]
	if got := e.read(r.data, 8192); !bytes.Equal(got, want) {
		t.Error("read returned other bytes than the image holds")
	}
	// Write, then read back through the device and from the file.
	data := bytes.Repeat([]byte("microvm!"), 4096/8)
	if _, st, n := e.do(tOut, 100, data, 0); st != sOK || n != 1 {
		t.Fatalf("write: status %d, used %d; want 0 and 1", st, n)
	}
	if got := e.file()[100*512 : 100*512+4096]; !bytes.Equal(got, data) {
		t.Error("the image does not hold the written bytes")
	}
	r, st, _ = e.do(tIn, 100, nil, 4096)
	if got := e.read(r.data, 4096); st != sOK || !bytes.Equal(got, data) {
		t.Errorf("read back: status %d, data equal %v", st, bytes.Equal(got, data))
	}
	// The last sector is readable; the one after is not.
	if _, st, _ := e.do(tIn, e.dev.Sectors()-1, nil, 512); st != sOK {
		t.Errorf("read of the last sector: status %d", st)
	}
	s := e.dev.Stats()
	if s.Reads != 3 || s.Writes != 1 || s.BytesWritten != 4096 || s.BytesRead != 8192+4096+512 || s.GuestErrors+s.Refused+s.HostErrors != 0 {
		t.Errorf("stats %+v", s)
	}
}

// TestScatterGather splits data over many descriptors, some in an indirect
// table, with the header and status in buffers of their own.
func TestScatterGather(t *testing.T) {
	e := newEnv(t, blk.Config{})
	data := make([]byte, 3*512)
	for i := range data {
		data[i] = byte(i * 13)
	}
	bufs := []virtiotest.Buf{{Addr: e.put(header(tOut, 7)), Len: 16}}
	for off := 0; off < len(data); off += 100 {
		end := min(off+100, len(data))
		bufs = append(bufs, virtiotest.Buf{Addr: e.put(data[off:end]), Len: uint32(end - off)})
	}
	status := e.put([]byte{noStatus})
	bufs = append(bufs, virtiotest.Buf{Addr: status, Len: 1, Writable: true})
	e.q.AddIndirect(bufs...)
	_ = e.kick.Signal()
	e.reap(1)
	if st := e.read(status, 1)[0]; st != sOK {
		t.Fatalf("status %d", st)
	}
	if got := e.file()[7*512 : 10*512]; !bytes.Equal(got, data) {
		t.Error("scattered write did not land in order")
	}
	// A read into 3 buffers of 512 with the header and the first data
	// bytes sharing nothing.
	hdr := e.put(header(tIn, 7))
	a, b, c := e.mem.Alloc(512, 8), e.mem.Alloc(1000, 8), e.mem.Alloc(24, 8)
	status = e.put([]byte{noStatus})
	e.q.Add(virtiotest.Buf{Addr: hdr, Len: 16}, virtiotest.Buf{Addr: a, Len: 512, Writable: true},
		virtiotest.Buf{Addr: b, Len: 1000, Writable: true}, virtiotest.Buf{Addr: c, Len: 24, Writable: true},
		virtiotest.Buf{Addr: status, Len: 1, Writable: true})
	_ = e.kick.Signal()
	if u := e.reap(1)[0]; u.Len != 3*512+1 {
		t.Errorf("used length %d; want %d", u.Len, 3*512+1)
	}
	got := append(append(e.read(a, 512), e.read(b, 1000)...), e.read(c, 24)...)
	if !bytes.Equal(got, data) || e.read(status, 1)[0] != sOK {
		t.Error("scattered read did not return the data in order")
	}
}

func TestFlushAndGetID(t *testing.T) {
	e := newEnv(t, blk.Config{Serial: "disk-0123456789abcde"}) // 20 bytes: no NUL
	if _, st, n := e.do(tFlush, 0, nil, 0); st != sOK || n != 1 {
		t.Errorf("flush: status %d, used %d", st, n)
	}
	r, st, n := e.do(tGetID, 0, nil, 20)
	if st != sOK || n != 21 || string(e.read(r.data, 20)) != "disk-0123456789abcde" {
		t.Errorf("get id: status %d, used %d, id %q", st, n, e.read(r.data, 20))
	}
	s := e.dev.Stats()
	if s.Flushes != 1 || s.GetIDs != 1 {
		t.Errorf("stats %+v", s)
	}

	e = newEnv(t, blk.Config{Serial: "short"})
	r, _, _ = e.do(tGetID, 0, nil, 20)
	if got := e.read(r.data, 20); string(got) != "short"+strings.Repeat("\x00", 15) {
		t.Errorf("short serial reads %q; want it NUL-padded", got)
	}
}

func segment(sector uint64, n, flags uint32) []byte {
	b := make([]byte, 16)
	binary.LittleEndian.PutUint64(b[0:], sector)
	binary.LittleEndian.PutUint32(b[8:], n)
	binary.LittleEndian.PutUint32(b[12:], flags)
	return b
}

func TestDiscardAndWriteZeroes(t *testing.T) {
	e := newEnv(t, blk.Config{})
	zero := make([]byte, 8192)
	// Write zeroes, allocated and unmapped, over two segments.
	segs := append(segment(16, 8, 0), segment(64, 16, 1)...)
	if _, st, _ := e.do(tWriteZeroes, 0, segs, 0); st != sOK {
		t.Fatalf("write zeroes: status %d", st)
	}
	f := e.file()
	if !bytes.Equal(f[16*512:24*512], zero[:4096]) || !bytes.Equal(f[64*512:80*512], zero) {
		t.Error("write zeroes left data in place")
	}
	if f[24*512] != pattern(24*512) || f[16*512-1] != pattern(16*512-1) {
		t.Error("write zeroes touched bytes outside its segments")
	}
	if _, st, _ := e.do(tDiscard, 0, segment(200, 8, 0), 0); st != sOK {
		t.Fatalf("discard: status %d", st)
	}
	if f := e.file(); f[208*512] != pattern(208*512) {
		t.Error("discard touched bytes outside its segment")
	}
	s := e.dev.Stats()
	if s.WriteZeroes != 1 || s.Discards != 1 {
		t.Errorf("stats %+v", s)
	}
}

func TestReadOnly(t *testing.T) {
	e := newEnv(t, blk.Config{ReadOnly: true})
	if f := e.dev.Features(); f&blk.FeatureRO == 0 || f&(blk.FeatureDiscard|blk.FeatureWriteZeroes) != 0 {
		t.Errorf("read-only features %#x: want RO and no DISCARD/WRITE_ZEROES", f)
	}
	before := e.file()
	if _, st, _ := e.do(tOut, 0, make([]byte, 512), 0); st != sIOErr {
		t.Errorf("write to a read-only disk: status %d; want IOERR", st)
	}
	for _, typ := range []uint32{tDiscard, tWriteZeroes} {
		if _, st, _ := e.do(typ, 0, segment(0, 1, 0), 0); st == sOK {
			t.Errorf("type %d on a read-only disk succeeded", typ)
		}
	}
	if _, st, _ := e.do(tIn, 0, nil, 512); st != sOK {
		t.Errorf("read: status %d", st)
	}
	if !bytes.Equal(before, e.file()) {
		t.Error("the read-only image changed")
	}
	if s := e.dev.Stats(); s.Refused != 3 || s.GuestErrors != 0 {
		t.Errorf("stats %+v; want 3 refused, no guest errors", s)
	}
}

// TestRefused covers well-formed requests the device answers with an error
// status and keeps running.
func TestRefused(t *testing.T) {
	const sectors = (1 << 20) / 512
	for _, tc := range []struct {
		name    string
		typ     uint32
		sector  uint64
		data    []byte
		readLen int
		want    byte
	}{
		{"read past the end", tIn, sectors, nil, 512, sIOErr},
		{"read across the end", tIn, sectors - 1, nil, 1024, sIOErr},
		{"write past the end", tOut, sectors, make([]byte, 512), 0, sIOErr},
		{"sector overflow", tIn, math.MaxUint64, nil, 512, sIOErr},
		{"sector+length overflow", tOut, math.MaxUint64 - 1, make([]byte, 1024), 0, sIOErr},
		{"read of part of a sector", tIn, 0, nil, 100, sIOErr},
		{"write of part of a sector", tOut, 0, make([]byte, 513), 0, sIOErr},
		{"unknown type", 99, 0, nil, 0, sUnsupp},
		{"secure erase", 14, 0, segment(0, 1, 0), 0, sUnsupp},
		{"discard with unmap", tDiscard, 0, segment(0, 1, 1), 0, sUnsupp},
		{"write zeroes with reserved flags", tWriteZeroes, 0, segment(0, 1, 2), 0, sUnsupp},
		{"discard past the end", tDiscard, 0, segment(sectors, 1, 0), 0, sIOErr},
		{"discard overflow", tDiscard, 0, segment(math.MaxUint64, 2, 0), 0, sIOErr},
		{"discard with a partial segment", tDiscard, 0, make([]byte, 20), 0, sIOErr},
		{"discard with too many segments", tDiscard, 0, make([]byte, 16*33), 0, sIOErr},
		{"write zeroes, a bad second segment", tWriteZeroes, 0, append(segment(0, 1, 0), segment(sectors, 1, 0)...), 0, sIOErr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, blk.Config{})
			before := e.file()
			if _, st, _ := e.do(tc.typ, tc.sector, tc.data, tc.readLen); st != tc.want {
				t.Errorf("status %d; want %d", st, tc.want)
			}
			if !bytes.Equal(before, e.file()) {
				t.Error("a refused request changed the image")
			}
			// The device still works.
			if _, st, _ := e.do(tIn, 0, nil, 512); st != sOK {
				t.Errorf("read after the refusal: status %d", st)
			}
			if s := e.dev.Stats(); s.Refused != 1 || s.GuestErrors != 0 || len(e.failures()) != 0 {
				t.Errorf("stats %+v, failures %v; want 1 refused and no failure", s, e.failures())
			}
		})
	}
}

// TestMalformed covers chains no request has the shape of: the device
// fails (NEEDS_RESET), answers nothing, and ignores later kicks.
func TestMalformed(t *testing.T) {
	for _, tc := range []struct {
		name string
		kind virtio.GuestErrorKind
		add  func(e *env)
	}{
		{"short header", virtio.GuestErrHeader, func(e *env) {
			e.q.Add(virtiotest.Buf{Addr: e.put(make([]byte, 8)), Len: 8}, virtiotest.Buf{Addr: e.put([]byte{0}), Len: 1, Writable: true})
		}},
		{"header split short", virtio.GuestErrHeader, func(e *env) {
			h := header(tIn, 0)
			e.q.Add(virtiotest.Buf{Addr: e.put(h[:8]), Len: 8}, virtiotest.Buf{Addr: e.put(h[8:15]), Len: 7},
				virtiotest.Buf{Addr: e.put([]byte{0}), Len: 1, Writable: true})
		}},
		{"no status byte", virtio.GuestErrHeader, func(e *env) {
			e.q.Add(virtiotest.Buf{Addr: e.put(header(tFlush, 0)), Len: 16})
		}},
		{"only writable", virtio.GuestErrHeader, func(e *env) {
			e.q.Add(virtiotest.Buf{Addr: e.put(make([]byte, 17)), Len: 17, Writable: true})
		}},
		{"read with readable data", virtio.GuestErrLayout, func(e *env) {
			e.q.Add(virtiotest.Buf{Addr: e.put(header(tIn, 0)), Len: 16}, virtiotest.Buf{Addr: e.put(make([]byte, 512)), Len: 512},
				virtiotest.Buf{Addr: e.put([]byte{0}), Len: 1, Writable: true})
		}},
		{"write with writable data", virtio.GuestErrLayout, func(e *env) {
			e.q.Add(virtiotest.Buf{Addr: e.put(header(tOut, 0)), Len: 16}, virtiotest.Buf{Addr: e.mem.Alloc(512, 8), Len: 512, Writable: true},
				virtiotest.Buf{Addr: e.put([]byte{0}), Len: 1, Writable: true})
		}},
		{"buffer outside memory", virtio.GuestErrQueue, func(e *env) {
			e.q.Add(virtiotest.Buf{Addr: 1 << 40, Len: 16}, virtiotest.Buf{Addr: e.put([]byte{0}), Len: 1, Writable: true})
		}},
		{"descriptor loop", virtio.GuestErrQueue, func(e *env) {
			e.q.WriteDesc(e.q.Cfg.Desc, 0, e.put(header(tIn, 0)), 16, virtiotest.FlagNext, 0)
			e.q.PublishHead(0)
		}},
		{"avail index far ahead", virtio.GuestErrQueue, func(e *env) { e.q.SetAvailIdx(1000) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, blk.Config{})
			before := e.file()
			tc.add(e)
			_ = e.kick.Signal()
			if err := e.waitFail(); !errors.Is(err, virtio.ErrGuest) {
				t.Errorf("Fail(%v); want an ErrGuest", err)
			}
			_ = e.kick.Signal() // ignored: the device waits for a reset
			if u := e.q.Reap(); len(u) != 0 {
				t.Errorf("the device answered a malformed chain: %v", u)
			}
			var want virtio.GuestErrorCounts
			want[tc.kind] = 1
			if s := e.dev.Stats(); s.GuestErrors != 1 || s.GuestErrorsByKind != want {
				t.Errorf("GuestErrors = %d, by kind %v; want 1, %v (%v)", s.GuestErrors, s.GuestErrorsByKind, want, tc.kind)
			}
			if !bytes.Equal(before, e.file()) {
				t.Error("a malformed request changed the image")
			}
		})
	}
}

// TestManyInFlight queues more requests than there are workers and checks
// every one completes with the right data.
func TestManyInFlight(t *testing.T) {
	e := newEnv(t, blk.Config{InFlight: 4})
	const n = 40
	reqs := make(map[uint16]req)
	sectors := make(map[uint16]uint64)
	for i := range n {
		sector := uint64(i * 17)
		r := e.submit(tIn, sector, nil, 2048)
		reqs[r.head], sectors[r.head] = r, sector
	}
	_ = e.kick.Signal()
	f := e.file()
	for _, u := range e.reap(n) {
		r := reqs[u.ID]
		s := sectors[u.ID] * 512
		if e.statusOf(r) != sOK || !bytes.Equal(e.read(r.data, 2048), f[s:s+2048]) {
			t.Errorf("request at sector %d: status %d or wrong data", sectors[u.ID], e.statusOf(r))
		}
	}
	if s := e.dev.Stats(); s.Reads != n || s.MaxInFlight < 1 || s.MaxInFlight > 4 {
		t.Errorf("stats %+v; want %d reads and 1..4 in flight", s, n)
	}
}

func TestConfigSpace(t *testing.T) {
	e := newEnv(t, blk.Config{})
	cfg := make([]byte, 64)
	e.dev.ReadConfig(0, cfg)
	u32 := func(off int) uint32 { return binary.LittleEndian.Uint32(cfg[off:]) }
	if c := binary.LittleEndian.Uint64(cfg); c != (1<<20)/512 {
		t.Errorf("capacity %d", c)
	}
	if u32(12) != 254 || u32(20) != 512 || u32(40) == 0 || u32(36) == 0 || u32(52) == 0 || cfg[56] != 1 {
		t.Errorf("config space %x", cfg)
	}
	tail := make([]byte, 8)
	e.dev.ReadConfig(1000, tail)
	if !bytes.Equal(tail, make([]byte, 8)) {
		t.Errorf("bytes past the config space read %x", tail)
	}
	if f := e.dev.Features(); f&blk.FeatureFlush == 0 || f&blk.FeatureRO != 0 || f&blk.FeatureDiscard == 0 {
		t.Errorf("features %#x", f)
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	odd := filepath.Join(dir, "odd.img")
	os.WriteFile(odd, make([]byte, 1000), 0o644)
	empty := filepath.Join(dir, "empty.img")
	os.WriteFile(empty, nil, 0o644)
	for _, tc := range []struct {
		cfg  blk.Config
		want string
	}{
		{blk.Config{Path: odd}, "not a multiple of 512"},
		{blk.Config{Path: empty}, "empty"},
		{blk.Config{Path: filepath.Join(dir, "none")}, "no such file"},
		{blk.Config{Path: odd, Serial: strings.Repeat("x", 21)}, "longer than 20"},
		{blk.Config{Path: odd, InFlight: blk.MaxInFlight + 1}, "in flight"},
	} {
		d, err := blk.Open(tc.cfg)
		if err == nil {
			d.Close()
			t.Errorf("Open(%+v) succeeded", tc.cfg)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%+v): %v; want it to say %q", tc.cfg, err, tc.want)
		}
	}
}

func TestLock(t *testing.T) {
	p := image(t, 4096)
	rw, err := blk.Open(blk.Config{Path: p})
	if err != nil {
		t.Fatal(err)
	}
	for _, ro := range []bool{false, true} {
		if d, err := blk.Open(blk.Config{Path: p, ReadOnly: ro}); err == nil || !strings.Contains(err.Error(), "locked by another process") {
			if d != nil {
				d.Close()
			}
			t.Errorf("second Open (read-only %v) of a locked image: %v; want a lock error", ro, err)
		}
	}
	rw.Close()
	// Readers share the image; a writer is refused while they hold it.
	r1, err := blk.Open(blk.Config{Path: p, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r1.Close()
	r2, err := blk.Open(blk.Config{Path: p, ReadOnly: true})
	if err != nil {
		t.Fatalf("a second read-only Open: %v", err)
	}
	defer r2.Close()
	if d, err := blk.Open(blk.Config{Path: p}); err == nil {
		d.Close()
		t.Error("a writer opened an image two readers hold")
	}
}

func TestResetAndReactivate(t *testing.T) {
	e := newEnv(t, blk.Config{})
	for range 8 {
		e.submit(tIn, 0, nil, 4096)
	}
	_ = e.kick.Signal()
	e.dev.Reset() // may race with the requests: must neither hang nor panic
	if err := e.dev.Activate(virtio.Activation{}); !errors.Is(err, virtio.ErrGuest) {
		t.Errorf("Activate without queues: %v", err)
	}
}
