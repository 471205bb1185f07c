//go:build linux

// Command guest is the /init of the I/O benchmark's guest (bench/iobench):
// built static, it is the whole initramfs. It mounts /proc, /sys and /dev,
// reads what to run from the iobench.* kernel parameters (package
// ioproto), runs it, prints one ioproto result line per measurement on the
// serial console, then "iobench: done ok" (or "iobench: error ...") and
// ends the machine (pid1.End).
//
// blk: on the device, with O_DIRECT (no guest page cache) and one request
// in flight, each for the same time: sequential writes of 1 MiB and 4 KiB
// (each pass ends with an fdatasync, inside the time), sequential reads of
// 1 MiB and 4 KiB, and random 4 KiB reads at offsets from a fixed-seed
// generator, so every VMM sees the same sequence. Sequential passes wrap
// around at the end of the device.
//
// net: sets the guest's address on the interface, then sends to the host
// for the time (guest->host, timed by the host as the receiver) and
// receives until the host closes (host->guest, timed here as the
// receiver), over TCP with 64 KiB writes and reads.
package main

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/microvm/microvm/bench/internal/ifconf"
	"github.com/microvm/microvm/bench/internal/ioproto"
	"github.com/microvm/microvm/guest/pid1"
)

func logf(format string, args ...any) { fmt.Printf("iobench: "+format+"\n", args...) }

func main() {
	pid1.MountAll(pid1.Basic, logf)
	if err := run(); err != nil {
		fmt.Println(ioproto.ErrorPrefix + err.Error())
	} else {
		fmt.Println(ioproto.DoneLine)
	}
	pid1.End(logf)
}

func run() error {
	b, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return err
	}
	p, err := ioproto.ParseCmdline(string(b))
	if err != nil {
		return err
	}
	if p.Mode == ioproto.ModeBlk {
		return runBlk(p)
	}
	return runNet(p)
}

// blkTest is one block measurement.
type blkTest struct {
	name   string
	write  bool
	bs     int
	random bool
}

var blkTests = []blkTest{
	{"seq-write-1m", true, 1 << 20, false},
	{"seq-write-4k", true, 4 << 10, false},
	{"seq-read-1m", false, 1 << 20, false},
	{"seq-read-4k", false, 4 << 10, false},
	{"rand-read-4k", false, 4 << 10, true},
}

func runBlk(p ioproto.Params) error {
	fd, err := unix.Open(p.Dev, unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s O_DIRECT: %w", p.Dev, err)
	}
	defer unix.Close(fd)
	size, err := unix.Seek(fd, 0, io.SeekEnd)
	if err != nil {
		return fmt.Errorf("size of %s: %w", p.Dev, err)
	}
	if size < 1<<20 {
		return fmt.Errorf("%s: %d bytes, want at least 1 MiB", p.Dev, size)
	}
	// O_DIRECT wants aligned buffers: an anonymous mapping is page-aligned.
	buf, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("buffer: %w", err)
	}
	for i := range buf {
		buf[i] = byte(i*7 + i>>8)
	}
	for _, t := range blkTests {
		r, err := blkRun(fd, buf[:t.bs], size, t, p.Duration)
		if err != nil {
			return fmt.Errorf("%s on %s: %w", t.name, p.Dev, err)
		}
		fmt.Println(r.Line())
	}
	return nil
}

// blkRun does t on fd (a device of size bytes) for d, one request at a time.
func blkRun(fd int, buf []byte, size int64, t blkTest, d time.Duration) (ioproto.Result, error) {
	bs := int64(len(buf))
	blocks := size / bs
	rng := rand.New(rand.NewPCG(1, 2)) // the same offsets in every VM
	var ops int64
	start := time.Now()
	deadline := start.Add(d)
	for time.Now().Before(deadline) {
		off := (ops % blocks) * bs
		if t.random {
			off = rng.Int64N(blocks) * bs
		}
		var n int
		var err error
		if t.write {
			n, err = unix.Pwrite(fd, buf, off)
		} else {
			n, err = unix.Pread(fd, buf, off)
		}
		if err == nil && int64(n) != bs {
			err = fmt.Errorf("%d of %d bytes at %d", n, bs, off)
		}
		if err != nil {
			return ioproto.Result{}, err
		}
		ops++
	}
	if t.write {
		if err := unix.Fdatasync(fd); err != nil {
			return ioproto.Result{}, fmt.Errorf("fdatasync: %w", err)
		}
	}
	return ioproto.Result{Test: t.name, BlockSize: int(bs), Ops: ops, Bytes: ops * bs,
		Seconds: time.Since(start).Seconds()}, nil
}

// ioSize is the size of each TCP write and read.
const ioSize = 64 << 10

func runNet(p ioproto.Params) error {
	addr, err := netip.ParsePrefix(p.GuestAddr)
	if err != nil {
		return err
	}
	if err := ifconf.Up(p.Iface, addr); err != nil {
		return err
	}
	host := func(port int) string { return net.JoinHostPort(p.HostAddr, strconv.Itoa(port)) }

	// guest->host: send for the time; the host times what it receives.
	c, err := dial(host(p.SendPort))
	if err != nil {
		return err
	}
	buf := make([]byte, ioSize)
	var sent int64
	start := time.Now()
	for deadline := start.Add(p.Duration); time.Now().Before(deadline); {
		n, err := c.Write(buf)
		sent += int64(n)
		if err != nil {
			c.Close()
			return fmt.Errorf("guest->host: write: %w", err)
		}
	}
	if err := c.Close(); err != nil {
		return fmt.Errorf("guest->host: close: %w", err)
	}
	fmt.Println(ioproto.Result{Test: "tcp-send", BlockSize: ioSize, Ops: sent / ioSize, Bytes: sent,
		Seconds: time.Since(start).Seconds()}.Line())

	// host->guest: read until the host closes, timed here.
	c, err = dial(host(p.RecvPort))
	if err != nil {
		return err
	}
	defer c.Close()
	var got, reads int64
	start = time.Now()
	for {
		n, err := c.Read(buf)
		got += int64(n)
		reads++
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("host->guest: read after %d bytes: %w", got, err)
		}
	}
	fmt.Println(ioproto.Result{Test: "tcp-recv", BlockSize: ioSize, Ops: reads, Bytes: got,
		Seconds: time.Since(start).Seconds()}.Line())
	return nil
}

// dial connects to addr, retrying for a while: the host's end of the link
// may take a moment to answer ARP after the interface comes up.
func dial(addr string) (net.Conn, error) {
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var c net.Conn
		if c, err = net.DialTimeout("tcp4", addr, 5*time.Second); err == nil {
			return c, nil
		}
	}
	return nil, fmt.Errorf("dial %s: %w", addr, err)
}
