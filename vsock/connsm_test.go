package vsock

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// The connection state machine alone: no session, socket, goroutine or
// timer. Each case starts from a state reached by real events, applies one
// more and checks the state, the actions and what the guest is owed.

// smEvent is one event of the state machine, by name, for tables and the
// random walks below.
type smEvent struct {
	name string
	do   func(m *connSM) act
}

func guestOp(op Op, flags uint32) smEvent {
	return smEvent{fmt.Sprintf("guest %v/%d", op, flags), func(m *connSM) act { return m.onGuestOp(op, flags) }}
}

var (
	evResponse     = guestOp(OpResponse, 0)
	evRst          = guestOp(OpRst, 0)
	evRW           = guestOp(OpRW, 0)
	evCreditUpdate = guestOp(OpCreditUpdate, 0)
	evCreditReq    = guestOp(OpCreditRequest, 0)
	evShutRcv      = guestOp(OpShutdown, ShutdownRcv)
	evShutSend     = guestOp(OpShutdown, ShutdownSend)
	evShutBoth     = guestOp(OpShutdown, ShutdownBoth)
	evBadOp        = guestOp(Op(99), 0)
	evDialOK       = smEvent{"dial ok", func(m *connSM) act { a, _ := m.onDialed(false); return a }}
	evDialFail     = smEvent{"dial failed", func(m *connSM) act { a, _ := m.onDialed(true); return a }}
	evHostFailed   = smEvent{"host failed", (*connSM).onHostFailed}
	evAccepted     = smEvent{"OK sent", func(m *connSM) act { return m.onAccepted(true) }}
	evAcceptFailed = smEvent{"OK failed", func(m *connSM) act { return m.onAccepted(false) }}
	evDrained      = smEvent{"host drained", (*connSM).onHostDrained}
	evHostEOF      = smEvent{"host EOF", func(m *connSM) act { m.onHostEOF(); return 0 }}
	evHangup       = smEvent{"host hang-up", func(m *connSM) act { m.onHostHangup(); return 0 }}
	evShutSent     = smEvent{"SHUTDOWN sent", (*connSM).onShutdownSent}
	evConnTimeout  = smEvent{"connect timeout", (*connSM).onConnectTimeout}
	evCloseTimeout = smEvent{"close timeout", (*connSM).onCloseTimeout}
	evWrongTypeRst = smEvent{"wrong-type RST", func(m *connSM) act { return m.onWrongType(OpRst) }}
	evWrongTypeRW  = smEvent{"wrong-type RW", func(m *connSM) act { return m.onWrongType(OpRW) }}
)

var allEvents = []smEvent{
	evResponse, evRst, evRW, evCreditUpdate, evCreditReq, evShutRcv, evShutSend, evShutBoth, evBadOp,
	evDialOK, evDialFail, evHostFailed, evAccepted, evAcceptFailed, evDrained, evHostEOF, evHangup, evShutSent,
	evConnTimeout, evCloseTimeout, evWrongTypeRst, evWrongTypeRW,
}

// Starting points, each reached through the state machine's own events.
func smGuestConnecting() connSM { return newGuestSM() }
func smHostConnecting() connSM  { return newHostSM() }
func smEstablished() connSM {
	m := newGuestSM()
	m.onDialed(false)
	m.pend = 0 // RESPONSE sent
	return m
}
func smClosing() connSM {
	m := smEstablished()
	m.onHostEOF()
	m.onHostHangup()
	m.onShutdownSent()
	return m
}
func smClosed() connSM {
	m := smEstablished()
	m.onGuestOp(OpRst, 0)
	return m
}

var smStarts = []struct {
	name  string
	start func() connSM
}{
	{"guest-connecting", smGuestConnecting},
	{"host-connecting", smHostConnecting},
	{"established", smEstablished},
	{"closing", smClosing},
	{"closed", smClosed},
}

func TestConnSMStarts(t *testing.T) {
	for _, s := range smStarts {
		if m := s.start(); m.state.String() != s.name {
			t.Errorf("start %s is in state %s", s.name, m.state)
		}
	}
	if m := smHostConnecting(); m.pend != pendRequest {
		t.Errorf("host-connecting owes %#x; want REQUEST", m.pend)
	}
}

const (
	abortRefused = actCountRefused | actClose | actRst
	abortReset   = actCountReset | actClose | actRst
)

func TestConnSMTransitions(t *testing.T) {
	cases := []struct {
		start    func() connSM
		events   []smEvent // the last one is checked
		state    connState
		act      act
		pend     uint32
		shutFlag uint32 // connSM.shutFlags after, when pend has pendShutdown
	}{
		// Setting up.
		{smGuestConnecting, []smEvent{evDialOK}, stateEstablished, actCountEstablished, pendResponse, 0},
		{smGuestConnecting, []smEvent{evDialFail}, stateClosed, abortRefused, 0, 0},
		{smGuestConnecting, []smEvent{evRst}, stateClosed, actCountRefused | actClose, 0, 0},
		{smGuestConnecting, []smEvent{evRst, evDialOK}, stateClosed, 0, 0, 0},
		{smGuestConnecting, []smEvent{evConnTimeout}, stateClosed, abortRefused, 0, 0},
		{smGuestConnecting, []smEvent{evResponse}, stateClosed, actProtoErr | abortRefused, 0, 0},
		{smGuestConnecting, []smEvent{evRW}, stateClosed, actProtoErr | abortRefused, 0, 0},
		{smGuestConnecting, []smEvent{evShutBoth}, stateClosed, abortRefused, 0, 0},
		{smGuestConnecting, []smEvent{evCreditReq}, stateGuestConnecting, 0, 0, 0},
		{smHostConnecting, []smEvent{evResponse}, stateHostConnecting, actStopTimer | actWriteOK, pendRequest, 0},
		{smHostConnecting, []smEvent{evResponse, evAccepted}, stateEstablished, actCountEstablished, pendRequest, 0},
		{smHostConnecting, []smEvent{evResponse, evAcceptFailed}, stateClosed, abortRefused, 0, 0},
		{smEstablished, []smEvent{evAccepted}, stateEstablished, 0, 0, 0},
		{smHostConnecting, []smEvent{evRst}, stateClosed, actCountRefused | actClose, 0, 0},
		{smHostConnecting, []smEvent{evConnTimeout}, stateClosed, abortRefused, 0, 0},
		{smHostConnecting, []smEvent{evDialOK}, stateHostConnecting, 0, pendRequest, 0},
		{smHostConnecting, []smEvent{evResponse, evAccepted, evHostFailed}, stateClosed, abortReset, 0, 0},

		// Established.
		{smEstablished, []smEvent{evRW}, stateEstablished, 0, 0, 0},
		{smEstablished, []smEvent{evCreditUpdate}, stateEstablished, 0, 0, 0},
		{smEstablished, []smEvent{evCreditReq}, stateEstablished, 0, pendCredit | pendCreditForced, 0},
		{smEstablished, []smEvent{evResponse}, stateClosed, actProtoErr | abortReset, 0, 0},
		{smEstablished, []smEvent{evBadOp}, stateClosed, actProtoErr | abortReset, 0, 0},
		{smEstablished, []smEvent{evRst}, stateClosed, actCountReset | actClose, 0, 0},
		{smEstablished, []smEvent{evHostFailed}, stateClosed, abortReset, 0, 0},
		{smEstablished, []smEvent{evConnTimeout}, stateEstablished, 0, 0, 0},
		{smEstablished, []smEvent{evCloseTimeout}, stateEstablished, 0, 0, 0},
		{smEstablished, []smEvent{evWrongTypeRst}, stateClosed, actCountReset | actClose, 0, 0},
		{smEstablished, []smEvent{evWrongTypeRW}, stateClosed, abortReset, 0, 0},

		// The guest's half-closes.
		{smEstablished, []smEvent{evShutRcv}, stateEstablished, actShutHostRead | actFlush, 0, 0},
		{smEstablished, []smEvent{evShutRcv, evShutRcv}, stateEstablished, actFlush, 0, 0},
		{smEstablished, []smEvent{evShutRcv, evDrained}, stateEstablished, 0, 0, 0},
		{smEstablished, []smEvent{evShutSend}, stateEstablished, actDropMsg | actFlush, 0, 0},
		{smEstablished, []smEvent{evShutSend, evDrained}, stateEstablished, actShutHostWrite, 0, 0},
		{smEstablished, []smEvent{evShutSend, evDrained, evDrained}, stateEstablished, 0, 0, 0},
		{smEstablished, []smEvent{evShutSend, evRW}, stateClosed, actProtoErr | abortReset, 0, 0},
		{smEstablished, []smEvent{evShutBoth}, stateEstablished, actShutHostRead | actDropMsg | actFlush, 0, 0},
		// Both flags: the orderly end once the host has everything, no
		// counter.
		{smEstablished, []smEvent{evShutBoth, evDrained}, stateClosed, actShutHostWrite | actClose | actRst, 0, 0},
		{smEstablished, []smEvent{evShutRcv, evShutSend, evDrained}, stateClosed, actShutHostWrite | actClose | actRst, 0, 0},

		// The host's half-closes.
		{smEstablished, []smEvent{evHostEOF}, stateEstablished, 0, pendShutdown, ShutdownSend},
		{smEstablished, []smEvent{evHostEOF, evShutSent}, stateEstablished, 0, 0, ShutdownSend},
		{smEstablished, []smEvent{evHostEOF, evShutSent, evHangup}, stateEstablished, 0, pendShutdown, ShutdownBoth},
		{smEstablished, []smEvent{evHostEOF, evHangup}, stateEstablished, 0, pendShutdown, ShutdownBoth},
		{smEstablished, []smEvent{evHangup, evHostEOF}, stateEstablished, 0, pendShutdown, ShutdownBoth},
		// A hang-up alone says nothing while the device still reads:
		// the read that follows sees the EOF.
		{smEstablished, []smEvent{evHangup}, stateEstablished, 0, 0, 0},
		// Once the guest shut down receiving, nothing reads the socket:
		// the hang-up is the end both ways.
		{smEstablished, []smEvent{evShutRcv, evHangup}, stateEstablished, 0, pendShutdown, ShutdownBoth},
		{smEstablished, []smEvent{evHostEOF, evHangup, evShutSent}, stateClosing, actStartCloseTimer, 0, ShutdownBoth},

		// Closing: waiting for the guest's RST.
		{smClosing, []smEvent{evRst}, stateClosed, actClose, 0, 0},
		{smClosing, []smEvent{evRW}, stateClosing, actDropLate, 0, 0},
		{smClosing, []smEvent{evShutSend, evRW}, stateClosed, actProtoErr | abortReset, 0, 0},
		{smClosing, []smEvent{evCreditReq}, stateClosing, 0, 0, 0},
		{smClosing, []smEvent{evCloseTimeout}, stateClosed, abortReset, 0, 0},
		{smClosing, []smEvent{evConnTimeout}, stateClosing, 0, 0, 0},
		{smClosing, []smEvent{evShutBoth, evDrained}, stateClosed, actShutHostWrite | actClose | actRst, 0, 0},
		{smClosing, []smEvent{evResponse}, stateClosed, actProtoErr | abortReset, 0, 0},
	}
	for _, c := range cases {
		m := c.start()
		from := m.state
		var names []string
		var a act
		for _, e := range c.events {
			names = append(names, e.name)
			a = e.do(&m)
		}
		what := fmt.Sprintf("%s, %s", from, strings.Join(names, ", "))
		if m.state != c.state {
			t.Errorf("%s: state %s; want %s", what, m.state, c.state)
		}
		if a != c.act {
			t.Errorf("%s: actions %v; want %v", what, a, c.act)
		}
		if m.pend != c.pend {
			t.Errorf("%s: owes %#x; want %#x", what, m.pend, c.pend)
		}
		if c.pend&pendShutdown != 0 || c.shutFlag != 0 {
			if m.shutFlags != c.shutFlag {
				t.Errorf("%s: SHUTDOWN flags %d; want %d", what, m.shutFlags, c.shutFlag)
			}
		}
	}
}

// A closed connection ignores every event.
func TestConnSMClosedIsFinal(t *testing.T) {
	for _, e := range allEvents {
		m := smClosed()
		before := m
		if a := e.do(&m); a != 0 || m != before {
			t.Errorf("closed, %s: actions %v, state %+v; want none, unchanged", e.name, a, m)
		}
	}
}

// What the data path reads from the state machine.
func TestConnSMDataGates(t *testing.T) {
	m := smEstablished()
	if !m.guestReceives() || !m.canForward() {
		t.Fatalf("established: guestReceives %v, canForward %v; want both", m.guestReceives(), m.canForward())
	}
	m.onGuestOp(OpShutdown, ShutdownRcv)
	if m.guestReceives() || !m.canForward() {
		t.Errorf("after guest SHUTDOWN(RCV): guestReceives %v, canForward %v", m.guestReceives(), m.canForward())
	}
	m = smEstablished()
	m.onHostHangup()
	if m.canForward() {
		t.Error("after the host hung up: canForward")
	}
	m = smEstablished()
	m.onGuestOp(OpShutdown, ShutdownSend)
	m.onHostDrained()
	m.onHostEOF()
	if m.canForward() || !m.guestReceives() {
		t.Errorf("after both sides stopped sending: canForward %v, guestReceives %v", m.canForward(), m.guestReceives())
	}
	for _, s := range []func() connSM{smGuestConnecting, smHostConnecting, smClosing, smClosed} {
		if m := s(); m.guestReceives() {
			t.Errorf("%s: guestReceives", m.state)
		}
	}
	if rwAdmitted(actDropLate) || rwAdmitted(actProtoErr|abortReset) || !rwAdmitted(0) {
		t.Error("rwAdmitted")
	}
}

// checkWalk applies events to a connection from start and checks what must
// hold whatever the order: a closed connection stays closed and owes
// nothing; it is closed (actClose) exactly when it becomes closed, once;
// an RST goes only with the close; it is counted established at most once
// and as refused or reset at most once, refused only if it never was
// established; the close timer starts only on entering closing.
func checkWalk(t *testing.T, start connSM, events []smEvent) {
	t.Helper()
	m := start
	var closes, established, aborts int
	trace := []string{start.state.String()}
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("%s: "+format, append([]any{strings.Join(trace, " -> ")}, args...)...)
	}
	if start.state == stateEstablished || start.state == stateClosing {
		established = 1
	}
	for _, e := range events {
		before := m.state
		a := e.do(&m)
		trace = append(trace, e.name)
		if before == stateClosed && (a != 0 || m.state != stateClosed) {
			fail("a closed connection acted (%v) or reopened (%s)", a, m.state)
		}
		if (a&actClose != 0) != (before != stateClosed && m.state == stateClosed) {
			fail("actClose %v but %s -> %s", a&actClose != 0, before, m.state)
		}
		if a&actRst != 0 && a&actClose == 0 {
			fail("RST without closing")
		}
		if m.state == stateClosed && m.pend != 0 {
			fail("closed but owes %#x", m.pend)
		}
		if a&actCountEstablished != 0 {
			if m.state != stateEstablished || before == stateEstablished {
				fail("counted established going %s -> %s", before, m.state)
			}
			established++
		}
		if a&(actCountRefused|actCountReset) != 0 {
			aborts++
			if a&actCountRefused != 0 && established > 0 {
				fail("an established connection counted as refused")
			}
			if a&actCountReset != 0 && established == 0 {
				fail("a connection never established counted as reset")
			}
		}
		if a&actStartCloseTimer != 0 && (m.state != stateClosing || before == stateClosing) {
			fail("close timer started going %s -> %s", before, m.state)
		}
		if a&actClose != 0 {
			closes++
		}
		if closes > 1 || established > 1 || aborts > 1 {
			fail("closed %d times, established %d, aborted %d", closes, established, aborts)
		}
	}
}

func TestConnSMRandomWalks(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		s := smStarts[i%len(smStarts)]
		events := make([]smEvent, 1+r.IntN(12))
		for j := range events {
			events[j] = allEvents[r.IntN(len(allEvents))]
		}
		checkWalk(t, s.start(), events)
	}
}

// FuzzConnSM is TestConnSMRandomWalks with the fuzzer choosing the start
// and the events.
func FuzzConnSM(f *testing.F) {
	f.Add([]byte{0, 9, 10, 4, 13, 14, 15, 1})
	f.Add([]byte{1, 0, 7, 12, 12, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) == 0 {
			return
		}
		events := make([]smEvent, 0, len(b)-1)
		for _, x := range b[1:] {
			events = append(events, allEvents[int(x)%len(allEvents)])
		}
		checkWalk(t, smStarts[int(b[0])%len(smStarts)].start(), events)
	})
}

// act prints as the names of its bits, for failure messages.
func (a act) String() string {
	names := []string{"proto-err", "count-refused", "count-reset", "count-established", "stop-timer",
		"write-ok", "shut-host-read", "flush", "shut-host-write", "drop-msg", "drop-late",
		"start-close-timer", "close", "rst"}
	var out []string
	for i, n := range names {
		if a&(1<<i) != 0 {
			out = append(out, n)
		}
	}
	if rest := a &^ (1<<len(names) - 1); rest != 0 {
		out = append(out, fmt.Sprintf("%#x", uint32(rest)))
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, "|")
}
