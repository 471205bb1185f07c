package testenv

import (
	"context"
	"net"
	"net/http"
	"os"
	"testing"
	"time"
)

// ShortDir is a fresh directory with a short path, removed when the test
// ends: sun_path holds 107 bytes, and t.TempDir() names can be longer.
func ShortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "mvm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// UnixClient is an HTTP client whose every request goes to the Unix socket
// path, as curl --unix-socket does.
func UnixClient(path string) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}}
}

// AcceptWithin is l.Accept, failing the test if it takes longer than d.
func AcceptWithin(t *testing.T, l net.Listener, d time.Duration) (net.Conn, error) {
	t.Helper()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := l.Accept()
		ch <- res{c, err}
	}()
	select {
	case r := <-ch:
		return r.c, r.err
	case <-time.After(d):
		l.Close() // releases the Accept goroutine
		t.Fatalf("Accept did not return within %v", d)
		return nil, nil
	}
}
