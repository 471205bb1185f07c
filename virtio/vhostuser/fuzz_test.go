package vhostuser

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/virtio"
)

// nopDevice is a device with vsock's three queues that accepts any number
// of activations without touching the rings.
type nopDevice struct{}

func (nopDevice) Type() uint32                     { return virtio.DeviceVsock }
func (nopDevice) Features() uint64                 { return 0 }
func (nopDevice) QueueSizes() []uint16             { return []uint16{256, 256, 256} }
func (nopDevice) ReadConfig(_ uint64, p []byte)    { clear(p) }
func (nopDevice) WriteConfig(uint64, []byte)       {}
func (nopDevice) Activate(virtio.Activation) error { return nil }
func (nopDevice) Reset()                           {}

// Chunk descriptor bits of FuzzFrontEndMessages (the first byte of a chunk).
const (
	fzEventFDs = 3      // bits 0-1: how many eventfds to attach
	fzMemFD    = 1 << 2 // attach a 1 MiB memfd (before the eventfds)
	fzPipe     = 1 << 3 // attach a pipe's read end (after the eventfds)
)

// fzChunk encodes one write of FuzzFrontEndMessages: spec, a 16-bit length,
// the bytes.
func fzChunk(spec byte, b []byte) []byte {
	out := []byte{spec, 0, 0}
	binary.LittleEndian.PutUint16(out[1:], uint16(len(b)))
	return append(out, b...)
}

// fzMsg encodes one whole message as a chunk.
func fzMsg(spec byte, req Request, flags uint32, p []byte) []byte {
	b := make([]byte, headerSize+len(p))
	(&header{Request: req, Flags: flags, Size: uint32(len(p))}).encode(b)
	copy(b[headerSize:], p)
	return fzChunk(spec, b)
}

// fzGoodSession is QEMU's start-up as FuzzFrontEndMessages input: the
// seed that reaches device activation.
func fzGoodSession() []byte {
	var in []byte
	add := func(spec byte, req Request, p []byte) {
		in = append(in, fzMsg(spec, req, flagVersion|flagNeedReply, p)...)
	}
	add(0, SetOwner, nil)
	add(0, GetFeatures, nil)
	add(0, SetFeatures, u64(virtio.FeatureVersion1|FeatureProtocolFeatures))
	add(0, GetProtocolFeatures, nil)
	add(0, SetProtocolFeatures, u64(ProtocolReplyAck))
	add(fzMemFD, SetMemTable, memTable(memRegion{GPA: 0, Size: memSize, UserAddr: memUser}))
	for i := range uint32(2) {
		add(0, SetVringNum, state(i, ringSize))
		add(0, SetVringBase, state(i, 0))
		add(0, SetVringAddr, ringAddr(i))
		add(1, SetVringKick, u64(uint64(i)))
		add(1, SetVringCall, u64(uint64(i)))
		add(1, SetVringErr, u64(uint64(i)))
		add(0, SetVringEnable, state(i, 1))
	}
	add(0, GetConfig, (configMsg{Size: 8, Data: make([]byte, 8)}).encode())
	add(1, SetVringCall, u64(0))
	add(fzMemFD, SetMemTable, memTable(memRegion{GPA: 0, Size: memSize, UserAddr: memUser}))
	add(0, GetVringBase, state(1, 0))
	add(1, SetVringKick, u64(1))
	add(0, ResetDevice, nil)
	return in
}

// FuzzFrontEndMessages feeds a front-end's byte stream to the back-end's
// message handler over a socketpair. The input is a sequence of chunks,
// each written with one sendmsg: a spec byte (fz* bits: which descriptors
// ride along), a 16-bit little-endian length, then that many bytes, which
// may split or join messages anyhow. Whatever arrives, the handler must not
// panic, must return once the front-end closes its end, and must leave no
// descriptor open after the connection is torn down.
func FuzzFrontEndMessages(f *testing.F) {
	f.Add(fzGoodSession())
	f.Add(fzMsg(fzMemFD|2, SetMemTable, flagVersion, memTable(memRegion{GPA: 0, Size: memSize, UserAddr: memUser})))
	f.Add(fzMsg(fzPipe, SetVringKick, flagVersion, u64(0)))
	f.Add(fzMsg(3, GetFeatures, flagVersion, nil))
	f.Add(append(fzChunk(1, []byte{byte(SetVringCall), 0, 0, 0, flagVersion}), fzChunk(2, []byte{0, 0, 0, 8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0})...))
	log := logrus.New()
	log.SetOutput(io.Discard)
	f.Fuzz(func(t *testing.T, in []byte) {
		before := openFDs(t)
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		file := os.NewFile(uintptr(fds[0]), "back-end")
		conn, err := net.FileConn(file) // a duplicate of fds[0]
		file.Close()
		if err != nil {
			unix.Close(fds[1])
			t.Fatal(err)
		}
		b := &Backend{cfg: Config{Device: nopDevice{}, Queues: 2, Log: log}, log: log, queues: 2}
		fe := newFrontend(b, conn.(*net.UnixConn))
		served := make(chan error, 1)
		go func() {
			err := fe.serve()
			fe.teardown()
			served <- err
		}()
		// Replies are drained so the back-end never blocks writing them.
		drained := make(chan struct{})
		go func() {
			defer close(drained)
			var buf [4096]byte
			for {
				if n, err := unix.Read(fds[1], buf[:]); n <= 0 && err != unix.EINTR {
					return
				}
			}
		}()
		for len(in) >= 3 {
			spec, n := in[0], int(binary.LittleEndian.Uint16(in[1:]))
			in = in[3:]
			chunk := in[:min(n, len(in))]
			in = in[len(chunk):]
			if len(chunk) == 0 {
				continue // descriptors need a byte to ride on
			}
			send := fzDescriptors(t, spec)
			var oob []byte
			if len(send) > 0 {
				oob = unix.UnixRights(send...)
			}
			err := unix.Sendmsg(fds[1], chunk, oob, nil, 0)
			for _, fd := range send {
				unix.Close(fd)
			}
			if errors.Is(err, unix.EPIPE) || errors.Is(err, unix.ECONNRESET) {
				break // the back-end dropped the connection
			}
			if err != nil {
				t.Fatalf("sendmsg: %v", err)
			}
		}
		_ = unix.Shutdown(fds[1], unix.SHUT_WR)
		select {
		case <-served:
		case <-time.After(10 * time.Second):
			t.Fatal("the back-end is still serving 10s after the front-end closed its end")
		}
		<-drained
		unix.Close(fds[1])
		if after := openFDs(t); after != before {
			t.Fatalf("%d descriptors open before, %d after the connection: a leak", before, after)
		}
	})
}

// fzDescriptors opens the descriptors a chunk's spec asks for.
func fzDescriptors(t *testing.T, spec byte) []int {
	t.Helper()
	var fds []int
	if spec&fzMemFD != 0 {
		// Sealed as QEMU seals it, or SET_MEM_TABLE never gets past the
		// seal check.
		fd, err := unix.MemfdCreate("guest", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Ftruncate(fd, memSize); err != nil {
			t.Fatal(err)
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW); err != nil {
			t.Fatal(err)
		}
		fds = append(fds, fd)
	}
	for range spec & fzEventFDs {
		fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err != nil {
			t.Fatal(err)
		}
		fds = append(fds, fd)
	}
	if spec&fzPipe != 0 {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		unix.Close(p[1])
		fds = append(fds, p[0])
	}
	return fds
}
