// Package metricsrv serves Prometheus text expositions over HTTP on a Unix
// socket: the --metrics-socket of `microvm run`, `exec` (through
// Config.MetricsSocket) and `vhost-user-vsock`. docs/metrics.md describes
// what is served.
package metricsrv

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/internal/jail"
	"github.com/microvm/microvm/internal/promtext"
	"github.com/microvm/microvm/internal/unixsock"
)

// Handler serves GET (and HEAD) requests with what write writes, in the
// Prometheus text exposition format, version 0.0.4; other methods get 405.
// write is called once per GET, from the request's goroutine.
func Handler(write func(io.Writer) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "only GET and HEAD", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", promtext.ContentType)
		if r.Method == http.MethodHead {
			return
		}
		_ = write(w) // a client gone away is no error of ours
	})
}

// Server serves a handler at /metrics over HTTP on a Unix socket.
//
// Owner: whoever Start returned it to (the Machine for
// Config.MetricsSocket, which starts it as New's last step and closes it
// first in Close; `microvm vhost-user-vsock` for its --metrics-socket).
// Start runs one accept goroutine (net/http's Serve), which starts one
// goroutine per client connection; Close returns only once the accept
// goroutine and every request handler have returned, so no handler
// outlives it. Handlers should read only counters, never file descriptors.
type Server struct {
	path   string
	ln     *net.UnixListener
	srv    *http.Server
	served chan struct{} // closed when Serve returned

	mu       sync.Mutex // guards closed, and orders handlers.Add before close's Wait
	closed   bool
	handlers sync.WaitGroup // requests being served
}

// Start creates the socket at path (0600, replacing a stale socket file,
// refusing a live one or any other file: unixsock.Listen) and starts
// serving h at /metrics.
func Start(path string, h http.Handler, log logrus.FieldLogger) (*Server, error) {
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
	s := &Server{path: path, ln: ln, served: make(chan struct{})}
	mux := http.NewServeMux()
	mux.Handle("/metrics", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.enter() {
			http.Error(w, "the machine is closing", http.StatusServiceUnavailable)
			return
		}
		defer s.handlers.Done()
		h.ServeHTTP(w, r)
	}))
	// A local client that stalls cannot hold a connection for ever.
	s.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    16 << 10,
	}
	go func() {
		defer close(s.served)
		if err := s.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.WithError(err).Error("metrics server stopped")
		}
	}()
	return s, nil
}

// enter registers a request about to be served; false once close began (a
// connection's goroutine can get to its handler after Server.Close).
func (s *Server) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.handlers.Add(1)
	return true
}

// Close stops the server: no request starts any more, the listener and
// every connection are closed (a handler writing to a client fails at
// once), then it waits for Serve and the handlers, and removes the socket
// file (by its name inside --chroot once microvm entered one: jail.Path).
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	err := s.srv.Close()
	<-s.served
	s.handlers.Wait()
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
