package microvm

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/internal/jail"
	"github.com/microvm/microvm/internal/unixsock"
)

// maxSunPath is the longest path a Unix socket address holds (sun_path,
// less its terminating NUL).
const maxSunPath = 107

// CheckMetricsSocket checks a Config.MetricsSocket path as New does before
// it creates anything: empty is off; a path longer than a Unix socket
// address holds is an ErrConfig. (Whether its directory exists, or a live
// socket is there, New finds out when it creates the socket.)
func CheckMetricsSocket(path string) error {
	if path == "" {
		return nil
	}
	if len(path) > maxSunPath {
		return fmt.Errorf("%w: metrics socket path %q is %d bytes; a Unix socket path holds at most %d",
			ErrConfig, path, len(path), maxSunPath)
	}
	return nil
}

// metricsServer serves Machine.MetricsHandler at /metrics over HTTP on a
// Unix socket (Config.MetricsSocket).
//
// Owner: the Machine. New starts it as its last step (one accept goroutine,
// net/http's Serve, plus one goroutine per client connection that Serve
// starts); Close stops it before tearing anything else down, and returns
// only once the accept goroutine and every request handler have returned,
// so no handler outlives the machine's Close. The handlers read only
// counters (Machine.Metrics), never the VM's file descriptors.
type metricsServer struct {
	path   string
	ln     *net.UnixListener
	srv    *http.Server
	served chan struct{} // closed when Serve returned

	mu       sync.Mutex // guards closed, and orders handlers.Add before close's Wait
	closed   bool
	handlers sync.WaitGroup // requests being served
}

// startMetricsServer creates the socket at path and starts serving h.
func startMetricsServer(path string, h http.Handler, log logrus.FieldLogger) (*metricsServer, error) {
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
	s := &metricsServer{path: path, ln: ln, served: make(chan struct{})}
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
func (s *metricsServer) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.handlers.Add(1)
	return true
}

// close stops the server: no request starts any more, the listener and
// every connection are closed (a handler writing to a client fails at
// once), then it waits for Serve and the handlers, and removes the socket
// file.
func (s *metricsServer) close() error {
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
