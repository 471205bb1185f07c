package hybrid

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// pipeT runs Pipe with a 5-second handshake and returns its error after at
// most 10 seconds.
func pipeT(t *testing.T, path string, port uint32, in io.Reader, out io.Writer) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res := make(chan error, 1)
	go func() { res <- Pipe(ctx, path, port, in, out) }()
	select {
	case err := <-res:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Pipe did not return")
		return nil
	}
}

// TestPipe: the bytes that came with the OK line and after it reach out,
// in's bytes reach the guest, and the end of in is a half-close the guest
// reads as end of stream before it answers and closes.
func TestPipe(t *testing.T) {
	got := make(chan string, 1)
	path, lines := fakeVMM(t, func(c *net.UnixConn, line string) {
		if _, err := c.Write([]byte("OK 1073741824\nhello ")); err != nil {
			got <- err.Error()
			return
		}
		b, err := io.ReadAll(c) // until Pipe's half-close
		if err != nil {
			got <- err.Error()
			return
		}
		got <- string(b)
		_, _ = c.Write([]byte("from the guest"))
	})
	var out bytes.Buffer
	if err := pipeT(t, path, 52, strings.NewReader("from the host"), &out); err != nil {
		t.Fatal(err)
	}
	checkLine(t, lines, "CONNECT 52\n")
	if out.String() != "hello from the guest" {
		t.Errorf("out = %q, want %q", out.String(), "hello from the guest")
	}
	if g := <-got; g != "from the host" {
		t.Errorf("the guest read %q, want %q", g, "from the host")
	}
}

// TestPipeRefused: a refused handshake is Dial's error, and nothing is
// copied.
func TestPipeRefused(t *testing.T) {
	path, _ := fakeVMM(t, func(c *net.UnixConn, line string) {})
	var out bytes.Buffer
	err := pipeT(t, path, 9, strings.NewReader("unsent"), &out)
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "CONNECT 9") {
		t.Errorf("Pipe: %v, want Dial's ErrRefused for CONNECT 9", err)
	}
	if out.Len() != 0 {
		t.Errorf("out = %q, want nothing", out.String())
	}
}

// TestPipeGuestEndsFirst: Pipe returns when the guest closes, while in
// (a pipe nobody writes, like an idle terminal) has not ended.
func TestPipeGuestEndsFirst(t *testing.T) {
	path, _ := fakeVMM(t, func(c *net.UnixConn, line string) {
		_, _ = c.Write([]byte("OK 5\nbye"))
	})
	in, inw := io.Pipe()
	defer inw.Close() // lets the goroutine reading in end
	var out bytes.Buffer
	if err := pipeT(t, path, 5, in, &out); err != nil {
		t.Fatalf("Pipe: %v", err)
	}
	if out.String() != "bye" {
		t.Errorf("out = %q, want %q", out.String(), "bye")
	}
}

// TestPipeSendError: a failed read from in, which Pipe has seen by the time
// the guest closes, is its error, after "sending: "; the stream is still
// half-closed so the guest ends.
func TestPipeSendError(t *testing.T) {
	errIn := errors.New("in broke")
	path, _ := fakeVMM(t, func(c *net.UnixConn, line string) {
		_, _ = c.Write([]byte("OK 5\n"))
		// The half-close after the failed read; the guest's end then
		// finds in ended, and Pipe waits for the goroutine's report.
		_, _ = io.ReadAll(c)
	})
	err := pipeT(t, path, 5, io.MultiReader(strings.NewReader("x"), errReader{errIn}), io.Discard)
	if !errors.Is(err, errIn) || !strings.HasPrefix(err.Error(), "sending: ") {
		t.Errorf("Pipe: %v, want sending: ... %v", err, errIn)
	}
}

// errReader fails every read with err.
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }
