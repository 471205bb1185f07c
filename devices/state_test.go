package devices

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// stateRig is one device behind a guest's (and the host's) view of it, for
// the save and restore tests: step performs one access chosen by op and
// describes what the guest or host saw, so that a saved device and its
// restored copy can be driven alike and compared step by step.
type stateRig[S any] interface {
	save() S
	restore(S) error
	// step performs one access chosen by op's bytes and returns what it
	// returned and what the device did through its callbacks.
	step(op stateOp) string
	// final returns what the device left for the host since it was saved
	// or restored (console output), compared once at the end.
	final() string
}

// stateOp picks one access; each rig reads its bytes its own way.
type stateOp [8]byte

func randomOps(r *rand.Rand, n int) []stateOp {
	ops := make([]stateOp, n)
	for i := range ops {
		for j := range ops[i] {
			ops[i][j] = byte(r.Uint32())
		}
	}
	return ops
}

// jsonRoundTrip encodes v and decodes it into a new S, as internal/snapshot
// saves and loads a state part, and checks nothing was lost on the way (a
// field that is unexported, or of a type JSON does not carry, would be).
func jsonRoundTrip[S any](t *testing.T, v S) S {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("encoding %T: %v", v, err)
	}
	var got S
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatalf("decoding %T from %s: %v", v, data, err)
	}
	if diff := cmp.Diff(v, got); diff != "" {
		t.Fatalf("%T changed through JSON %s (-saved +decoded):\n%s", v, data, diff)
	}
	return got
}

// checkRestore drives a fresh device with pre, saves it, passes the state
// through JSON, restores it into another fresh device, and then drives both
// with post: every step must see the same on both, and so must the host at
// the end. It returns the saved state.
func checkRestore[S any](t *testing.T, newRig func(testing.TB) stateRig[S], pre, post []stateOp) S {
	t.Helper()
	saved := newRig(t)
	for _, op := range pre {
		saved.step(op)
	}
	st := saved.save()
	restored := newRig(t)
	if err := restored.restore(jsonRoundTrip(t, st)); err != nil {
		t.Fatalf("RestoreState of a saved state: %v\nstate: %+v", err, st)
	}
	if diff := cmp.Diff(st, restored.save()); diff != "" {
		t.Fatalf("state saved again after the restore differs (-saved +restored):\n%s", diff)
	}
	for i, op := range post {
		if a, b := saved.step(op), restored.step(op); a != b {
			t.Fatalf("step %d (op %x) after restoring %+v:\nsaved device:    %s\nrestored device: %s", i, op, st, a, b)
		}
	}
	if a, b := saved.final(), restored.final(); a != b {
		t.Fatalf("host saw %q from the saved device, %q from the restored one", a, b)
	}
	return st
}

// checkRandomRestores runs checkRestore on random access sequences, so that
// saves happen in whatever states random guests reach.
func checkRandomRestores[S any](t *testing.T, newRig func(testing.TB) stateRig[S], seeds int) {
	t.Helper()
	if testing.Short() {
		seeds = max(seeds/10, 1)
	}
	for seed := range uint64(seeds) {
		r := rand.New(rand.NewPCG(seed, 22))
		pre := randomOps(r, r.IntN(200))
		post := randomOps(r, 200)
		checkRestore(t, newRig, pre, post)
	}
}

// checkRefused restores each state of bad (the good state with one field
// spoilt) into a device built by newRig after pre, and checks it is
// refused with ErrBadState and leaves the device's state as it was.
func checkRefused[S any](t *testing.T, newRig func(testing.TB) stateRig[S], pre []stateOp, good S, bad map[string]func(*S)) {
	t.Helper()
	for name, spoil := range bad {
		t.Run(name, func(t *testing.T) {
			r := newRig(t)
			for _, op := range pre {
				r.step(op)
			}
			before := r.save()
			st := jsonRoundTrip(t, good) // a deep copy
			spoil(&st)
			err := r.restore(st)
			if !errors.Is(err, ErrBadState) {
				t.Fatalf("RestoreState(%+v) = %v, want an error wrapping ErrBadState", st, err)
			}
			if diff := cmp.Diff(before, r.save()); diff != "" {
				t.Errorf("a refused restore (%v) changed the device (-before +after):\n%s", err, diff)
			}
		})
	}
}

// portBRig is a PortB read by the guest.
type portBRig struct{ p *PortB }

func (r *portBRig) save() PortBState            { return r.p.SaveState() }
func (r *portBRig) restore(st PortBState) error { return r.p.RestoreState(st) }
func (r *portBRig) final() string               { return "" }
func (r *portBRig) step(op stateOp) string {
	b := []byte{0xaa}
	if op[0]%4 == 0 {
		r.p.Write(0, []byte{op[1]})
	}
	r.p.Read(0, b)
	return fmt.Sprintf("in %#02x", b[0])
}

func newPortBRig(testing.TB) stateRig[PortBState] { return &portBRig{&PortB{}} }

func TestPortBRestore(t *testing.T) {
	read := stateOp{1}
	for _, pre := range [][]stateOp{nil, {read}, {read, read}, {read, read, read}} {
		st := checkRestore(t, newPortBRig, pre, []stateOp{read, read, read})
		if want := len(pre)%2 == 1; st.Refresh != want {
			t.Errorf("after %d reads: saved refresh %v, want %v", len(pre), st.Refresh, want)
		}
	}
	checkRandomRestores(t, newPortBRig, 50)
}

// pvWaitRig is a PVWait with devices notifying it and a guest waiting 1 us
// at a time: a step reports whether a wait was ended by a notification.
type pvWaitRig struct{ w *PVWait }

func (r *pvWaitRig) save() PVWaitState            { return r.w.SaveState() }
func (r *pvWaitRig) restore(st PVWaitState) error { return r.w.RestoreState(st) }
func (r *pvWaitRig) final() string                { return "" }
func (r *pvWaitRig) step(op stateOp) string {
	if op[0]%2 == 0 {
		r.w.Notify()
		return "notify"
	}
	_, before := r.w.Stats()
	wait32(r.w, 1)
	if _, after := r.w.Stats(); after != before {
		return "woken"
	}
	return "timed out"
}

func newPVWaitRig(testing.TB) stateRig[PVWaitState] { return &pvWaitRig{NewPVWait()} }

func TestPVWaitRestore(t *testing.T) {
	notify, wait := stateOp{0}, stateOp{1}
	if st := checkRestore(t, newPVWaitRig, []stateOp{notify}, []stateOp{wait, wait}); !st.Pending {
		t.Error("a notification before the save was not saved as pending")
	}
	if st := checkRestore(t, newPVWaitRig, []stateOp{notify, wait}, []stateOp{wait, notify, wait}); st.Pending {
		t.Error("a notification a wait consumed was saved as pending")
	}
	// A pending notification restored over a fresh one, and a clear one
	// over a pending one.
	w := NewPVWait()
	if err := w.RestoreState(PVWaitState{Pending: true}); err != nil {
		t.Fatal(err)
	}
	if !w.SaveState().Pending {
		t.Error("restored pending notification lost")
	}
	if err := w.RestoreState(PVWaitState{}); err != nil {
		t.Fatal(err)
	}
	if w.SaveState().Pending {
		t.Error("restoring no pending notification left one pending")
	}
	checkRandomRestores(t, newPVWaitRig, 20)
}
