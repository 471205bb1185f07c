package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// patternPeriod: the test guest's stream pattern repeats every 64 KiB
// (docs/testguest.md, "The data pattern").
const patternPeriod = 64 << 10

// pattern holds two periods, so the window of any read or write of up to
// 64 KiB starting at offset i is pattern[i%patternPeriod:][:n].
var pattern = func() []byte {
	p := make([]byte, 2*patternPeriod)
	for i := range p {
		p[i] = byte(i*7 + i>>8) // byte i = (i*7 + (i >> 8)) & 0xff
	}
	return p
}()

// maxIO is the largest read or write the benchmark does.
const maxIO = patternPeriod

// send writes total bytes of the pattern to w in writes of size bytes (the
// last one may be shorter) and returns how many writes it made.
func send(w io.Writer, total int64, size int) (int64, error) {
	if size <= 0 || size > maxIO {
		return 0, fmt.Errorf("write size %d outside 1..%d", size, maxIO)
	}
	var off, writes int64
	for off < total {
		n := int(min(int64(size), total-off))
		p := off % patternPeriod
		m, err := w.Write(pattern[p : p+int64(n)])
		off += int64(m)
		writes++
		if err != nil {
			return writes, fmt.Errorf("write at byte %d: %w", off, err)
		}
	}
	return writes, nil
}

// receive reads r to EOF with reads of at most size bytes. With check set,
// every byte must be the guest's pattern; the first mismatch is an error.
// It returns the byte count and the number of reads that returned data.
func receive(r io.Reader, size int, check bool) (n, reads int64, err error) {
	if size <= 0 || size > maxIO {
		return 0, 0, fmt.Errorf("read size %d outside 1..%d", size, maxIO)
	}
	buf := make([]byte, size)
	for {
		m, err := r.Read(buf)
		if m > 0 {
			reads++
			if check {
				p := n % patternPeriod
				if want := pattern[p : p+int64(m)]; !bytes.Equal(buf[:m], want) {
					for i := range m {
						if buf[i] != want[i] {
							return n, reads, fmt.Errorf("data mismatch at byte %d: got %#02x, want %#02x", n+int64(i), buf[i], want[i])
						}
					}
				}
			}
			n += int64(m)
		}
		if errors.Is(err, io.EOF) {
			return n, reads, nil
		}
		if err != nil {
			return n, reads, fmt.Errorf("read after %d bytes: %w", n, err)
		}
	}
}

// unixPair returns the two ends of an AF_UNIX stream socket pair as
// net.UnixConns, so the baseline goes through the same Go I/O path (the
// netpoller) as the host side of a vsock connection.
func unixPair() (a, b *net.UnixConn, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	conv := func(fd int, name string) (*net.UnixConn, error) {
		f := os.NewFile(uintptr(fd), name)
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			return nil, err
		}
		return c.(*net.UnixConn), nil
	}
	if a, err = conv(fds[0], "pair-a"); err != nil {
		unix.Close(fds[1])
		return nil, nil, err
	}
	if b, err = conv(fds[1], "pair-b"); err != nil {
		a.Close()
		return nil, nil, err
	}
	return a, b, nil
}
