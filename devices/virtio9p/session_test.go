package virtio9p

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/virtio/virtiotest"
)

// TestDuplicateTag: a request under the tag of one still in flight is a
// guest error (its reply could not be told from the other's). Internal:
// end to end the server may answer the first before the second is popped.
func TestDuplicateTag(t *testing.T) {
	s, post, failed := popEnv(t)
	post(120, 5, 0) // Tclunk
	post(120, 6, 0)
	post(120, 5, 0)
	var c virtio.Chain
	for i, tag := range []uint16{5, 6} {
		if _, ok := s.pop(&c); !ok {
			t.Fatalf("request %d (tag %d) refused", i, tag)
		}
	}
	if _, ok := s.pop(&c); ok {
		t.Fatal("a second request under tag 5 was accepted while the first is in flight")
	}
	s.reportFail()
	checkOneLayoutError(t, s, *failed)
}

// popEnv is a session without a server, for pop alone: post makes a
// request of type typ, tag and a 16-bit argument available.
func popEnv(t *testing.T) (*session, func(typ byte, tag, arg uint16), *[]error) {
	mem := virtiotest.NewMemory(t, 1<<20)
	dq := virtiotest.NewQueue(mem, 8, true)
	failed := &[]error{}
	s := &session{d: &Device{}, c: &conn{}, q: &virtio.ActiveQueue{Queue: virtio.NewQueue(mem.Memory, dq.Cfg, true, true)},
		fail: func(err error) { *failed = append(*failed, err) }, inflight: map[uint16]pending{}}
	post := func(typ byte, tag, arg uint16) {
		m := make([]byte, 11)
		binary.LittleEndian.PutUint32(m, 11)
		m[4] = typ
		binary.LittleEndian.PutUint16(m[5:], tag)
		binary.LittleEndian.PutUint16(m[7:], arg)
		a := mem.Alloc(11, 8)
		if err := mem.Write(a, m); err != nil {
			t.Fatal(err)
		}
		dq.Add(virtiotest.Buf{Addr: a, Len: 11}, virtiotest.Buf{Addr: mem.Alloc(64, 8), Len: 64, Writable: true})
	}
	return s, post, failed
}

func checkOneLayoutError(t *testing.T, s *session, failed []error) {
	t.Helper()
	if len(failed) != 1 || !errors.Is(failed[0], virtio.ErrGuest) {
		t.Fatalf("failures %v, want one guest error", failed)
	}
	if n := s.d.guestErrors.Counts()[virtio.GuestErrLayout]; n != 1 {
		t.Fatalf("%d layout errors counted, want 1", n)
	}
}

// TestFlushOfFlush: the server's Tflush waits for the request it names, so
// one naming itself or another Tflush would wait for ever (and hold up a
// reset): a guest error. A Tflush of an ordinary request passes.
func TestFlushOfFlush(t *testing.T) {
	for _, tc := range []struct {
		name string
		reqs [][3]uint16 // type, tag, oldtag
	}{
		{"itself", [][3]uint16{{typeTflush, 5, 5}}},
		{"another flush", [][3]uint16{{120, 1, 0}, {typeTflush, 6, 1}, {typeTflush, 7, 6}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, post, failed := popEnv(t)
			for _, r := range tc.reqs {
				post(byte(r[0]), r[1], r[2])
			}
			var c virtio.Chain
			for i := range len(tc.reqs) - 1 {
				if _, ok := s.pop(&c); !ok {
					t.Fatalf("request %d refused", i)
				}
			}
			if _, ok := s.pop(&c); ok {
				t.Fatal("the last Tflush was accepted")
			}
			s.reportFail()
			checkOneLayoutError(t, s, *failed)
		})
	}
}
