package metricsrv

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
)

func quietLog() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// start serves write on a socket in a short temporary directory.
func start(t *testing.T, write func(io.Writer) error) (*Server, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "msrv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "m.sock")
	s, err := Start(path, write, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

// exchange sends raw on a new connection and returns all the server says
// before it closes.
func exchange(t *testing.T, path, raw string) string {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading the answer to %q: %v", raw, err)
	}
	return string(b)
}

// TestRequests: the answer to each request, byte for byte where it
// matters: status line, headers, body or none.
func TestRequests(t *testing.T) {
	_, path := start(t, func(w io.Writer) error { _, err := io.WriteString(w, "m 1\n"); return err })
	for _, tc := range []struct {
		name, raw, status string
		body              string // "" for no body check
		want              []string
	}{
		{"GET", "GET /metrics HTTP/1.1\r\nHost: x\r\nUser-Agent: t\r\n\r\n", "HTTP/1.1 200 OK", "m 1\n",
			[]string{"Content-Type: text/plain; version=0.0.4; charset=utf-8", "Content-Length: 4", "Connection: close"}},
		{"HTTP/1.0, bare LF, query", "GET /metrics?x=1 HTTP/1.0\n\n", "HTTP/1.1 200 OK", "m 1\n", nil},
		{"HEAD", "HEAD /metrics HTTP/1.1\r\n\r\n", "HTTP/1.1 200 OK", "", []string{"Content-Length: 4"}},
		{"POST", "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", "HTTP/1.1 405 Method Not Allowed", "only GET and HEAD\n", []string{"Allow: GET, HEAD"}},
		{"other path", "GET / HTTP/1.1\r\n\r\n", "HTTP/1.1 404 Not Found", "", nil},
		{"longer path", "GET /metricsx HTTP/1.1\r\n\r\n", "HTTP/1.1 404 Not Found", "", nil},
		{"absolute form", "GET http://x/metrics HTTP/1.1\r\n\r\n", "HTTP/1.1 400 Bad Request", "", nil},
		{"HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "HTTP/1.1 400 Bad Request", "", nil},
		{"lower-case method", "get /metrics HTTP/1.1\r\n\r\n", "HTTP/1.1 400 Bad Request", "", nil},
		{"bad header", "GET /metrics HTTP/1.1\r\nno colon\r\n\r\n", "HTTP/1.1 400 Bad Request", "", nil},
		{"head too long", "GET /metrics HTTP/1.1\r\nX: " + strings.Repeat("a", MaxHead) + "\r\n\r\n", "HTTP/1.1 431 Request Header Fields Too Large", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := exchange(t, path, tc.raw)
			head, body, ok := strings.Cut(got, "\r\n\r\n")
			if !ok {
				t.Fatalf("answer %q has no end of head", got)
			}
			lines := strings.Split(head, "\r\n")
			if lines[0] != tc.status {
				t.Errorf("status line %q, want %q", lines[0], tc.status)
			}
			for _, w := range tc.want {
				found := false
				for _, l := range lines[1:] {
					found = found || l == w
				}
				if !found {
					t.Errorf("no header %q in %q", w, head)
				}
			}
			if tc.body != "" && body != tc.body {
				t.Errorf("body %q, want %q", body, tc.body)
			}
			if strings.HasPrefix(tc.raw, "HEAD") && body != "" {
				t.Errorf("HEAD answered with body %q", body)
			}
		})
	}
}

// TestWriteError: a failing write is a 500, not a truncated 200.
func TestWriteError(t *testing.T) {
	_, path := start(t, func(w io.Writer) error {
		_, _ = io.WriteString(w, "partial")
		return errors.New("boom")
	})
	got := exchange(t, path, "GET /metrics HTTP/1.1\r\n\r\n")
	if !strings.HasPrefix(got, "HTTP/1.1 500 ") || strings.Contains(got, "partial") || !strings.Contains(got, "boom") {
		t.Errorf("answer %q; want a 500 naming the error, without the partial body", got)
	}
}

// TestSilentClient: a client that sends nothing is closed after the read
// timeout, without an answer.
func TestSilentClient(t *testing.T) {
	old := readTimeout
	readTimeout = 50 * time.Millisecond
	defer func() { readTimeout = old }()
	_, path := start(t, func(w io.Writer) error { return nil })
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil || len(b) != 0 {
		t.Errorf("a silent client got %q, %v; want the connection closed with nothing said", b, err)
	}
}

// TestTooManyClients: past MaxConns connections at once, a new one is
// answered 503; once they go, scrapes work again.
func TestTooManyClients(t *testing.T) {
	_, path := start(t, func(w io.Writer) error { return nil })
	var held []net.Conn
	for range MaxConns {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	// The accept goroutine registers connections in order: one
	// request answered on the last held connection proves all are in.
	time.Sleep(50 * time.Millisecond)
	got := exchange(t, path, "GET /metrics HTTP/1.1\r\n\r\n")
	if !strings.HasPrefix(got, "HTTP/1.1 503 ") {
		t.Errorf("connection %d: %q, want 503", MaxConns+1, got)
	}
	for _, c := range held {
		c.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got = exchange(t, path, "GET /metrics HTTP/1.1\r\n\r\n")
		if strings.HasPrefix(got, "HTTP/1.1 200 ") || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.HasPrefix(got, "HTTP/1.1 200 ") {
		t.Errorf("after the clients left: %q, want 200", got)
	}
}

// TestCloseWaits: Close waits for a write in flight, closes the client's
// connection and removes the socket file.
func TestCloseWaits(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	s, path := start(t, func(w io.Writer) error {
		once.Do(func() { close(entered) })
		<-release
		return nil
	})
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	<-entered
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	select {
	case err := <-done:
		t.Fatalf("Close returned (%v) during a write", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := <-done; err != nil {
		t.Errorf("Close: %v", err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket file after Close: %v", err)
	}
}

// FuzzReadRequest: any bytes give a request or an error, never a panic;
// an accepted request has an upper-case method and an origin-form path,
// and no more than MaxHead+1 bytes are read.
func FuzzReadRequest(f *testing.F) {
	f.Add([]byte("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"))
	f.Add([]byte("HEAD /metrics?a=b HTTP/1.0\n\n"))
	f.Add([]byte("GET / HTTP/1.1\r\nX:\r\n\r\nbody"))
	f.Add([]byte("G\x00T /metrics HTTP/1.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		cr := &countReader{r: strings.NewReader(string(b))}
		req, err := readRequest(bufio.NewReaderSize(io.LimitReader(cr, MaxHead+1), 4096))
		if cr.n > MaxHead+1 {
			t.Fatalf("read %d bytes", cr.n)
		}
		if err != nil {
			return
		}
		if req.method == "" || strings.Trim(req.method, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != "" {
			t.Errorf("accepted method %q", req.method)
		}
		if !strings.HasPrefix(req.path, "/") || strings.Contains(req.path, "?") {
			t.Errorf("accepted path %q", req.path)
		}
	})
}

type countReader struct {
	r io.Reader
	n int
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}
