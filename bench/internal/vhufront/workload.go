package vhufront

import (
	"errors"
	"fmt"
	"time"
)

// Transfer is what one side of a timed stream saw: bytes and messages (a
// message is one application write of the payload size), and the
// CLOCK_MONOTONIC times (Mono) of the first send and of the end: the last
// send for a sender, end of stream for a receiver.
type Transfer struct {
	Bytes int64 `json:"bytes"`
	Msgs  int64 `json:"msgs"`
	Start int64 `json:"start_ns"`
	End   int64 `json:"end_ns"`
}

// closeTimeout bounds waiting for the device's RST after our full
// SHUTDOWN: it comes once the host has every byte.
const closeTimeout = 5 * time.Second

// finish sends SHUTDOWN(both) and waits for the device's RST, the end of a
// connection as a Linux guest closes one.
func (g *Guest) finish(c *Conn, deadline time.Time) error {
	if c.Closed() {
		if c.WasReset {
			return nil
		}
		return errors.New("vhufront: connection already closed")
	}
	c.Shutdown(ShutBoth)
	deadline = minTime(deadline, time.Now().Add(closeTimeout))
	if err := g.Run(deadline, nil, c.Closed); err != nil {
		return fmt.Errorf("waiting for the device's RST after SHUTDOWN: %w", err)
	}
	return nil
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// accept listens on port until one connection arrives.
func (g *Guest) accept(port uint32, deadline time.Time) (*Conn, error) {
	var c *Conn
	g.Listen(port, func(n *Conn) { c = n })
	defer g.Unlisten(port)
	if err := g.Run(deadline, nil, func() bool { return c != nil }); err != nil {
		return nil, fmt.Errorf("waiting for a connection to guest port %d: %w", port, err)
	}
	return c, nil
}

// connect opens a connection to host port port.
func (g *Guest) connect(port uint32, deadline time.Time) (*Conn, error) {
	c := g.Connect(port)
	if err := g.Run(deadline, nil, func() bool { return c.state != connConnecting }); err != nil {
		return nil, fmt.Errorf("connecting to host port %d: %w", port, err)
	}
	if !c.Established() {
		return nil, fmt.Errorf("connecting to host port %d: reset by the device (nobody listens?)", port)
	}
	return c, nil
}

// Sink accepts one connection on guest port port and receives until the
// device's SHUTDOWN(SEND) (the host half-closed), checking every byte
// against the pattern; then it closes the connection.
func (g *Guest) Sink(port uint32, deadline time.Time) (Transfer, error) {
	var t Transfer
	c, err := g.accept(port, deadline)
	if err != nil {
		return t, err
	}
	var bad error
	c.OnData = func(p []byte) {
		if t.Bytes == 0 {
			t.Start = Mono()
		}
		if bad == nil {
			bad = CheckPattern(t.Bytes, p)
		}
		t.Bytes += int64(len(p))
		t.Msgs++
	}
	err = g.Run(deadline, nil, func() bool { return c.PeerShut&ShutSend != 0 || c.Closed() || bad != nil })
	t.End = Mono()
	if err != nil {
		return t, fmt.Errorf("receiving: %w", err)
	}
	if bad != nil {
		return t, bad
	}
	if c.Closed() {
		return t, errors.New("the device reset the connection before the end of the stream")
	}
	return t, g.finish(c, deadline)
}

// Source connects to host port port and sends messages of payload bytes of
// the pattern for dur (whole messages), then closes the connection.
func (g *Guest) Source(port uint32, payload int, dur time.Duration, deadline time.Time) (Transfer, error) {
	var t Transfer
	if payload < 1 || payload > MaxPayload {
		return t, fmt.Errorf("vhufront: payload of %d bytes", payload)
	}
	c, err := g.connect(port, deadline)
	if err != nil {
		return t, err
	}
	t.Start = Mono()
	stop := time.Now().Add(dur)
	inMsg := 0 // bytes of the current message sent
	stopping := false
	work := func() bool {
		progress := false
		for !c.Closed() {
			if inMsg == 0 && (stopping || time.Now().After(stop)) {
				stopping = true
				break
			}
			n := c.Send(PatternAt(t.Bytes, payload-inMsg))
			if n == 0 {
				break
			}
			progress = true
			t.Bytes += int64(n)
			inMsg += n
			if inMsg == payload {
				inMsg = 0
				t.Msgs++
			}
		}
		return progress
	}
	err = g.Run(deadline, work, func() bool { return stopping || c.Closed() })
	t.End = Mono()
	if err != nil {
		return t, fmt.Errorf("sending: %w", err)
	}
	if c.Closed() {
		return t, errors.New("the device reset the connection while the guest was sending")
	}
	return t, g.finish(c, deadline)
}

// Echo accepts one connection on guest port port and sends back every
// byte it receives until the device's SHUTDOWN(SEND).
func (g *Guest) Echo(port uint32, deadline time.Time) error {
	c, err := g.accept(port, deadline)
	if err != nil {
		return err
	}
	var out []byte
	c.OnData = func(p []byte) { out = append(out, p...) }
	work := func() bool {
		if len(out) == 0 {
			return false
		}
		n := c.Send(out)
		out = out[:copy(out, out[n:])]
		return n > 0
	}
	done := func() bool { return c.Closed() || (c.PeerShut&ShutSend != 0 && len(out) == 0) }
	if err := g.Run(deadline, work, done); err != nil {
		return fmt.Errorf("echoing: %w", err)
	}
	if c.Closed() {
		return errors.New("the device reset the connection during the echo")
	}
	return g.finish(c, deadline)
}

// Ping connects to host port port (where the host echoes) and sends
// messages of payload bytes one at a time, each after the previous one
// came back whole, for dur or max messages. It returns each round trip's
// time in nanoseconds.
func (g *Guest) Ping(port uint32, payload int, dur time.Duration, max int, deadline time.Time) ([]int64, error) {
	if payload < 1 || payload > MaxPayload {
		return nil, fmt.Errorf("vhufront: payload of %d bytes", payload)
	}
	c, err := g.connect(port, deadline)
	if err != nil {
		return nil, err
	}
	var (
		rtts          []int64
		sentOff, back int64 // stream bytes sent, and echoed back
		msgEnd        int64 // stream offset where the current message ends
		sentAt        time.Time
		bad           error
	)
	c.OnData = func(p []byte) {
		if bad == nil {
			bad = CheckPattern(back, p)
		}
		back += int64(len(p))
		if back > msgEnd && bad == nil {
			bad = fmt.Errorf("the echo returned %d bytes beyond the message", back-msgEnd)
		}
		if back == msgEnd {
			rtts = append(rtts, time.Since(sentAt).Nanoseconds())
		}
	}
	stop := time.Now().Add(dur)
	work := func() bool {
		if back == msgEnd && sentOff == msgEnd && len(rtts) < max && time.Now().Before(stop) {
			msgEnd += int64(payload)
			sentAt = time.Now()
		}
		if sentOff == msgEnd {
			return false
		}
		n := c.Send(PatternAt(sentOff, int(msgEnd-sentOff)))
		sentOff += int64(n)
		return n > 0
	}
	done := func() bool {
		return c.Closed() || bad != nil || (back == msgEnd && (len(rtts) >= max || !time.Now().Before(stop)))
	}
	if err := g.Run(deadline, work, done); err != nil {
		return rtts, fmt.Errorf("ping-pong: %w", err)
	}
	if bad != nil {
		return rtts, bad
	}
	if c.Closed() {
		return rtts, errors.New("the device reset the connection during the ping-pong")
	}
	return rtts, g.finish(c, deadline)
}
