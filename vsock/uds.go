package vsock

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/internal/jail"
	"github.com/microvm/microvm/internal/unixsock"
	"golang.org/x/sys/unix"
)

// maxSunPath is the usable length of sockaddr_un.sun_path (108 bytes,
// including the terminating NUL).
const maxSunPath = 107

// CheckUDSPath verifies that path, and path with any "_<port>" suffix,
// fits in sun_path.
func CheckUDSPath(path string) error {
	if path == "" {
		return errors.New("vsock: empty Unix socket path")
	}
	longest := len(path) + len("_4294967295")
	if longest > maxSunPath {
		return fmt.Errorf("vsock: Unix socket path %q is %d bytes; with the _<port> suffix of guest connections it can reach %d, over the %d that sun_path holds",
			path, len(path), longest, maxSunPath)
	}
	return nil
}

// UDSDialer connects guest-initiated connections to port P at "<Path>_P",
// Firecracker's convention. Path is a host path: once microvm entered its
// --chroot, internal/jail maps it to its name inside the new root.
type UDSDialer struct {
	Path string
}

// Dial implements Dialer.
func (u UDSDialer) Dial(_, port uint32, timeout time.Duration) (int, error) {
	c, err := net.DialTimeout("unix", jail.Path(u.Path+"_"+strconv.FormatUint(uint64(port), 10)), timeout)
	if err != nil {
		return -1, err
	}
	return connFD(c.(*net.UnixConn))
}

// DialSeqpacket implements SeqpacketDialer: a guest SEQPACKET connection to
// port P connects to "<Path>_P" with SOCK_SEQPACKET. A stream listener there
// refuses (EPROTOTYPE) and the guest's connection is reset like any refused
// one.
func (u UDSDialer) DialSeqpacket(_, port uint32, timeout time.Duration) (int, error) {
	c, err := net.DialTimeout("unixpacket", jail.Path(u.Path+"_"+strconv.FormatUint(uint64(port), 10)), timeout)
	if err != nil {
		return -1, err
	}
	return connFD(c.(*net.UnixConn))
}

// SeqpacketSuffix is appended to the UDS path for the SOCK_SEQPACKET
// listening socket of host-initiated SEQPACKET connections.
const SeqpacketSuffix = ".seqpacket"

// connFD takes a connected socket's descriptor out of the Go runtime: it
// returns a duplicate (non-blocking, like the original: the flag lives in
// the shared open file description) and closes the net.Conn.
func connFD(c *net.UnixConn) (int, error) {
	defer c.Close()
	raw, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var derr error
	if err := raw.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return -1, err
	}
	if derr != nil {
		return -1, fmt.Errorf("vsock: dup socket: %w", derr)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		closeFD(fd)
		return -1, err
	}
	return fd, nil
}

// UDS is the host side of the device: a listening Unix socket where host
// clients connect and send "CONNECT <port>\n" to reach guest port <port>,
// and a second one, SOCK_SEQPACKET, at the same path plus SeqpacketSuffix
// for SEQPACKET connections: there the client sends the record
// "CONNECT <port>\n", gets the record "OK <host port>\n" once the guest
// (listening with SOCK_SEQPACKET) accepts, and from then on each record is
// one message each way. A stream client cannot reach a SEQPACKET guest
// socket nor the other way round: the guest refuses a REQUEST of the other
// type.
//
// Goroutines: Serve accepts on both sockets; each accepted client gets a
// short-lived handshake goroutine that parses the CONNECT line under a
// deadline and hands the socket to the device. At most MaxConns run at once;
// more clients are closed at once.
type UDS struct {
	path    string
	dev     *Device
	timeout time.Duration
	log     logrus.FieldLogger
	ln      *net.UnixListener
	seqLn   *net.UnixListener // at path+SeqpacketSuffix
	sem     chan struct{}
	wg      sync.WaitGroup
	once    sync.Once
}

// ListenUDS creates the listening socket at path, and the SEQPACKET one at
// path+SeqpacketSuffix, with mode 0600, replacing a stale socket file (one
// nobody listens on) but refusing to replace a live socket or any other kind
// of file. Each socket is bound under a private temporary name and renamed
// into place, so it is never reachable with looser permissions.
func ListenUDS(path string, dev *Device, timeout time.Duration, log logrus.FieldLogger) (*UDS, error) {
	if err := CheckUDSPath(path); err != nil {
		return nil, err
	}
	if timeout <= 0 {
		timeout = DefaultConnectTimeout
	}
	if log == nil {
		log = logrus.StandardLogger()
	}
	ln, err := unixsock.Listen(path)
	if err != nil {
		return nil, fmt.Errorf("vsock: %w", err)
	}
	seqLn, err := unixsock.ListenNet("unixpacket", path+SeqpacketSuffix)
	if err != nil {
		ln.Close()
		os.Remove(path)
		return nil, fmt.Errorf("vsock: %w", err)
	}
	return &UDS{path: path, dev: dev, timeout: timeout, log: log, ln: ln, seqLn: seqLn,
		sem: make(chan struct{}, dev.cfg.MaxConns)}, nil
}

// Path is the listening socket's path.
func (u *UDS) Path() string { return u.path }

// SeqpacketPath is the SEQPACKET listening socket's path.
func (u *UDS) SeqpacketPath() string { return u.path + SeqpacketSuffix }

// Serve accepts host clients on both sockets until Close.
func (u *UDS) Serve() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		u.serve(u.seqLn, u.handshakeSeqpacket)
	}()
	u.serve(u.ln, u.handshake)
	<-done
}

func (u *UDS) serve(ln *net.UnixListener, handshake func(*net.UnixConn)) {
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			u.log.WithError(err).Warn("vsock: accept")
			time.Sleep(10 * time.Millisecond) // e.g. EMFILE: do not spin
			continue
		}
		select {
		case u.sem <- struct{}{}:
		default:
			u.log.Warn("vsock: too many host connections in handshake; closing one")
			c.Close()
			continue
		}
		u.wg.Add(1)
		go func() {
			defer u.wg.Done()
			defer func() { <-u.sem }()
			handshake(c)
		}()
	}
}

// handshake reads the CONNECT line and hands the connection to the device.
// Any failure closes the client connection: that is its error signal.
func (u *UDS) handshake(c *net.UnixConn) {
	deadline := time.Now().Add(u.timeout)
	_ = c.SetReadDeadline(deadline)
	var p ConnectParser
	buf := make([]byte, MaxConnectLine)
	for {
		n, err := c.Read(buf)
		port, rest, done, perr := p.Feed(buf[:n])
		if perr != nil {
			u.log.WithError(perr).Info("vsock: host client rejected")
			c.Close()
			return
		}
		if done {
			if err := c.SetReadDeadline(time.Time{}); err != nil {
				c.Close()
				return
			}
			fd, err := connFD(c)
			if err != nil {
				u.log.WithError(err).Warn("vsock: host client")
				return
			}
			if err := u.dev.ConnectFromHost(fd, port, rest, deadline); err != nil {
				u.log.WithError(err).WithField("port", port).Info("vsock: host connection refused")
			}
			return
		}
		if err != nil {
			u.log.WithError(err).Debug("vsock: host client gone before CONNECT")
			c.Close()
			return
		}
	}
}

// handshakeSeqpacket reads the CONNECT record and hands the connection to
// the device as a SEQPACKET one. The record is the line, its newline
// optional; anything more in it is an error, like a line too long.
func (u *UDS) handshakeSeqpacket(c *net.UnixConn) {
	deadline := time.Now().Add(u.timeout)
	_ = c.SetReadDeadline(deadline)
	buf := make([]byte, MaxConnectLine)
	n, _, flags, _, err := c.ReadMsgUnix(buf, nil)
	if err == nil && n == 0 {
		err = errors.New("end of stream")
	}
	if err != nil {
		u.log.WithError(err).Debug("vsock: SEQPACKET host client gone before CONNECT")
		c.Close()
		return
	}
	rec := buf[:n]
	if rec[n-1] != '\n' {
		rec = append(rec, '\n')
	}
	var p ConnectParser
	port, rest, done, perr := p.Feed(rec)
	switch {
	case perr != nil:
	case flags&unix.MSG_TRUNC != 0:
		perr = fmt.Errorf("%w: a CONNECT record longer than %d bytes", ErrConnectLine, MaxConnectLine)
	case !done || len(rest) > 0:
		perr = fmt.Errorf("%w: %q: want one line in the record", ErrConnectLine, buf[:n])
	}
	if perr != nil {
		u.log.WithError(perr).Info("vsock: SEQPACKET host client rejected")
		c.Close()
		return
	}
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		c.Close()
		return
	}
	fd, err := connFD(c)
	if err != nil {
		u.log.WithError(err).Warn("vsock: SEQPACKET host client")
		return
	}
	if err := u.dev.ConnectSeqpacketFromHost(fd, port, deadline); err != nil {
		u.log.WithError(err).WithField("port", port).Info("vsock: SEQPACKET host connection refused")
	}
}

// Close stops accepting, waits for handshakes in progress and removes the
// socket files. Established connections belong to the device.
func (u *UDS) Close() error {
	var err error
	u.once.Do(func() {
		err = u.ln.Close()
		if serr := u.seqLn.Close(); err == nil {
			err = serr
		}
		u.wg.Wait()
		for _, p := range []string{u.path, u.SeqpacketPath()} {
			if rerr := os.Remove(jail.Path(p)); rerr != nil && !errors.Is(rerr, os.ErrNotExist) && err == nil {
				err = rerr
			}
		}
	})
	return err
}
