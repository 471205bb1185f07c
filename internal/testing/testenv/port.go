package testenv

import (
	"net"
	"testing"
)

// FreeLoopbackPort returns a port of proto ("tcp" or "udp") that nothing
// on 127.0.0.1 holds now, for a listener a test or benchmark has someone
// else bind (a published port). Like the vsock helpers it takes no
// testing.TB: bench/usernet uses it too.
func FreeLoopbackPort(proto string) (uint16, error) {
	if proto == "udp" {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		defer c.Close()
		return uint16(c.LocalAddr().(*net.UDPAddr).Port), nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port), nil
}

// FreePort is FreeLoopbackPort for a test: a failure ends it.
func FreePort(tb testing.TB, proto string) uint16 {
	tb.Helper()
	p, err := FreeLoopbackPort(proto)
	if err != nil {
		tb.Fatalf("a free %s port on 127.0.0.1: %v", proto, err)
	}
	return p
}
