// Package metricsrv serves Prometheus text expositions over HTTP on a Unix
// socket: the --metrics-socket of `microvm run`, `exec` (through
// Config.MetricsSocket) and `vhost-user-vsock`. docs/metrics.md describes
// what is served.
//
// It speaks the small part of HTTP/1.1 (RFC 9112) a scraper needs, not
// net/http: one request per connection (the answer says Connection:
// close), GET or HEAD of /metrics, a request head of at most 16 KiB read
// within 5 s. net/http would be the library for anything more; for this it
// cost the VMM binary 3.8 MB and `microvm run` 2.2 MiB of peak RSS
// (docs/benchmarks.md, "Start-up"), as Firecracker's micro_http crate
// answers the same trade-off for its API socket.
package metricsrv

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/internal/jail"
	"github.com/microvm/microvm/internal/promtext"
	"github.com/microvm/microvm/internal/unixsock"
)

// Limits on a client.
const (
	// MaxHead bounds a request's line and headers.
	MaxHead = 16 << 10
	// ReadTimeout bounds the wait for a request's head, WriteTimeout the
	// answer's write: a local client that stalls cannot hold a connection.
	ReadTimeout  = 5 * time.Second
	WriteTimeout = 10 * time.Second
	// MaxConns bounds the connections served at once; more are answered
	// 503 and closed.
	MaxConns = 16
)

// readTimeout is ReadTimeout, shortened by tests.
var readTimeout = ReadTimeout

// Server serves an exposition at /metrics over HTTP on a Unix socket.
//
// Owner: whoever Start returned it to (the Machine for
// Config.MetricsSocket, which starts it as New's last step and closes it
// first in Close; `microvm vhost-user-vsock` for its --metrics-socket).
// Start runs one accept goroutine, which starts one goroutine per client
// connection; Close returns only once the accept goroutine and every
// connection's goroutine have returned, so no write of the exposition
// outlives it. write should read only counters, never file descriptors.
//
// Lock: mu guards closed and conns; it is a leaf, never held across I/O.
type Server struct {
	path        string
	ln          *net.UnixListener
	write       func(io.Writer) error
	log         logrus.FieldLogger
	readTimeout time.Duration

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{} // connections being served
	wg     sync.WaitGroup        // the accept goroutine and every connection's
}

// Start creates the socket at path (0600, replacing a stale socket file,
// refusing a live one or any other file: unixsock.Listen) and serves what
// write writes at /metrics: the Prometheus text format, version 0.0.4.
// write is called once per GET, on the connection's goroutine.
func Start(path string, write func(io.Writer) error, log logrus.FieldLogger) (*Server, error) {
	dir := filepath.Dir(path)
	if fi, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("metrics socket %s: directory %s: %w", path, dir, unwrapPath(err))
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("metrics socket %s: %s is not a directory", path, dir)
	}
	ln, err := unixsock.Listen(path)
	if err != nil {
		return nil, fmt.Errorf("metrics socket: %w", err)
	}
	s := &Server{path: path, ln: ln, write: write, log: log, readTimeout: readTimeout, conns: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// accept is the accept goroutine: it ends when Close closes the listener.
func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.WithError(err).Error("metrics server stopped")
			}
			return
		}
		s.mu.Lock()
		switch {
		case s.closed:
			s.mu.Unlock()
			c.Close()
			return
		case len(s.conns) >= MaxConns:
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				_ = c.SetReadDeadline(time.Now().Add(s.readTimeout))
				_, _ = readRequest(bufio.NewReaderSize(io.LimitReader(c, MaxHead+1), 4096))
				_ = c.SetWriteDeadline(time.Now().Add(WriteTimeout))
				_ = respond(c, 503, "too many metrics clients at once\n", false)
				linger(c)
			}()
			continue
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serve(c)
	}
}

// serve answers one request on c and closes it.
func (s *Server) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	_ = c.SetReadDeadline(time.Now().Add(s.readTimeout))
	req, err := readRequest(bufio.NewReaderSize(io.LimitReader(c, MaxHead+1), 4096))
	_ = c.SetWriteDeadline(time.Now().Add(WriteTimeout))
	if err != nil {
		var he *httpError
		if errors.As(err, &he) {
			_ = respond(c, he.status, he.msg+"\n", false)
			linger(c) // the rest of what it sent is unread
		}
		return // a client gone away or too slow gets nothing
	}
	switch {
	case req.path != "/metrics":
		_ = respond(c, 404, "not found: only /metrics is served\n", false)
	case req.method != "GET" && req.method != "HEAD":
		_ = respond(c, 405, "only GET and HEAD\n", false)
	default:
		var body bytes.Buffer
		if err := s.write(&body); err != nil {
			_ = respond(c, 500, "metrics: "+err.Error()+"\n", false)
			return
		}
		_ = respondBody(c, body.Bytes(), req.method == "HEAD")
	}
}

// linger ends an answer given before the request was read whole: a socket
// closed with unread data resets the connection, and the client would lose
// the answer. It shuts down the sending side and reads what is left for a
// moment (at most 256 KiB, 1 s), as HTTP servers' "lingering close" does.
func linger(c net.Conn) {
	if uc, ok := c.(*net.UnixConn); ok {
		_ = uc.CloseWrite()
	}
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	_, _ = io.Copy(io.Discard, io.LimitReader(c, 256<<10))
}

// request is what serve needs of a request head.
type request struct {
	method, path string
}

// httpError is a request the server answers with an error status.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return strconv.Itoa(e.status) + " " + e.msg }

// readRequest reads a request line and headers (RFC 9112, 3 and 5) from r,
// which holds at most MaxHead+1 bytes: the line must be METHOD SP TARGET SP
// HTTP/1.x with an origin-form target; the headers are read to the empty
// line and ignored (a GET has no body to read, and the connection closes
// after the answer). A bare LF ends lines as well as CRLF (RFC 9112, 2.2).
func readRequest(r *bufio.Reader) (request, error) {
	var req request
	n := 0
	line := func() (string, error) {
		s, err := r.ReadString('\n')
		n += len(s)
		if n > MaxHead {
			return "", &httpError{431, "request head over " + strconv.Itoa(MaxHead) + " bytes"}
		}
		if err != nil {
			return "", err // a closed, silent or truncated client
		}
		return strings.TrimSuffix(strings.TrimSuffix(s, "\n"), "\r"), nil
	}
	first, err := line()
	if err != nil {
		return req, err
	}
	parts := strings.Split(first, " ")
	if len(parts) != 3 || parts[0] == "" || !strings.HasPrefix(parts[1], "/") ||
		(parts[2] != "HTTP/1.1" && parts[2] != "HTTP/1.0") {
		return req, &httpError{400, "bad request line"}
	}
	for _, ch := range parts[0] {
		if ch < 'A' || ch > 'Z' {
			return req, &httpError{400, "bad method"}
		}
	}
	req.method = parts[0]
	req.path, _, _ = strings.Cut(parts[1], "?")
	for {
		h, err := line()
		if err != nil {
			return req, err
		}
		if h == "" {
			return req, nil
		}
		if k, _, ok := strings.Cut(h, ":"); !ok || k == "" || strings.ContainsAny(k, " \t") {
			return req, &httpError{400, "bad header line"}
		}
	}
}

// statusText names the statuses the server sends.
var statusText = map[int]string{200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
	431: "Request Header Fields Too Large", 500: "Internal Server Error", 503: "Service Unavailable"}

// respond writes an answer with a plain-text body.
func respond(w io.Writer, status int, msg string, head bool) error {
	extra := ""
	if status == 405 {
		extra = "Allow: GET, HEAD\r\n"
	}
	return write(w, status, "text/plain; charset=utf-8", extra, []byte(msg), head)
}

// respondBody writes a 200 answer with the exposition.
func respondBody(w io.Writer, body []byte, head bool) error {
	return write(w, 200, promtext.ContentType, "", body, head)
}

func write(w io.Writer, status int, ctype, extra string, body []byte, head bool) error {
	hdr := fmt.Sprintf("HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%sConnection: close\r\n\r\n",
		status, statusText[status], ctype, len(body), extra)
	if head {
		_, err := io.WriteString(w, hdr)
		return err
	}
	_, err := w.Write(append([]byte(hdr), body...))
	return err
}

// Close stops the server: the listener and every connection are closed (a
// write to a client fails at once), then it waits for the accept goroutine
// and every connection's, and removes the socket file (by its name inside
// --chroot once microvm entered one: jail.Path).
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	conns := make([]net.Conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	err := s.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	s.wg.Wait()
	if rerr := os.Remove(jail.Path(s.path)); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	return err
}

// unwrapPath drops *os.PathError's operation and path, which the message
// already gives.
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
