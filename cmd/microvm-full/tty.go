package main

import (
	"errors"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/term"

	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/agentvm"
	"github.com/microvm/microvm/internal/clibase"
)

// errNotTTY: -t asked for a terminal, but stdin is not one.
var errNotTTY = errors.New("-t: stdin is not a terminal (drop -t, or run from one)")

// checkTTY refuses -t, before anything is booted, when stdin is not a
// terminal.
func checkTTY(cmd guestCmd, stdin any) error {
	if !cmd.tty {
		return nil
	}
	if f, ok := stdin.(*os.File); !ok || !term.IsTerminal(int(f.Fd())) {
		return clibase.UsageError{Err: errNotTTY}
	}
	return nil
}

// hostTTY is the host terminal an exec -t command runs on: in raw mode
// while the command runs, its size sent to the guest's pty at the start
// and on every SIGWINCH.
//
// Owner: the goroutine running the command; the SIGWINCH goroutine only
// sends on resize, and restore stops it before the terminal is restored.
type hostTTY struct {
	fd     int
	state  *term.State
	resize chan *agentapi.PtySize
	winch  chan os.Signal
	done   chan struct{}
}

// openTTY puts stdin's terminal in raw mode and starts following its
// size. stdin must be an *os.File on a terminal.
func openTTY(stdin any) (*hostTTY, *agentapi.PtySize, error) {
	f, ok := stdin.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return nil, nil, errNotTTY
	}
	fd := int(f.Fd())
	size := ttySize(fd)
	st, err := term.MakeRaw(fd)
	if err != nil {
		return nil, nil, err
	}
	t := &hostTTY{fd: fd, state: st, resize: make(chan *agentapi.PtySize), winch: make(chan os.Signal, 1), done: make(chan struct{})}
	signal.Notify(t.winch, syscall.SIGWINCH)
	go func() {
		for {
			select {
			case <-t.winch:
				select {
				case t.resize <- ttySize(fd):
				case <-t.done:
					return
				}
			case <-t.done:
				return
			}
		}
	}()
	return t, size, nil
}

// agentTTY opens stdin's terminal for agentvm.RunCommand (openTTY); a
// stdin that is not one is a usage error.
func agentTTY(stdin any) (agentvm.TTY, error) {
	t, size, err := openTTY(stdin)
	if err != nil {
		return agentvm.TTY{}, clibase.UsageError{Err: err}
	}
	return agentvm.TTY{Size: size, Resize: t.resize, Term: os.Getenv("TERM"), Restore: t.restore}, nil
}

// ttySize is the terminal's size, 24x80 when it cannot be read.
func ttySize(fd int) *agentapi.PtySize {
	cols, rows, err := term.GetSize(fd)
	if err != nil || rows <= 0 || cols <= 0 {
		return &agentapi.PtySize{Rows: 24, Cols: 80}
	}
	return &agentapi.PtySize{Rows: uint32(rows), Cols: uint32(cols)}
}

// restore stops following the size and gives the terminal its mode back.
func (t *hostTTY) restore() {
	signal.Stop(t.winch)
	close(t.done)
	_ = term.Restore(t.fd, t.state)
}
