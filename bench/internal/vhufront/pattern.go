package vhufront

import (
	"bytes"
	"fmt"

	"golang.org/x/sys/unix"
)

// PatternPeriod is the period of the byte stream every sender sends: a
// prime, so a chunk delivered at the wrong offset, twice or not at all
// does not line up with the pattern again at any power-of-two size.
const PatternPeriod = 65521

// pattern holds one period plus MaxPayload bytes, so that any chunk of up to
// MaxPayload bytes at any stream offset is one contiguous slice.
var pattern = func() []byte {
	b := make([]byte, PatternPeriod+MaxPayload)
	x := uint64(0x9e3779b97f4a7c15)
	for i := range PatternPeriod {
		// xorshift64*: cheap, and no byte value or short run dominates.
		x ^= x >> 12
		x ^= x << 25
		x ^= x >> 27
		b[i] = byte((x * 0x2545f4914f6cdd1d) >> 56)
	}
	// Byte by byte: the tail repeats the table from its start, and its
	// last bytes repeat bytes this loop wrote itself (MaxPayload is more
	// than one period), which a single copy would take before they exist.
	for i := PatternPeriod; i < len(b); i++ {
		b[i] = b[i-PatternPeriod]
	}
	return b
}()

// PatternAt returns the n (at most MaxPayload) stream bytes at offset off.
func PatternAt(off int64, n int) []byte {
	if n > MaxPayload {
		panic(fmt.Sprintf("vhufront: pattern chunk of %d bytes", n))
	}
	i := int(off % PatternPeriod)
	return pattern[i : i+n : i+n]
}

// CheckPattern reports whether p is the stream's bytes at offset off, or
// the offset of the first byte that is not.
func CheckPattern(off int64, p []byte) error {
	for len(p) > 0 {
		n := min(len(p), MaxPayload)
		want := PatternAt(off, n)
		if !bytes.Equal(p[:n], want) {
			for i := range n {
				if p[i] != want[i] {
					return fmt.Errorf("stream byte %d is %#02x, want %#02x", off+int64(i), p[i], want[i])
				}
			}
		}
		off += int64(n)
		p = p[n:]
	}
	return nil
}

// Mono is CLOCK_MONOTONIC in nanoseconds: the same clock in every process
// of the host, so a sender's start and a receiver's end in another process
// make one interval.
func Mono() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic("vhufront: clock_gettime: " + err.Error())
	}
	return ts.Nano()
}
