package vhufront

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeBackend answers vhost-user requests with a script: reply returns
// the reply's payload, or nil to send none.
func fakeBackend(t *testing.T, reply func(req uint32, flags uint32, p []byte) []byte) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "fake.sock")
	l, err := ListenUnix(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		c, err := l.AcceptUnix()
		if err != nil {
			return
		}
		defer c.Close()
		oob := make([]byte, 256)
		for {
			var h [msgHeader]byte
			if _, _, _, _, err := c.ReadMsgUnix(h[:], oob); err != nil {
				return
			}
			p := make([]byte, binary.LittleEndian.Uint32(h[8:]))
			if _, err := io.ReadFull(c, p); err != nil {
				return
			}
			req, flags := binary.LittleEndian.Uint32(h[0:]), binary.LittleEndian.Uint32(h[4:])
			r := reply(req, flags, p)
			if r == nil {
				continue
			}
			out := binary.LittleEndian.AppendUint32(nil, req)
			out = binary.LittleEndian.AppendUint32(out, msgVersion|msgReply)
			out = binary.LittleEndian.AppendUint32(out, uint32(len(r)))
			if _, err := c.Write(append(out, r...)); err != nil {
				return
			}
		}
	}()
	return sock
}

// TestClientErrors: a back-end that refuses a message, lacks VERSION_1 or
// never answers gives a clear error within the timeout.
func TestClientErrors(t *testing.T) {
	const features = FeatureVersion1 | FeatureEventIdx | FeatureProtocolFeatures
	tests := []struct {
		name  string
		reply func(req, flags uint32, p []byte) []byte
		want  string
	}{
		{"refused SET_FEATURES", func(req, flags uint32, p []byte) []byte {
			switch req {
			case reqGetFeatures:
				return le64(features)
			case reqGetProtocolFeatures:
				return le64(protoReplyAck)
			case reqSetFeatures:
				if flags&msgNeedReply == 0 {
					t.Error("SET_FEATURES without NEED_REPLY under REPLY_ACK")
				}
				return le64(1)
			}
			return nil
		}, "SET_FEATURES refused (status 1)"},
		{"no VERSION_1", func(req, _ uint32, _ []byte) []byte {
			if req == reqGetFeatures {
				return le64(FeatureEventIdx)
			}
			return nil
		}, "lack VIRTIO_F_VERSION_1"},
		{"silent", func(uint32, uint32, []byte) []byte { return nil }, "reply to GET_FEATURES"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sock := fakeBackend(t, tc.reply)
			c, err := Dial(sock, 200*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			start := time.Now()
			err = c.Negotiate(FeatureEventIdx)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Negotiate: %v, want %q", err, tc.want)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("took %v", d)
			}
		})
	}
	if _, err := Dial(filepath.Join(t.TempDir(), "none.sock"), time.Second); err == nil {
		t.Error("Dial to no socket succeeded")
	}
}

// TestReplyForAnotherRequest: a reply naming another request is a
// protocol error.
func TestReplyForAnotherRequest(t *testing.T) {
	sock := fakeBackend(t, func(req, _ uint32, _ []byte) []byte { return le64(FeatureVersion1) })
	c, err := Dial(sock, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.send(reqGetQueueNum, 0, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.reply(reqGetFeatures); !errors.Is(err, ErrBackend) || !strings.Contains(err.Error(), "is GET_QUEUE_NUM") {
		t.Errorf("reply: %v", err)
	}
}

// TestPeerProtocol: ServePeer over pipes runs a source against a sink on a
// plain Unix socket, answering ready then the result, and reports errors
// as results.
func TestPeerProtocol(t *testing.T) {
	path := filepath.Join(t.TempDir(), "af.sock")
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	served := make(chan error, 1)
	go func() { served <- ServePeer(inR, outW); outW.Close() }()
	p := &Peer{in: inW, lines: make(chan []byte, 4)}
	go func() {
		buf := make([]byte, 1<<20)
		var acc []byte
		for {
			n, err := outR.Read(buf)
			acc = append(acc, buf[:n]...)
			for {
				i := bytes.IndexByte(acc, '\n')
				if i < 0 {
					break
				}
				p.lines <- append([]byte(nil), acc[:i]...)
				acc = acc[i+1:]
			}
			if err != nil {
				p.exitErr = err
				close(p.lines)
				return
			}
		}
	}()
	if err := p.Begin(PeerCmd{Role: RoleSink, Listen: path, Timeout: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	c, err := DialUnix(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	sent, err := HostSource(c, 1000, 20*time.Millisecond, 5*time.Second)
	c.Close()
	if err != nil {
		t.Fatal(err)
	}
	r, err := p.End(5 * time.Second)
	if err != nil || r.Transfer == nil || r.Transfer.Bytes != sent.Bytes {
		t.Fatalf("sink result %+v, %v; sent %d", r, err, sent.Bytes)
	}
	// A command that cannot run is an error result, and the peer goes on.
	if err := p.Begin(PeerCmd{Role: RoleSource, Dial: filepath.Join(t.TempDir(), "none"), Timeout: time.Second}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.End(5 * time.Second); err == nil || !strings.Contains(err.Error(), "peer: dial") {
		t.Errorf("dial to nothing: %v", err)
	}
	inW.Close()
	if err := <-served; err != nil {
		t.Error(err)
	}
	if _, err := p.next(time.Second); err == nil {
		t.Error("a reply after the peer ended")
	}
}

// TestPeerProcessGone: a peer process that dies is an error, not a hang.
func TestPeerProcessGone(t *testing.T) {
	p, err := StartPeer(exec.Command("true"))
	if err != nil {
		t.Fatal(err)
	}
	err = p.Begin(PeerCmd{Role: RoleSink, Listen: filepath.Join(t.TempDir(), "x"), Timeout: time.Second})
	if err == nil || !strings.Contains(err.Error(), "peer") {
		t.Errorf("Begin on a dead peer: %v", err)
	}
	_ = p.Close(time.Second)
}
