package conformance

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// vhost-user requests used by the malformed front-end (QEMU
// docs/interop/vhost-user.rst). The back-end's own table is in
// virtio/vhostuser/protocol.go; this is an independent encoding on purpose.
const (
	vuSetFeatures  = 2
	vuSetMemTable  = 5
	vuSetVringNum  = 8
	vuSetVringAddr = 9
	vuSetVringKick = 12
	vuVersion1     = 0x1
	virtioVersion1 = 1 << 32
)

// badFrontEnd is a raw vhost-user client.
type badFrontEnd struct {
	t *testing.T
	c *net.UnixConn
}

func dialBad(t *testing.T, sock string) *badFrontEnd {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(backendTimeout))
	return &badFrontEnd{t: t, c: c}
}

func (f *badFrontEnd) raw(b []byte, fds ...int) {
	f.t.Helper()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	_, _, err := f.c.WriteMsgUnix(b, oob, nil)
	if err != nil && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
		// EPIPE and ECONNRESET: the back-end dropped us earlier in the
		// sequence; dropped checks it did.
		f.t.Fatalf("write: %v", err)
	}
}

// send writes a message: request, flags, payload size, payload.
func (f *badFrontEnd) send(req, flags uint32, p []byte, fds ...int) {
	f.t.Helper()
	b := binary.LittleEndian.AppendUint32(nil, req)
	b = binary.LittleEndian.AppendUint32(b, flags)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(p)))
	f.raw(append(b, p...), fds...)
}

// dropped checks the back-end closed the connection.
func (f *badFrontEnd) dropped() {
	f.t.Helper()
	_ = f.c.SetReadDeadline(time.Now().Add(backendTimeout))
	var b [64]byte
	n, err := f.c.Read(b[:])
	if n > 0 || (err != io.EOF && !errors.Is(err, syscall.ECONNRESET)) {
		f.t.Fatalf("want the back-end to close the connection, got %d bytes, %v", n, err)
	}
}

func le64(vs ...uint64) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	return b
}

func le32(vs ...uint32) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	return b
}

// memTableMsg is a one-region SET_MEM_TABLE payload (or, with two sizes,
// two regions).
func memTableMsg(sizes ...uint64) []byte {
	b := le32(uint32(len(sizes)), 0)
	gpa := uint64(0)
	for _, s := range sizes {
		b = append(b, le64(gpa, s, 0x7f0000000000+gpa, 0)...)
		gpa += s
	}
	return b
}

// ringAddr is a SET_VRING_ADDR payload for ring i at guest address
// i*0x4000 of memTableMsg's memory: descriptors, used ring at +0x2000,
// available ring at +0x1000.
func ringAddr(i uint32) []byte {
	base := 0x7f0000000000 + uint64(i)*0x4000
	return append(le32(i, 0), le64(base, base+0x2000, base+0x1000, 0)...)
}

// testMemfd is a memfd of size bytes sealed against shrinking, as QEMU's
// memory-backend-memfd makes it (seal=on).
func testMemfd(t *testing.T, size int64) int { return newMemfd(t, size, true) }

// newMemfd is a memfd of size bytes, sealed or not (the back-end refuses an
// unsealed one).
func newMemfd(t *testing.T, size int64, sealed bool) int {
	t.Helper()
	fd, err := unix.MemfdCreate("guest", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	if sealed {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
			t.Fatal(err)
		}
	}
	return fd
}

func testEventFD(t *testing.T) int {
	t.Helper()
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// TestMalformedFrontEnd drives the back-end process with malformed
// front-ends, one connection each: each must be logged as an error and
// dropped, and the process must then serve QEMU (a 16 MiB echo). The
// in-process version, with more cases and descriptor-leak checks, is
// vhostuser's TestMalformedFrontEnd.
func TestMalformedFrontEnd(t *testing.T) {
	be := startBackend(t, need(t))
	cases := []struct {
		name string
		send func(t *testing.T, f *badFrontEnd)
		want string // in the logged error
	}{
		{"garbage header", func(t *testing.T, f *badFrontEnd) {
			f.raw([]byte("GET /vhost HTTP/1.1\r\n\r\n"))
		}, "message version"},
		{"wrong version", func(t *testing.T, f *badFrontEnd) {
			f.send(1, 0x2, nil)
		}, "message version 2"},
		{"oversized payload", func(t *testing.T, f *badFrontEnd) {
			f.send(vuSetMemTable, vuVersion1, make([]byte, 4096))
		}, "4096-byte payload"},
		{"SET_VRING_ADDR before SET_MEM_TABLE, then start", func(t *testing.T, f *badFrontEnd) {
			f.send(vuSetFeatures, vuVersion1, le64(virtioVersion1))
			f.send(vuSetVringNum, vuVersion1, le32(0, 256))
			f.send(vuSetVringAddr, vuVersion1, ringAddr(0))
			f.send(vuSetVringKick, vuVersion1, le64(0), testEventFD(t))
		}, "address before SET_MEM_TABLE"},
		{"ring index out of range", func(t *testing.T, f *badFrontEnd) {
			f.send(vuSetVringNum, vuVersion1, le32(7, 256))
		}, "ring 7 does not exist"},
		{"SET_MEM_TABLE with a descriptor count mismatch", func(t *testing.T, f *badFrontEnd) {
			f.send(vuSetMemTable, vuVersion1, memTableMsg(1<<20, 1<<20), testMemfd(t, 2<<20))
		}, "1 descriptors attached, want 2"},
		{"SET_MEM_TABLE region past the end of its file", func(t *testing.T, f *badFrontEnd) {
			// Then start the rings: reading their used index past the end
			// of the file raised SIGBUS and killed the process.
			f.send(vuSetMemTable, vuVersion1, memTableMsg(1<<20), testMemfd(t, 4096))
			f.send(vuSetFeatures, vuVersion1, le64(virtioVersion1))
			for i := range uint32(2) {
				f.send(vuSetVringNum, vuVersion1, le32(i, 256))
				f.send(vuSetVringAddr, vuVersion1, ringAddr(i))
				f.send(vuSetVringKick, vuVersion1, le64(uint64(i)), testEventFD(t))
			}
		}, "past the end of the 4096-byte file"},
		{"SET_MEM_TABLE with an unsealed memfd", func(t *testing.T, f *badFrontEnd) {
			// Shrinking it later would raise SIGBUS in the back-end.
			f.send(vuSetMemTable, vuVersion1, memTableMsg(1<<20), newMemfd(t, 1<<20, false))
		}, "memfd not sealed against shrinking"},
		{"kick for a missing ring", func(t *testing.T, f *badFrontEnd) {
			f.send(vuSetVringKick, vuVersion1, le64(2), testEventFD(t)) // the event queue: QEMU keeps it
		}, "ring 2 does not exist"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := dialBad(t, be.sock)
			tc.send(t, f)
			f.dropped()
			be.waitLog(t, "front-end dropped", i+1)
			be.alive(t)
			if p := be.problems(); len(p) != i+1 || !strings.Contains(p[i], tc.want) {
				t.Errorf("logged problems %q, want the last to mention %q", p, tc.want)
			}
		})
	}
	v := boot(t, be, bootOpts{params: []string{"microvm.scenarios=echo", fmt.Sprintf("microvm.echo.port=%d", portEcho)}})
	waitEcho(t, v)
	t.Run("echo-after", func(t *testing.T) { hostEcho(t, v, be.uds) })
	v.finish(t)
	be.waitLog(t, "front-end disconnected", 1)
	be.alive(t)
	if p := be.problems("front-end dropped"); len(p) > 0 {
		t.Errorf("backend logged other problems: %q", p)
	}
}
