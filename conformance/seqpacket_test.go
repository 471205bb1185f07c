package conformance

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// SEQPACKET scenarios (guest/init's seqpacket and seqpacket-echo) and their
// host sides: SOCK_SEQPACKET Unix sockets, <uds>_P for guest connections and
// <uds>.seqpacket for host ones.
const (
	portSeqpacketEcho = 1026 // the guest listens with SOCK_SEQPACKET
	portSeqpacket     = 2007 // the guest dials <uds>_2007 with SOCK_SEQPACKET
	seqCount          = 64
	seqMax            = 64 << 10
	seqSeed           = 300
)

// seqMsgSize is guest/init's msgSize: the size of message i of an exchange
// with messages of at most max bytes.
func seqMsgSize(i int, max int64) int64 {
	edges := []int64{1, max, 4096, 4097, max - 1}
	if i < len(edges) {
		return min(edges[i], max)
	}
	return 1 + int64(uint64(i)*2654435761%uint64(max))
}

// seqMsg is message i: the first size bytes of payload seed+i.
func seqMsg(seed uint64, i int, size int64) []byte {
	b := make([]byte, size)
	_, _ = io.ReadFull(payload(seed+uint64(i)), b)
	return b
}

// recordEchoServe echoes each record of a guest SEQPACKET connection as one
// record until EOF, counting them.
func recordEchoServe(c *net.UnixConn) hostResult {
	r := hostResult{got: newDigest(), sent: newDigest()}
	buf := make([]byte, seqMax+1)
	for {
		n, _, flags, _, err := c.ReadMsgUnix(buf, nil)
		if err != nil || n == 0 {
			if err != nil && !errors.Is(err, io.EOF) {
				r.err = fmt.Errorf("after %d records: %w", r.records, err)
			}
			return r
		}
		if flags&unix.MSG_TRUNC != 0 {
			r.err = fmt.Errorf("record %d longer than %d bytes", r.records, seqMax)
			return r
		}
		r.records++
		r.got.Write(buf[:n])
		if _, err := c.Write(buf[:n]); err != nil {
			r.err = fmt.Errorf("echo of record %d: %w", r.records, err)
			return r
		}
		r.sent.Write(buf[:n])
	}
}

// seqTotal is the bytes of count messages.
func seqTotal(count int, max int64) int64 {
	var n int64
	for i := range count {
		n += seqMsgSize(i, max)
	}
	return n
}

// checkGuestSeqpacket checks the guest's seqpacket scenario against what the
// host echoed: every message came back whole, as one record, with EOR.
func checkGuestSeqpacket(t *testing.T, v *vm, l *guestListener) {
	f := v.result(t, "seqpacket")
	r := l.wait(t)
	if r.err != nil {
		t.Fatal(r.err)
	}
	total := seqTotal(seqCount, seqMax)
	if r.records != seqCount || r.got.n != total {
		t.Errorf("host read %d records of %d bytes in all; want %d messages of %d", r.records, r.got.n, seqCount, total)
	}
	want := map[string]string{"msgs": strconv.Itoa(seqCount), "bytes": strconv.FormatInt(total, 10), "eor": strconv.Itoa(seqCount)}
	for k, w := range want {
		if f[k] != w {
			t.Errorf("guest result %v; want %s=%s (eor: each record is a whole record, so every echo carries MSG_EOR)", f, k, w)
		}
	}
}

// hostSeqpacketEcho connects to the guest's seqpacket-echo through
// <uds>.seqpacket, sends the messages, each after the echo of the one
// before, and checks each echo is one record of the same bytes, then the
// guest's report.
func hostSeqpacketEcho(t *testing.T, v *vm, uds string) {
	if p := v.listening(t, "seqpacket-echo"); p != portSeqpacketEcho {
		t.Fatalf("seqpacket-echo listens on %d, want %d", p, portSeqpacketEcho)
	}
	nc, err := net.DialTimeout("unixpacket", uds+".seqpacket", ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	c := nc.(*net.UnixConn)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	if _, err := fmt.Fprintf(c, "CONNECT %d\n", portSeqpacketEcho); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, seqMax+1)
	n, err := c.Read(buf)
	if err != nil || !bytes.HasPrefix(buf[:n], []byte("OK ")) || buf[n-1] != '\n' {
		t.Fatalf("reply %q, %v; want the record OK <port>\\n", buf[:n], err)
	}
	// One message at a time: see guest/init's msgExchange (Linux sends a
	// message beyond the credit in part on a non-blocking socket).
	for i := range seqCount {
		want := seqMsg(seqSeed, i, seqMsgSize(i, seqMax))
		if _, err := c.Write(want); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		n, _, flags, _, err := c.ReadMsgUnix(buf, nil)
		if err != nil {
			t.Fatalf("echo %d: %v", i, err)
		}
		if flags&unix.MSG_TRUNC != 0 || !bytes.Equal(buf[:n], want) {
			t.Fatalf("echo %d: a %d-byte record (flags %#x); want the %d-byte message back whole", i, n, flags, len(want))
		}
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Read(buf); n != 0 || (err != nil && !errors.Is(err, io.EOF)) {
		t.Fatalf("after the last echo: %d bytes, %v; want EOF", n, err)
	}
	f := v.result(t, "seqpacket-echo")
	total := seqTotal(seqCount, seqMax)
	if f["msgs"] != strconv.Itoa(seqCount) || f["bytes"] != strconv.FormatInt(total, 10) || f["eor"] != strconv.Itoa(seqCount) {
		t.Errorf("guest result %v; want msgs=%d bytes=%d eor=%d", f, seqCount, total, seqCount)
	}
}

// seqpacketParams are the kernel parameters of both scenarios.
func seqpacketParams() []string {
	return []string{
		fmt.Sprintf("microvm.seqpacket.port=%d microvm.seqpacket.count=%d microvm.seqpacket.max=%d microvm.seqpacket.seed=%d", portSeqpacket, seqCount, seqMax, seqSeed),
		fmt.Sprintf("microvm.seqpacket-echo.port=%d microvm.seqpacket-echo.max=%d", portSeqpacketEcho, seqMax),
	}
}

// TestSeqpacketQEMU runs only the SEQPACKET scenarios (runData runs them
// too, among the others) against the back-end under QEMU: quicker to rerun
// on their own. MICROVM_SEQPACKET_DEBUG=1 runs the back-end at debug level.
func TestSeqpacketQEMU(t *testing.T) {
	var extra []string
	if os.Getenv("MICROVM_SEQPACKET_DEBUG") != "" {
		extra = []string{"--log-level", "debug"}
	}
	be := startBackend(t, need(t), extra...)
	seqL := listenGuestNet(t, "unixpacket", be.uds, portSeqpacket, 1, recordEchoServe)
	v := boot(t, be, bootOpts{params: append(seqpacketParams(), "microvm.scenarios=seqpacket,seqpacket-echo")})
	t.Run("seqpacket-guest-to-host", func(t *testing.T) { checkGuestSeqpacket(t, v, seqL) })
	t.Run("seqpacket-host-to-guest", func(t *testing.T) { hostSeqpacketEcho(t, v, be.uds) })
	v.finish(t)
	be.waitLog(t, "front-end disconnected", 1)
	be.alive(t)
	be.checkClean(t)
	if f := be.features(t); f&(1<<1) == 0 {
		t.Errorf("negotiated features %#x, without VIRTIO_VSOCK_F_SEQPACKET", f)
	}
}
